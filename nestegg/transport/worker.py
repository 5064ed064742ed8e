"""A worker: consumes step messages of a pipeline's agents and runs the steps they point
at (the step of the message, and the run's next ones while this worker hosts their agents;
see :mod:`nestegg.transport.steps`).

Every worker also sweeps: it points the pipeline's channel again at runs that are
running, held by nobody and untouched for a while (their message was lost: a broker
restarted without persistence, a crash between a commit and the publish that follows,
a worker killed during a step: the worker that claims such a run then takes it over).
A stop (SIGTERM) drains: no new messages, the steps under way get ``grace`` seconds, and
the runs of those still running then are released at once and pointed at again.

A worker sets its store and then its channels up before it consumes them: a store or a
broker that refuses its settings (StoreRefusedError, BrokerRefusedError: a login, vhost or
database refused) ends it there, since retrying cannot mend that; a store that is
unavailable, or a broker that cannot be reached, is retried every BROKER_RETRY_DELAY
seconds, at start as later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from nestegg.cancellation import cancel, cancel_requested
from nestegg.checkpoint.waiting import resumable_now
from nestegg.constants import RUNNING, WAITING
from nestegg.errors import (
    BrokerRefusedError,
    ConfigurationError,
    EventLogDamagedError,
    NestEggError,
    StorageUnavailableError,
    TransportError,
)
from nestegg.options import is_count, shown
from nestegg.transport import tracing
from nestegg.transport.base import (
    ConsumerSetup,
    Delivery,
    StepMessage,
    Transport,
    WaitingProbe,
    channel_name,
    give_back,
    using,
)
from nestegg.transport.steps import StepRunner
from nestegg.transport.verdicts import repoint_fence
from nestegg.wording import STEPS, counted

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.clutch import Clutch

log = logging.getLogger("nestegg")

BROKER_RETRY_DELAY = 1.0
"""Seconds before consuming again after the broker failed (and before setting the store up
again after it was unavailable at start)."""
REFUSED_FOR = 5.0
"""Seconds a worker starting tries again while the broker refuses its settings before it
gives up: a refusal that passes (a connection limit reached, an authentication backend
briefly away) does not stop it."""
PROBE_EVERY = 0.1
"""Seconds a worker whose slots are all taken reuses the broker's answer to whether a
message waits for a slot (runs it went on with for CONTINUE_FOR go back to the broker
only then)."""
STOP_TIMEOUT = 10.0
"""Seconds a stopping worker waits for its consumer and sweeper to end before draining."""


def hosted_agents(clutch: Clutch, agents: Sequence[str] | None) -> frozenset[str]:
    """The agents a worker runs: ``agents`` (checked against the Clutch) or all of them.

    Raises:
        ConfigurationError: an agent the Clutch does not have, none at all, or a str
            in place of a list.
    """
    if agents is None:
        chosen = frozenset(clutch.agent_names)
    elif isinstance(agents, str):  # its letters would be taken for agent names
        raise ConfigurationError(
            f"agents is a list of agent names, got the str {agents!r} (agents=[{agents!r}])"
        )
    else:
        unknown = sorted(set(agents) - set(clutch.agent_names))
        if unknown:
            raise ConfigurationError(
                f"agents {unknown} are not agents of Clutch {clutch.name!r} "
                f"(known: {sorted(clutch.agent_names)})"
            )
        chosen = frozenset(agents)
    if not chosen:
        raise ConfigurationError(f"a worker of Clutch {clutch.name!r} needs at least one agent")
    return chosen


class Worker:
    """Runs the steps of one Clutch's runs from a transport until stopped.

    Args:
        clutch: the pipeline (with checkpointing and a transport).
        transport: where the step messages come from.
        concurrency: steps run at the same time.
        agents: the agents whose steps this worker runs (None: all).
        grace: seconds the steps under way get to finish once stopped.
        sweep_interval: seconds between sweeps (None: the lease).
        sweep_after: seconds a run must be untouched before a sweep points at it again
            (None: five leases).
        misfit_grace: seconds a step whose data does not fit its agent's model stays set
            aside for a worker whose model fits before its run is failed
            (IncompatibleDataError; None: MISFIT_GRACE_LEASES leases).
        on_ready: called once, when the channels are set up and the worker consumes.
    """

    def __init__(
        self,
        clutch: Clutch,
        transport: Transport,
        *,
        concurrency: int = 1,
        agents: Sequence[str] | None = None,
        grace: float = 30.0,
        sweep_interval: float | None = None,
        sweep_after: float | None = None,
        misfit_grace: float | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        if not is_count(concurrency):
            raise ConfigurationError(f"concurrency must be an int >= 1, got {shown(concurrency)}")
        if not grace >= 0:  # NaN too, as the command's --grace refuses it
            raise ConfigurationError(f"grace must be >= 0 seconds, got {grace!r}")
        if misfit_grace is not None and not misfit_grace >= 0:
            raise ConfigurationError(f"misfit_grace must be >= 0 seconds, got {misfit_grace!r}")
        if sweep_interval is not None and not sweep_interval > 0:  # 0: a sweep loop that spins
            raise ConfigurationError(f"sweep_interval must be > 0 seconds, got {sweep_interval!r}")
        if sweep_after is not None and not sweep_after >= 0:  # NaN: no run is ever swept
            raise ConfigurationError(f"sweep_after must be >= 0 seconds, got {sweep_after!r}")
        self.clutch = clutch
        self.transport = transport
        self.concurrency = concurrency
        self.hosts = hosted_agents(clutch, agents)
        self.grace = grace
        self.on_ready = on_ready
        self.stopping = asyncio.Event()
        self.store_ready = asyncio.Event()
        """Set once the store is set up (the sweeps wait for it)."""
        self.in_flight: dict[asyncio.Task[None], StepMessage] = {}
        """The handling tasks and the message each took."""
        self.probed_at = -PROBE_EVERY
        self.probed = True
        self.runner = StepRunner(
            clutch,
            transport,
            self.hosts,
            self.stopping,
            crowded=self._crowded,
            misfit_grace=misfit_grace,
        )
        lease = self.runner.lease
        self.sweep_interval = sweep_interval if sweep_interval is not None else lease
        self.sweep_after = sweep_after if sweep_after is not None else 5 * lease
        self.channels = [channel_name(clutch.name, a) for a in sorted(self.hosts)]
        self.channels.append(channel_name(clutch.name))
        self.named = ", ".join(self.channels)
        """The channels as the worker's lines name them."""
        self.refused: set[tuple[str, int]] = set()
        """The waiting runs (id, event seq) the sweep refused as their event log is torn:
        told once each."""

    async def _crowded(self) -> bool:
        """Whether every slot runs a step while a message waits for one on the broker
        (asked at most every PROBE_EVERY seconds; a transport that cannot tell, or a
        failed probe, counts as one that has a message waiting)."""
        if len(self.in_flight) < self.concurrency:
            return False
        if not isinstance(self.transport, WaitingProbe):
            return True
        now = time.monotonic()
        if now - self.probed_at >= PROBE_EVERY:
            self.probed_at = now
            try:
                self.probed = await self.transport.waiting(self.channels, hold=self.runner.lease)
            except TransportError:
                self.probed = True
        return self.probed

    def stop(self) -> None:
        """Begin draining (what SIGTERM does)."""
        self.stopping.set()

    async def run(self) -> None:
        """Consume and sweep until :meth:`stop`, then drain (the transport's connection is
        in use until the drain ends).

        Raises:
            BrokerRefusedError: the broker refused the worker's settings at start.
            StoreRefusedError: the store refused them (ConfigurationError: a store that
                cannot be used so).
        """
        async with using(self.transport):
            sweeper = asyncio.ensure_future(self._sweep_forever())
            consumer = asyncio.ensure_future(self._consume_forever())
            stopped = asyncio.ensure_future(self.stopping.wait())
            try:
                await asyncio.wait({consumer, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (consumer, sweeper, stopped):
                    cancel(task)
                await asyncio.wait({consumer, sweeper, stopped}, timeout=STOP_TIMEOUT)
                await self._drain()
            failure = consumer.exception() if consumer.done() and not consumer.cancelled() else None
            if failure is not None:
                raise failure

    async def _drain(self) -> None:
        """Give the steps under way ``grace`` seconds, then release the runs of those still
        running; a warning line for each step (its run and step) and one at the end."""
        if not self.in_flight:
            return
        log.warning("draining %s (grace %g s)", counted(len(self.in_flight), STEPS), self.grace)
        steps = {task: self._step_of(task) for task in self.in_flight}
        done, late = await asyncio.wait(set(self.in_flight), timeout=self.grace)
        for task in late:
            steps[task] = self._step_of(task)  # the step it is in now
            cancel(task)
        for task in late:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for task in done:
            run_id, step = steps[task]
            log.warning(
                "step %d of run %r ended during the drain",
                step,
                run_id,
                extra={"run_id": run_id, "step": step},
            )
        for task in late:
            run_id, step = steps[task]
            log.warning(
                "step %d of run %r did not end within the grace period: released for "
                "another worker",
                step,
                run_id,
                extra={"run_id": run_id, "step": step},
            )
        log.warning("drain over: %s ended, %d released", counted(len(done), STEPS), len(late))

    def _step_of(self, task: asyncio.Task[None]) -> tuple[str, int]:
        """The run and step ``task`` runs (its message's until it claimed the run)."""
        message = self.in_flight.get(task)
        taken = (message.run_id, message.seq) if message is not None else ("?", 0)
        return self.runner.under_way.get(task, taken)

    async def _set_up_channels(self) -> None:
        """Set the channels up before consuming them (with a transport that can), retrying
        while the broker cannot be reached.

        Raises:
            BrokerRefusedError: the broker still refused the settings after REFUSED_FOR
                seconds of trying again.
        """
        if not isinstance(self.transport, ConsumerSetup):
            return
        refused_since: float | None = None
        while True:
            try:
                await self.transport.set_up(self.channels)
                return
            except BrokerRefusedError as error:
                refused_since = refused_since or time.monotonic()
                if time.monotonic() - refused_since >= REFUSED_FOR:
                    raise
                log.warning("setting up %s was refused, trying again: %s", self.named, error)
                await asyncio.sleep(BROKER_RETRY_DELAY)
            except TransportError as error:
                log.warning("setting up %s failed: %s", self.named, error)
                await asyncio.sleep(BROKER_RETRY_DELAY)

    async def _set_up_store(self) -> None:
        """Set the store up, retrying while it is unavailable (a refusal or a store that
        cannot be used so raises)."""
        while True:
            try:
                await self.runner.book.ready()
                self.store_ready.set()
                return
            except StorageUnavailableError as error:
                log.warning(
                    "setting up the store of pipeline %r failed: %s", self.clutch.name, error
                )
                await asyncio.sleep(BROKER_RETRY_DELAY)

    async def _consume_forever(self) -> None:
        await self._set_up_store()
        await self._set_up_channels()
        if self.on_ready is not None:
            self.on_ready()
        slots = asyncio.Semaphore(self.concurrency)
        while True:
            try:
                await self._consume(slots)
            except TransportError as error:
                log.warning("consuming %s failed: %s", self.named, error)
                await asyncio.sleep(BROKER_RETRY_DELAY)

    async def _consume(self, slots: asyncio.Semaphore) -> None:
        deliveries: AsyncIterator[Delivery] = self.transport.consume(
            self.channels, hold=self.runner.lease, prefetch=self.concurrency
        )
        try:
            while True:
                await slots.acquire()
                try:
                    delivery = await anext(deliveries)
                except BaseException:
                    slots.release()
                    raise
                if cancel_requested():  # the read went on though the worker stops
                    slots.release()
                    await give_back(delivery)
                    raise asyncio.CancelledError
                task = asyncio.ensure_future(self._handle(delivery, slots))
                self.in_flight[task] = delivery.message
        finally:
            closing = getattr(deliveries, "aclose", None)
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing()

    async def _handle(self, delivery: Delivery, slots: asyncio.Semaphore) -> None:
        try:
            await self.runner.handle(delivery)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "step %d of run %r failed in the worker",
                delivery.message.seq,
                delivery.message.run_id,
                extra={"run_id": delivery.message.run_id, "step": delivery.message.seq},
            )
        finally:
            slots.release()
            task = asyncio.current_task()
            if task is not None:
                self.in_flight.pop(task, None)
                self.runner.under_way.pop(task, None)

    async def _sweep_forever(self) -> None:
        """Sweep every ``sweep_interval`` seconds once the store is set up; an outage of
        the store is told once, and its end, not at every sweep it fails."""
        await self.store_ready.wait()
        outage = False
        while not cancel_requested():  # stopped, also if a library lost the cancellation
            await asyncio.sleep(self.sweep_interval)
            try:
                await self.sweep()
            except StorageUnavailableError as error:
                level = logging.DEBUG if outage else logging.WARNING
                log.log(level, "sweeps of pipeline %r fail: %s", self.clutch.name, error)
                outage = True
                continue
            except (NestEggError, OSError) as error:
                log.warning("sweep of pipeline %r failed: %s", self.clutch.name, error)
                continue
            if outage:
                log.warning("sweeps of pipeline %r work again", self.clutch.name)
                outage = False

    async def sweep(self) -> list[str]:
        """Point the pipeline's channel again at every run that is running, held by no
        one and untouched for ``sweep_after`` seconds, and at every waiting run whose
        deadline or timer has passed or whose signal is stored; their ids."""
        store = await self.runner.book.ready()
        now = self.runner.book.config.clock()
        runs = await store.list_runs(pipeline=self.clutch.name, statuses=[RUNNING, WAITING])
        swept = []
        for run in runs:
            if run.status == WAITING:
                due = await self._wait_over(store, run)
            else:
                held = run.lease_until is not None and run.lease_until > now
                due = not held and run.updated_at <= now - self.sweep_after
            if not due:
                continue
            trace = await tracing.trace_of(store, run.run_id)
            # the step of an owner that died or gave it back is sent as that owner took it
            fence = await repoint_fence(store, run)
            await self.runner.publish(run.run_id, run.step_seq + 1, fence, None, trace)
            swept.append(run.run_id)
        if swept:
            log.info("swept %d runs of pipeline %r: %s", len(swept), self.clutch.name, swept)
        return swept

    async def _wait_over(self, store: CheckpointStorage, run: RunRecord) -> bool:
        """Whether the sweep resumes a waiting run now; a run whose event log is torn (what
        it waits for unknown) is refused, with a warning (once), and left as it is."""
        try:
            return await resumable_now(store, run, self.runner.book.config.clock())
        except EventLogDamagedError as refused:
            key = (run.run_id, run.event_seq)
            level = logging.DEBUG if key in self.refused else logging.WARNING
            self.refused.add(key)
            log.log(level, "sweep of pipeline %r: %s", self.clutch.name, refused,
                    extra={"run_id": run.run_id})  # fmt: skip
            return False


async def serve(worker: Worker) -> None:
    """Run ``worker`` until SIGTERM or SIGINT (when this is the main thread) or cancelled."""
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, worker.stop)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    try:
        await worker.run()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
