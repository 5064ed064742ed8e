"""What a worker does with one step message: judge it, claim the run, run its steps.

The store decides everything; the message only says which run and step to look at.
A message for a step already committed, for a finished run, or for a run a live worker
holds (a duplicate, or a stale fence) is acked and dropped. Otherwise the worker claims
the run (fence + 1), loads its newest checkpoint, runs one step and commits it fenced.
When this worker hosts the agent of the run's next step, it goes on with the run itself:
each step is still committed on its own, fenced, and the commit renews the lease instead
of releasing it, so no claim and no message go between the steps; the message it took
stays unacked meanwhile. Once the next agent lives elsewhere, the worker stops, or the
run had ``CONTINUE_FOR`` seconds here while every slot of the worker is taken and a
message waits for one on the broker, the step's commit releases the lease, the next
step's message is published and only then is the message acked. While the worker holds
the run, the run's lease and the message are kept fresh together; if the worker dies, the
message comes back to another worker, which waits for the lease to run out and points the
pipeline at the run's next step again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING

from nestegg.cancellation import cancel_requested, raise_if_cancel_requested
from nestegg.checkpoint.cancels import ownership_lost
from nestegg.checkpoint.formats import (
    Snapshot,
    failure_body,
    failure_commit,
    failure_detail,
    opening_payload,
)
from nestegg.checkpoint.ownership import current_owner, interruption
from nestegg.checkpoint.records import RunRecord
from nestegg.constants import (
    RUN_STARTED,
    RUNNING,
)
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointError,
    IncompatibleCheckpointError,
    IncompatibleDataError,
    NestEggError,
    RunLockedError,
    RunNotFoundError,
    RunWaiting,
    StaleOwnerError,
    StorageError,
    TransportError,
)
from nestegg.execution import RUN_DONE, STEP_DONE, RunExecution
from nestegg.strategies import Strategy
from nestegg.task import StepListeners
from nestegg.telemetry import store_shown
from nestegg.transport import tracing
from nestegg.transport.base import Delivery, StepMessage, Transport, channel_name, give_back
from nestegg.transport.lacking import MISFIT_GRACE_LEASES, LackingAgents, set_aside_since
from nestegg.transport.routes import next_route
from nestegg.transport.step_recorder import StepRecorder
from nestegg.transport.verdicts import (
    Claim,
    Resumes,
    Verdict,
    failed_step,
    judge,
    not_here,
    repoint_fence,
    resumed_by,
    resumes,
)
from nestegg.transport.warm import Warm

if TYPE_CHECKING:
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.clutch import Clutch

log = logging.getLogger("nestegg")

CLOCK_MARGIN = 0.05
"""Seconds added when waiting for a lease to expire (clocks of hosts differ a little)."""
STORE_RETRY_DELAY = 1.0
"""Seconds before a message is given back after the store failed."""
WARM_RUNS = 256
"""Runs whose state a worker keeps after their step, for their next step."""
CONTINUE_FOR = 2.0
"""Seconds a worker goes on with a run it took (step after step, each committed) before,
when every one of its slots is taken, it hands the run's next step to the broker, so that
messages waiting for a slot get one in turn."""
CONTINUE_AT_MOST = 600.0
"""Seconds after which a worker hands a run it went on with to the broker even with slots
free: a broker may bound how long a message stays unacked (RabbitMQ's consumer_timeout,
30 minutes by default)."""


async def _always() -> bool:
    return True


class Next(enum.Enum):
    """What follows a step a worker ran: this worker runs the run's next step itself."""

    CONTINUE = "continue"


class StepRunner:
    """Handles step messages for a worker: one delivery, then the run's next steps while
    this worker goes on with it."""

    def __init__(
        self,
        clutch: Clutch,
        transport: Transport,
        hosts: frozenset[str],
        stopping: asyncio.Event | None = None,
        crowded: Callable[[], Awaitable[bool]] | None = None,
        misfit_grace: float | None = None,
    ) -> None:
        self.clutch = clutch
        self.transport = transport
        self.hosts = hosts
        self.stopping = stopping or asyncio.Event()
        self.crowded = crowded or _always
        """Whether every slot of the worker is taken while a message waits for one."""
        self.book: CheckpointedRuns = clutch.checkpointed_runs()
        self.owner = current_owner()  # read once: it reads /proc, a claim per step needs it
        self.telemetry = tracing.WorkerTelemetry(clutch.name)
        self.warm: dict[str, Warm] = {}
        self.under_way: dict[object, tuple[str, int]] = {}
        """The run and step each handling task runs now (a worker's drain names them)."""
        self.lease = self.book.lease
        grace = misfit_grace if misfit_grace is not None else MISFIT_GRACE_LEASES * self.lease
        self.lacking = LackingAgents(clutch, self.book, grace)
        self.policy = dataclasses.replace(
            self.book.config.policy,
            every_n_steps=1,
            min_interval=None,
            on_agent_complete=None,
            durability="sync",
        )

    async def publish(
        self,
        run_id: str,
        seq: int,
        fence: int,
        agent: str | None,
        trace: dict[str, str] | None = None,
    ) -> None:
        """Publish a step message to the agent's channel (None: the pipeline's), carrying
        the run's ``trace`` context."""
        message = StepMessage(run_id, seq, fence, agent, trace or {})
        await self.transport.publish(channel_name(self.clutch.name, agent), message)

    async def handle(self, delivery: Delivery) -> None:
        """Deal with one delivery completely (ack it, or leave it for redelivery), then
        with each message the broker handed over with the ack, in the same slot."""
        following: Delivery | None = delivery
        while following is not None:
            if cancel_requested():  # stopped, also if a library lost the cancellation
                await give_back(following)
                raise asyncio.CancelledError
            following = await self._handle_one(following)

    async def _handle_one(self, delivery: Delivery) -> Delivery | None:
        message = delivery.message
        # what a drain names until the run is claimed: this message's, not the one before
        self.under_way[asyncio.current_task()] = (message.run_id, message.seq)
        store = await self.book.ready()
        try:
            try:
                claimed = await self._claim(store, delivery)
            except asyncio.CancelledError:
                await give_back(delivery)
                raise
            if claimed is not None:
                return await self._take(store, claimed, delivery)
            await delivery.ack()
        except (StaleOwnerError, RunLockedError) as moved_on:  # another process has the run
            log.info(
                "step %d of run %r: %s; dropping the message",
                message.seq,
                message.run_id,
                moved_on,
                extra={"run_id": message.run_id, "step": message.seq},
            )
            await delivery.ack()
        except NestEggError as error:  # a store's, a broker's, or another: the next try may do
            log.warning(
                "step %d of run %r: %s; giving it back",
                message.seq,
                message.run_id,
                error,
                extra={"run_id": message.run_id, "step": message.seq},
            )
            await asyncio.sleep(STORE_RETRY_DELAY)
            with contextlib.suppress(TransportError):
                await delivery.requeue()
        return None

    async def _claim(self, store: CheckpointStorage, delivery: Delivery) -> Claim | None:
        """The run claimed for this delivery, or None when the message is done with.

        The run is read and judged first (a committed step, a live holder, a repoint),
        then claimed at the fence read; the store refuses the claim of a run finished
        meanwhile (RunFinishedError, a RunLockedError). A worker claims a run once per
        turn with it (it goes on with the run's next steps), so the read costs one round
        trip per turn, not per step. The run as read says how the claim continues it
        (see :func:`resumes`): a takeover, after a release, a waiting run.
        """
        run = await self._judged(store, delivery)
        if run is None:
            return None
        how = resumes(run, delivery.message)
        try:
            return Claim(await self._claim_at(store, run.run_id, run.fence), run, how)
        except (RunLockedError, RunNotFoundError):
            return None  # another worker took it first, or it was deleted

    async def _claim_at(self, store: CheckpointStorage, run_id: str, fence: int) -> RunRecord:
        now = self.book.config.clock()
        return await store.claim_run(run_id, fence, self.owner, now + self.lease, now)

    async def _judged(self, store: CheckpointStorage, delivery: Delivery) -> RunRecord | None:
        """The run to claim for this delivery, or None when it is done with (repointed if
        it had to be). A delivery that waits for a holder's lease is done with once the run
        is held by a later claim than the one it waited for: that claim ended, and the
        holder now has a message of its own, which comes back if it dies."""
        message = delivery.message
        waited_for: int | None = None  # the fence of the claim whose lease this waits for
        while True:
            run = await store.get_run(message.run_id)
            elsewhere = not_here(message, run, self.clutch.name, partial(store_shown, store))
            if elsewhere is not None:
                log.warning(elsewhere, extra={"run_id": message.run_id, "step": message.seq})
                return None
            now = self.book.config.clock()
            verdict = judge(run, message, delivery.redelivered, now)
            if verdict is Verdict.DROP:
                return None
            assert run is not None
            if verdict is Verdict.REPOINT:  # a takeover when its worker died going on
                fence = await repoint_fence(store, run)
                await self.publish(run.run_id, run.step_seq + 1, fence, None, message.trace)
                return None
            if verdict is Verdict.TAKE:
                return run
            if waited_for is not None and run.fence != waited_for:
                return None
            waited_for = run.fence
            wait = (run.lease_until or now) - now + CLOCK_MARGIN
            await asyncio.sleep(min(max(wait, CLOCK_MARGIN), self.lease / 3))
            await delivery.keep_alive()

    async def _take(
        self, store: CheckpointStorage, claim: Claim, delivery: Delivery
    ) -> Delivery | None:
        claimed = claim.run
        try:
            execution, recorder = await self._prepare(claim, delivery)
        except (CheckpointCorruptedError, IncompatibleCheckpointError) as error:
            # nothing this pipeline can continue from; any other error goes up: a store's
            # or a broker's gives the message back (handle), the store may answer next time
            if isinstance(error, IncompatibleDataError):  # a model may fit again, for a while
                expired = self.lacking.misfit(claim, error)
                if expired is None:
                    await self.lacking.set_aside(claim, delivery, error)
                    return None
                error = expired  # its agent is there: the run fails
            elif isinstance(error, IncompatibleCheckpointError) and error.agent is not None:
                return await self.lacking.send_on(claim, delivery, error.agent)
            await self._fail(claimed, error, delivery.message.trace)
            await delivery.ack()
            return None
        taken = time.monotonic()
        recorder.goes_on = lambda: self._goes_on(execution, taken)
        set_aside = set_aside_since(claim.read)
        task = asyncio.current_task()
        taken_over = claim.resumes is Resumes.TAKEOVER
        try:
            while True:
                raise_if_cancel_requested(task)  # stopped, also if a library lost the cancel
                self.under_way[task] = (claimed.run_id, execution.seq + 1)
                following = await self._run(
                    claimed, execution, recorder, delivery, taken_over, set_aside
                )
                if following is not Next.CONTINUE:
                    return following
                taken_over, set_aside = False, None  # the steps it goes on with are its own
        except asyncio.CancelledError:
            await asyncio.shield(self._hand_back(store, recorder, delivery))
            raise
        finally:
            await recorder.close()

    async def _prepare(self, claim: Claim, delivery: Delivery) -> tuple[RunExecution, StepRecorder]:
        claimed, how = claim.run, claim.resumes
        warm = self.warm.pop(claimed.run_id, None)
        if warm is not None and warm.continues(claimed):
            recorder = self._recorder(claimed, delivery, warm.base, list(warm.kept))
            execution = warm.execution
            execution.recorder = recorder  # the run's next step, on the live execution
            seq, checkpoint_id = warm.step_seq, warm.kept[-1] if warm.kept else None
        else:
            start, kept, state = await self.book.load_for_step(
                claimed, StepListeners(), resumed=how is not None
            )
            recorder = self._recorder(claimed, delivery, start.base, kept)
            execution = self.book.new_execution(start, recorder)
            seq = state.seq  # below the run's after a damaged checkpoint: a valid one's
            checkpoint_id = state.checkpoint.checkpoint_id if state.checkpoint else None
        recorder.replay_until = claimed.step_seq + 1
        recorder.failed_step = await failed_step(self.book.store, claim)
        trace = delivery.message.trace  # the caller's, kept for the sweeper's messages
        if seq < claimed.step_seq or how is not None:  # say what this resumes, and whose
            events = await resumed_by(self.book.store, claim, checkpoint_id, seq, trace)
            for kind, payload in events:
                recorder.event(kind, recorder.clock(), payload)
            if seq < claimed.step_seq:  # a damaged checkpoint: back to a valid one
                await recorder.start(seq, claimed.step_seq + 1)
            else:
                await recorder.start()
        elif claimed.event_seq == 0:  # written with the first step's start, call or commit
            recorder.event(RUN_STARTED, recorder.clock(), opening_payload(trace))
            await recorder.start(fresh=True)
        elif recorder.failed_step is not None:  # its opening commit drops the failed calls
            await recorder.start()
        else:
            recorder.begin()
        return execution, recorder

    def _recorder(
        self, claimed: RunRecord, delivery: Delivery, base: Snapshot, kept: list[str]
    ) -> StepRecorder:
        return StepRecorder(
            self.book.store,
            self.policy,
            claimed,
            lease_seconds=self.lease,
            base=base,
            kept=kept,
            on_checkpoint=self.clutch.on_checkpoint,
            clock=self.book.config.clock,
            delivery=delivery,
        )

    async def _goes_on(self, execution: RunExecution, taken: float) -> bool:
        """Whether this worker runs the run's next step itself, right after the step just
        run: it hosts the next step's agent (or a SELECTOR picks it here), it is not
        stopping, and the run (taken at ``taken``) has not had its time here while other
        messages wait for a slot, nor held its message for CONTINUE_AT_MOST. With every
        slot taken and nothing waiting, the run stays here: a hand-back would only bring
        it back to this worker through the broker."""
        held = time.monotonic() - taken
        if self.stopping.is_set() or held >= CONTINUE_AT_MOST:
            return False
        route = next_route(execution)
        if route is not None and route not in self.hosts:
            return False
        return held < CONTINUE_FOR or not await self.crowded()

    def _keep_warm(self, fence: int, execution: RunExecution, recorder: StepRecorder) -> None:
        """Keep a run's state after its step, for its next step if this worker gets it."""
        while len(self.warm) >= WARM_RUNS:
            del self.warm[next(iter(self.warm))]
        kept = tuple(recorder.kept)
        warm = Warm(fence, execution.seq, recorder.event_seq, execution, recorder.last_good, kept)
        self.warm[execution.run_id] = warm

    async def _run(
        self,
        claimed: RunRecord,
        execution: RunExecution,
        recorder: StepRecorder,
        delivery: Delivery,
        taken_over: bool,
        set_aside: float | None = None,
    ) -> Delivery | Next | None:
        """Run the step; CONTINUE when this worker runs the next step too (the step's
        commit kept the lease), else ack: the message handed over with the ack, if any.
        ``set_aside``: when the step was first set aside for a model (kept when the step
        is only sent on to its agent's channel)."""
        try:
            outcome = await self.telemetry.run_step(
                execution,
                delivery.message,
                claimed.fence,
                self.book.store,
                lambda: execution.execute_one(self.hosts.__contains__),
                taken_over,
            )
        except StaleOwnerError as lost:  # taken over or cancelled: dropped, not published
            log.info(
                "step %d of run %r dropped: %s",
                execution.seq + 1,
                claimed.run_id,
                await ownership_lost(self.book.store, lost),
                extra={"run_id": claimed.run_id},
            )
            await delivery.ack()
            return None
        except (StorageError, TransportError):
            raise  # the message is given back (handle)
        except RunWaiting as waiting:  # stored as waiting: signal() or a sweep resumes it
            told = RunWaiting(claimed.run_id, waiting.signal, waiting.deadline, on_workers=True)
            log.info("%s", told, extra={"run_id": claimed.run_id})
            tracing.run_ended(execution, "waiting")
            await delivery.ack()
            return None
        except Exception as error:  # the step failed: recorded as the run's failure
            log.info(
                "run %r failed: %s: %s",
                claimed.run_id,
                type(error).__name__,
                error,
                extra={"run_id": claimed.run_id},
            )
            tracing.run_ended(execution, "failed")
            await delivery.ack()
            return None
        route = outcome if outcome != STEP_DONE else next_route(execution)
        if outcome == STEP_DONE and route is None and self.clutch.strategy is not Strategy.SELECTOR:
            await recorder.finish(execution.ctx.data, execution.data_seq)  # nothing comes next
            outcome = RUN_DONE
        if outcome == RUN_DONE:
            tracing.run_ended(execution, "completed")
            await delivery.ack()
            return None
        if outcome == STEP_DONE and recorder.going_on:
            return Next.CONTINUE
        if outcome != STEP_DONE or recorder.lease_seconds:
            await recorder.release(set_aside=set_aside if outcome != STEP_DONE else None)
        trace = delivery.message.trace
        message = StepMessage(claimed.run_id, execution.seq + 1, claimed.fence, route, trace)
        following = await delivery.forward(channel_name(self.clutch.name, route), message)
        if outcome == STEP_DONE:
            self._keep_warm(claimed.fence, execution, recorder)
        return following

    async def _hand_back(
        self, store: CheckpointStorage, recorder: StepRecorder, delivery: Delivery
    ) -> None:
        """Release a run whose step was interrupted (a drain), saying so in its log
        (``run_interrupted``, ``released``), and point any worker at it again with the fence
        of the message this claim took, one below the run's: the worker that claims it
        resumes it as a run given back (see :func:`resumes`)."""
        try:
            run = await store.get_run(recorder.run_id)
            if run is None or run.status != RUNNING or run.fence != recorder.fence:
                await delivery.ack()  # cancelled or taken meanwhile: its holder goes on
                return
            with contextlib.suppress(StaleOwnerError):
                await recorder.release(interruption(run, released=True))
                trace = delivery.message.trace
                await self.publish(run.run_id, run.step_seq + 1, run.fence - 1, None, trace)
            await delivery.ack()
        except (NestEggError, OSError) as error:
            log.warning(
                "could not hand back run %r: %s",
                recorder.run_id,
                error,
                extra={"run_id": recorder.run_id},
            )

    async def _fail(
        self, claimed: RunRecord, error: CheckpointError, trace: dict[str, str]
    ) -> None:
        """Record that the run cannot be continued: no valid checkpoint to continue from
        (CheckpointCorruptedError), one the pipeline cannot continue from
        (IncompatibleCheckpointError without an agent), or data that no worker's model
        fitted within the misfit grace (IncompatibleDataError, naming its agent as the
        failed one); a run whose log is empty gets its
        ``run_started`` event, with the caller's ``trace``, first. Any other error while
        the run is loaded leaves it as it is: a store's or a broker's gives the message
        back (:meth:`handle`), another is logged by the worker."""
        log.error(
            "run %r cannot continue: %s", claimed.run_id, error, extra={"run_id": claimed.run_id}
        )
        agent = error.agent if isinstance(error, IncompatibleDataError) else None
        failure = failure_body(failure_detail(error, agent))
        opening = opening_payload(trace) if claimed.event_seq == 0 else None
        commit = failure_commit(claimed, self.book.config.clock(), failure, opening)
        with contextlib.suppress(NestEggError):
            await self.book.store.commit(commit)
