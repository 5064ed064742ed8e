"""The step loop of one run: ask the cursor for an agent, run it, record the step.

Per step the loop does O(1) work besides the agent: the step's context shares the history
with the one before (``ClutchContext.next``) and the recorder writes only what the step
produced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn, Protocol

from nestegg import telemetry
from nestegg.agents import AgentNode, to_plain, to_typed
from nestegg.cancellation import raise_if_cancel_requested
from nestegg.constants import (
    OUTCOME_COMPLETED,
    OUTCOME_HANDOVER,
    OUTCOME_TERMINATED,
    YIELD_EVERY_STEPS,
)
from nestegg.context import ClutchContext, set_context
from nestegg.errors import (
    ConfigurationError,
    RunWaiting,
    StorageUnavailableError,
    StoreRefusedError,
)
from nestegg.journal_checks import replay_entry
from nestegg.recording import StepResult, Timed
from nestegg.signals import Handover, Terminate, WaitSuspended
from nestegg.strategies import Cursor
from nestegg.task import StepEvent, StepListeners

StepHook = Callable[[str, Any, Any], Awaitable[None]]
STEP_DONE = ":step"
"""execute_one(): a step ran and the run goes on."""
RUN_DONE = ":run"
"""execute_one(): the run ended and its result is recorded."""


class Recorder(Protocol):
    """Where a run's steps go: nowhere (plain runs) or a checkpoint store.

    Every method the step loop calls is declared here; an execution is built with its
    recorder (``Clutch.new_execution``).
    """

    journals: bool
    """Whether calls made inside steps are journaled (``journal_*`` are then called)."""

    keeps_position: bool
    """Whether steps carry the strategy's position (``StepResult.position``)."""

    clock: Callable[[], float]
    """The time of the run's timestamps (a step's start), in seconds since the epoch."""

    def encode_output(self, value: Any) -> bytes | None:
        """The step output as stored bytes (None when nothing is stored)."""

    def record_step(self, step: StepResult) -> Awaitable[None]:
        """Record a completed step (and a checkpoint when the policy says so); awaited at
        once (a recorder may hand back its store's awaitable, with no coroutine of its own)."""

    def step_started(self, seq: int, agent: str, started: float) -> None:
        """Note that a step started (its start may be written while it runs)."""

    async def step_failed(
        self, seq: int, agent: str | None, error: BaseException, started: float
    ) -> None:
        """Record that a step raised (its agent, or the selector picking it: ``agent``
        None); the run is marked failed."""

    async def finish(self, result: Any, data_seq: int) -> None:
        """Record the run's result."""

    async def cancelled(self) -> None:
        """Record that the run was cancelled."""

    async def checkpoint_now(self, reason: str, pending_agent: str | None) -> str:
        """Write a checkpoint of the last recorded state now; its id."""

    async def boundary(self) -> None:
        """Called between steps: serve manual checkpoint requests."""

    async def journal_entry(self, step: int, position: int) -> dict[str, Any] | None:
        """The recorded call at ``position`` of ``step``, None when there is none."""

    async def journal_result(
        self, step: int, position: int, function: str, digest: str, result: Any, timed: Timed
    ) -> None:
        """Record a journaled call's result (and when it began, how long it took) now."""

    async def journal_error(
        self, step: int, position: int, function: str, digest: str, error: Exception, timed: Timed
    ) -> None:
        """Record a journaled call's final failure (and when it began, how long it took) now."""

    async def suspend(self, signal: str | None, deadline: float | None) -> None:
        """Record that the run waits (for ``signal``, or a timer) until ``deadline``; the
        step under way keeps its journal and runs again when the run is resumed."""


class NullRecorder:
    """Records nothing: a Clutch without checkpointing."""

    journals = False
    keeps_position = False

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock

    def encode_output(self, value: Any) -> bytes | None:
        return None

    async def record_step(self, step: StepResult) -> None:
        return None

    def step_started(self, seq: int, agent: str, started: float) -> None:
        return None

    async def step_failed(
        self, seq: int, agent: str | None, error: BaseException, started: float
    ) -> None:
        return None

    async def finish(self, result: Any, data_seq: int) -> None:
        return None

    async def cancelled(self) -> None:
        return None

    async def checkpoint_now(self, reason: str, pending_agent: str | None) -> str:
        raise ConfigurationError(
            "this Clutch has no checkpointing: pass checkpoint=CheckpointConfig(...)"
        )

    async def boundary(self) -> None:
        return None

    async def journal_entry(self, step: int, position: int) -> dict[str, Any] | None:
        return None

    async def journal_result(
        self, step: int, position: int, function: str, digest: str, result: Any, timed: Timed
    ) -> None:
        return None

    async def journal_error(
        self, step: int, position: int, function: str, digest: str, error: Exception, timed: Timed
    ) -> None:
        return None

    async def suspend(self, signal: str | None, deadline: float | None) -> None:
        raise ConfigurationError(
            "waiting needs checkpointing: pass checkpoint=CheckpointConfig(...)"
        )


class RunExecution:
    """One run in progress."""

    def __init__(
        self,
        *,
        ctx: ClutchContext,
        cursor: Cursor,
        agents: Mapping[str, AgentNode],
        max_turns: int,
        recorder: Recorder,
        listeners: StepListeners,
        on_step: StepHook | None = None,
        seq: int = 0,
        data_seq: int = 0,
        next_agent: str | None = None,
    ) -> None:
        self.ctx = ctx  # the current step's: each step's output makes a new one (next)
        self.cursor = cursor
        self.agents = agents
        self.max_turns = max_turns
        self.recorder = recorder
        self.listeners = listeners
        self.on_step = on_step
        self.seq = seq
        self.data_seq = data_seq
        self.pending_agent = next_agent
        self.current_agent: str | None = None
        self.call_step: int | None = None
        self.call_position = 0
        self.call_stride = 1
        self.last_outcome = OUTCOME_COMPLETED
        self.telemetry: telemetry.RunTelemetry | None = None
        ctx._execution = self

    @property
    def journaling(self) -> bool:
        """Whether a call made now is journaled: the run journals and an agent (or the
        selector choosing the next one) is running."""
        return self.call_step is not None and self.recorder.journals

    def _calls_go_to(self, step: int | None, first: int = 0, stride: int = 1) -> None:
        """Journal the calls made from now on in ``step`` at first, first + stride, ..."""
        self.call_step, self.call_position, self.call_stride = step, first, stride

    async def journaled(
        self,
        function: str,
        digest: str,
        replay: str,
        invoke: Callable[[], Awaitable[Any]],
        rebuild: Callable[[Any, str], Any] | None = None,
    ) -> Any:
        """Replay the recorded call at the next position, or make and record it.

        An agent's calls take positions 0, 1, 2, ... of its step; the selector's calls,
        made while it picks the agent of a step, take -1, -2, ... of that step.

        Args:
            function: the called function's qualified name.
            digest: the hash of its arguments.
            replay: "record" or "rerun".
            invoke: makes the call.
            rebuild: turns a replayed result (and where it was recorded) into the value
                returned.

        Only called while :attr:`journaling` (``nestegg.call`` checks it first).

        Raises:
            NonDeterminismError: the journal holds another call at this position.
            JournaledCallError: the recorded call failed for good.
            RuntimeError: no step is journaling calls.
        """
        step, position = self.call_step, self.call_position
        if step is None:
            raise RuntimeError("journaled() needs a step that journals calls: check journaling")
        self.call_position += self.call_stride
        journal = self.recorder
        recorded = await journal.journal_entry(step, position) if replay == "record" else None
        if recorded is not None:
            value = replay_entry(recorded, function, digest, step, position)
            return rebuild(value, f"step {step}, call {position}") if rebuild else value
        started, began = journal.clock(), time.perf_counter()
        try:
            result = await invoke()
        except Exception as error:
            timed = Timed(started, time.perf_counter() - began)
            await journal.journal_error(step, position, function, digest, error, timed)
            raise
        timed = Timed(started, time.perf_counter() - began)
        await journal.journal_result(step, position, function, digest, result, timed)
        return result

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.ctx.state.clutch_id

    async def execute(self) -> Any:
        """Run steps until the strategy stops, max_turns is reached or an agent terminates."""
        set_context(self.ctx)
        step = telemetry.step_runner(self)
        task = asyncio.current_task()
        try:
            while self.ctx.state.turn < self.max_turns:
                raise_if_cancel_requested(task)  # a cancellation a library lost in a step
                await self.recorder.boundary()
                agent = await self._next_agent()
                if agent is None or await step(agent):
                    break
                if not self.seq % YIELD_EVERY_STEPS:
                    await asyncio.sleep(0)  # let timeouts and cancellation in
        except WaitSuspended as wait:
            await self._suspend(wait)
        except asyncio.CancelledError:
            await asyncio.shield(self.recorder.cancelled())
            raise
        finally:
            self.current_agent = None
        await self.recorder.finish(self.ctx.data, self.data_seq)
        return self.ctx.data

    # ------------------------------------------------ one step (distributed mode)

    async def execute_one(self, hosts: Callable[[str], bool]) -> str | None:
        """Run the next step only, as a worker does: the run stays ``running`` after it.

        Args:
            hosts: whether this process runs an agent's steps.

        Returns:
            ``STEP_DONE`` after a step that the run continues from; ``RUN_DONE`` when the
            run ended (its result is recorded: the strategy stopped, ``max_turns`` was
            reached or an agent terminated); otherwise the name of the agent that runs
            next, which this process does not host (nothing was run).

        A cancellation is not recorded: the worker releases the run and it stays
        resumable from its last committed step.
        """
        set_context(self.ctx)
        try:
            ended = await self._one(hosts)
        except WaitSuspended as wait:
            await self._suspend(wait)
        finally:
            self.current_agent = None
        if isinstance(ended, str):
            return ended
        if not ended:
            return STEP_DONE
        await self.recorder.finish(self.ctx.data, self.data_seq)
        return RUN_DONE

    async def _one(self, hosts: Callable[[str], bool]) -> bool | str:
        """Run the next step if this process hosts its agent: whether the run ended, or
        the name of the agent it does not host."""
        ended = self.ctx.state.turn >= self.max_turns
        if not ended:
            await self.recorder.boundary()
            agent = await self._next_agent()
            if agent is not None and not hosts(agent.name):
                self.pending_agent = agent.name
                return agent.name
            ended = agent is None or await telemetry.step_runner(self)(agent)
            ended = ended or self.ctx.state.turn >= self.max_turns
        return ended

    async def _suspend(self, wait: WaitSuspended) -> NoReturn:
        """Store the run as waiting and raise RunWaiting (the step keeps its journal)."""
        self.current_agent = None
        await self.recorder.suspend(wait.signal, wait.deadline)
        raise RunWaiting(self.run_id, wait.signal, wait.deadline) from None

    async def _next_agent(self) -> AgentNode | None:
        name = self.pending_agent
        if name is not None:
            self.pending_agent = None
        else:
            name = await self._choose()
        return self.agents.get(name) if name is not None else None

    async def _choose(self) -> str | None:
        """The agent the cursor names next; a selector that raises fails the step whose
        agent it was picking, as the agent's own error would."""
        seq = self.seq + 1
        started = self.recorder.clock()
        self._calls_go_to(seq, -1, -1)
        try:
            return await self.cursor.next_agent(self.ctx.data)
        except Exception as error:
            await self._step_failed(seq, None, error, started)
            raise
        finally:
            self._calls_go_to(None)

    async def _call(self, agent: AgentNode, data: Any) -> Any:
        self._calls_go_to(self.seq + 1)
        try:
            output = to_plain(await agent.handler(to_typed(data, agent.input_type)))
            if self.on_step is not None:
                await self.on_step(agent.name, data, output)
        finally:
            self._calls_go_to(None)
        return output

    async def _step(self, agent: AgentNode) -> bool:
        """Run one agent; True when the run stops after it."""
        ctx = self.ctx
        seq = self.seq + 1
        self.current_agent = agent.name
        started = self.recorder.clock()
        began = time.perf_counter()
        target = None
        self.recorder.step_started(seq, agent.name, started)
        try:
            output = await self._call(agent, ctx.data)
            produced, outcome = True, OUTCOME_COMPLETED
        except Terminate as signal:
            output, outcome = to_plain(signal.result), OUTCOME_TERMINATED
            produced = signal.result is not None
        except Handover as signal:
            output, outcome, target = to_plain(signal.data), OUTCOME_HANDOVER, signal.agent
            produced = signal.data is not None
        except Exception as error:
            await self._step_failed(seq, agent.name, error, started)
            raise
        try:
            stored = self.recorder.encode_output(output) if produced else None
        except Exception as error:
            await self._step_failed(seq, agent.name, error, started)
            raise
        if outcome == OUTCOME_COMPLETED:
            stop = not self.cursor.completed(agent.name)
        elif outcome == OUTCOME_HANDOVER:
            stop = not self.cursor.handover(target or "")
        else:
            stop = True
        if produced:
            self.ctx = ctx = ctx.next(agent.name, output)
            set_context(ctx)
            self.data_seq = seq
        self.seq = seq
        self.last_outcome = outcome
        self.current_agent = None
        timing = (started, time.perf_counter() - began)
        try:  # no local holds the StepResult while the commit is awaited
            await self.recorder.record_step(
                self._result(seq, agent, outcome, stored, timing, target)
            )
        except Exception as error:
            await self._step_failed(seq, agent.name, error, started)
            raise
        if self.listeners.queues:
            self.listeners.publish(StepEvent(agent.name, ctx.data))
        return stop

    async def _step_failed(
        self, seq: int, agent: str | None, error: Exception, started: float
    ) -> None:
        """Record that step ``seq`` (of ``agent``; None: the selector picking its agent)
        failed with ``error``, unless the store was unavailable
        or refused its settings (a commit, a journaled call's, a read): the run then stays
        as last committed, resumable (a worker gives its step back), instead of failing
        for a store that may answer the next try; a commit it could not confirm may even
        have been stored. A store's other errors (a record it refuses) fail the step."""
        if not isinstance(error, (StorageUnavailableError, StoreRefusedError)):
            await self.recorder.step_failed(seq, agent, error, started)

    def _result(
        self,
        seq: int,
        agent: AgentNode,
        outcome: str,
        stored: bytes | None,
        timing: tuple[float, float],
        target: str | None,
    ) -> StepResult:
        """What step ``seq`` did, for the recorder (built, not awaited: no coroutine)."""
        ctx = self.ctx
        return StepResult(
            seq=seq,
            agent=agent.name,
            outcome=outcome,
            output=stored,
            started=timing[0],
            duration=timing[1],
            target=target,
            turn=ctx.state.turn,
            data_seq=self.data_seq,
            source=ctx.source,
            position=self.cursor.position() if self.recorder.keeps_position else {},
            metadata=ctx.metadata,
        )
