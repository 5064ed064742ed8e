"""Handles on submitted work: ClutchTask and the StepEvent it streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from nestegg.cancellation import cancel
from nestegg.durations import seconds_or_none

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage

RESULT_STEP = "_result"


class StepEvent:
    """One completed step (``final=False``) or the run's result (``step="_result"``, final)."""

    __slots__ = ("data", "final", "step")

    def __init__(self, step: str, data: Any, final: bool = False) -> None:
        self.step = step
        self.data = data
        self.final = final

    def __repr__(self) -> str:
        return f"StepEvent(step={self.step!r}, final={self.final})"


class StepListeners:
    """The queues of whoever streams a run; publishing costs nothing when nobody listens."""

    __slots__ = ("queues",)

    def __init__(self) -> None:
        self.queues: list[asyncio.Queue[StepEvent]] = []

    def attach(self) -> asyncio.Queue[StepEvent]:
        """A new queue that receives every event published from now on."""
        queue: asyncio.Queue[StepEvent] = asyncio.Queue()
        self.queues.append(queue)
        return queue

    def detach(self, queue: asyncio.Queue[StepEvent]) -> None:
        """Stop delivering to ``queue``."""
        if queue in self.queues:
            self.queues.remove(queue)

    def publish(self, event: StepEvent) -> None:
        """Deliver ``event`` to every attached queue."""
        for queue in self.queues:
            queue.put_nowait(event)


async def until_started(task: asyncio.Task[Any], started: asyncio.Event) -> None:
    """Return once ``task`` set ``started`` or finished without an error; cancelled
    meanwhile, the task is cancelled too.

    Raises:
        Exception: what the task raised before it set ``started``.
    """
    flag = asyncio.ensure_future(started.wait())
    try:
        await asyncio.wait({flag, task}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        flag.cancel()
    if not started.is_set() and task.done():
        task.result()  # its error, if it raised one


Late = Callable[[float], Awaitable[str | Exception]]
"""Why a wait for a run's result timed out after so many seconds: the message of its
TimeoutError, or the error to raise instead."""


async def not_finished(limit: float) -> str:
    """Why a wait for the result of a run without a store timed out."""
    return (
        f"the run did not finish within {limit:g} s; it goes on while this event loop runs "
        "(no store keeps its outcome: only the task of submit() gives it, awaited again)"
    )


WAIT_LONGER = "to wait longer, pass timeout=None (as long as the run takes) or a larger timeout"
"""How a caller whose wait for a run's result timed out waits longer: the end of the
TimeoutError of ``run(timeout=)`` and ``task.result(timeout=)``, whose default of 30 s
(eggai-clutch's) is short for a pipeline of LLM calls."""


def outcome_hint(run_id: str) -> str:
    """How to get the outcome of the stored run ``run_id`` after a wait timed out."""
    return f"await clutch.result({run_id!r}) for its outcome"


class LocalLate:
    """Why a wait for the result of ``run_id``, checkpointed in ``store`` and executed in
    this process, timed out after ``limit`` seconds (``stored``: set once the run is
    stored). An object, not a closure: one object a run instead of a function, its cells
    and their tuple. A resume's or a fork's run is named once read (:meth:`named`)."""

    __slots__ = ("run_id", "store", "stored")

    def __init__(self, run_id: str | None, stored: asyncio.Event, store: CheckpointStorage) -> None:
        self.run_id = run_id
        self.stored = stored
        self.store = store

    def named(self, run_id: str) -> None:
        """The run goes on stored as ``run_id`` (a resume's run, read; a fork's, stored)."""
        self.run_id = run_id
        self.stored.set()

    async def __call__(self, limit: float) -> str:
        run_id = self.run_id
        if run_id is None:  # a resume or fork that had not read or stored its run yet
            return (
                f"the run was not read or stored within {limit:g} s (the store took "
                "longer); it goes on while this event loop runs: clutch.list_runs() "
                "names it once it is stored"
            )
        if not self.stored.is_set():
            return (
                f"run {run_id!r} was not stored within {limit:g} s (its write to the store "
                "took longer); it goes on while this event loop runs: once it is stored, "
                f"{outcome_hint(run_id)}"
            )
        from nestegg.checkpoint.cancels import cancel_requested  # checkpoint imports task

        if await cancel_requested(self.store, run_id):  # by nestegg cancel, say
            return (
                f"run {run_id!r} did not finish within {limit:g} s: its cancel was requested, "
                "and takes effect at its next commit, where this process stops it, the step "
                f"under way not recorded (resume_latest({run_id!r}) continues it on purpose)"
            )
        return (
            f"run {run_id!r} did not finish within {limit:g} s; it goes on while this event "
            f"loop runs: {outcome_hint(run_id)} (if the loop ends first, the run is stored "
            f"as cancelled, and resume_latest({run_id!r}) continues it)"
        )


class ClutchTask:
    """A submitted run: await it, wait with a timeout, stream its steps or cancel it.

    Example:
        >>> task = await clutch.submit({"query": "q"})
        >>> result = await task.result(timeout=60)
    """

    __slots__ = ("_late", "_listeners", "_task", "id")

    def __init__(
        self,
        task_id: str,
        task: asyncio.Task[Any],
        listeners: StepListeners,
        late: Late | None = None,
    ) -> None:
        self.id = task_id
        self._task = task
        self._listeners = listeners
        self._late = late or not_finished

    @property
    def done(self) -> bool:
        """Whether the run has finished (non-blocking)."""
        return self._task.done()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._task.__await__()

    async def result(self, timeout: float | None = 30.0) -> Any:
        """The run's result, waiting at most ``timeout`` seconds (None: no limit).

        Raises:
            TimeoutError: not finished in time (the run goes on); its message says so (with
                a transport: whether a worker took the run's first step; checkpointed and
                executed here: that its cancel was requested from outside, when it was,
                which takes effect at its next commit).
            TransportError: with a transport, the run is stored and its first step waits
                for a broker connection that does not open (a RabbitMQ port that does not
                answer the AMQP handshake): the error a connection's opening that times
                out gives, saying what becomes of the run.
            ConfigurationError: ``timeout`` is not None, a timedelta or seconds from 0 to 100
                years.
            RunWaiting: the run waits for a signal or a timer (stored as ``waiting``).
        """
        # Not asyncio.wait_for: on Python 3.11 it can lose the caller's cancellation (see
        # nestegg/cancellation.py), and it keeps more objects alive per run while it waits.
        limit = seconds_or_none(timeout, "timeout")
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                return await asyncio.shield(self._task)
        except TimeoutError:
            if limit is None or not deadline.expired():
                raise  # the run's own TimeoutError
            why = await self._late(limit)
            if isinstance(why, Exception):  # what the run's transport says held it
                raise why from None
            raise TimeoutError(f"{why}; {WAIT_LONGER}") from None

    async def stream(
        self, queue: asyncio.Queue[StepEvent] | None = None
    ) -> AsyncIterator[StepEvent]:
        """Yield a StepEvent per step completed from now on, then the final result event.

        Raises:
            Exception: whatever the run raised.
        """
        if queue is None:
            queue = self._listeners.attach()
        try:
            while not self._task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, self._task}, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                event = getter.result()
                if not event.final:
                    yield event
            yield StepEvent(RESULT_STEP, await self._task, final=True)
        finally:
            self._listeners.detach(queue)

    def cancel(self) -> None:
        """Cancel the run; a checkpointed run is marked cancelled and stays resumable."""
        cancel(self._task)
