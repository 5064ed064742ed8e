"""CheckpointedRuns: a checkpointed Clutch's runs: start, resume, fork, recover; listing,
cancels and cleanup are its base's, :class:`~nestegg.checkpoint.run_store.RunStore`. It
reaches the Clutch only through the ``Pipeline`` Protocol (pipeline.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nestegg import telemetry_attempts
from nestegg.agents import to_plain
from nestegg.checkpoint.admission import (
    check_data,
    check_not_owned,
    check_pipeline,
    request_pending,
    restored_cursor,
    resume_point,
    resume_start,
)
from nestegg.checkpoint.cancels import claim_to_resume, ownership_lost
from nestegg.checkpoint.checkpointer import Checkpointer
from nestegg.checkpoint.codec import encode_value, seal
from nestegg.checkpoint.formats import NO_METADATA, Snapshot, opening_payload
from nestegg.checkpoint.loader import load_state
from nestegg.checkpoint.ownership import (
    active_runs,
    resumption,
)
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.run_store import RunStore
from nestegg.checkpoint.views import (
    CheckpointState,
    RunHistory,
    run_input,
    run_result,
)
from nestegg.checkpoint.waiting import signal_came, signal_resumes, store_signal
from nestegg.constants import (
    COMPLETED,
    FAILED,
    RUN_RESUMED,
    RUN_STARTED,
    RUNNING,
)
from nestegg.context import ClutchContext
from nestegg.errors import (
    CheckpointCorruptedError,
    RunExistsError,
    RunFinishedError,
    RunLockedError,
    RunWaiting,
    StaleOwnerError,
)
from nestegg.execution import Recorder, RunExecution
from nestegg.strategies import Cursor
from nestegg.task import StepListeners


@dataclass(slots=True)
class PreparedRun:
    """A run's context and cursor restored from a state, before anything is written: the
    execution is built from it with its checkpointer (:meth:`CheckpointedRuns.execute`)."""

    ctx: ClutchContext
    cursor: Cursor
    base: Snapshot
    seq: int
    data_seq: int
    next_agent: str | None
    listeners: StepListeners


class CheckpointedRuns(RunStore):
    """Everything a checkpointed Clutch does with its store: starting, resuming, forking
    and recovering runs here; what it reads and keeps there is :class:`RunStore`'s.

    Args:
        clutch: the pipeline (a Clutch, through the ``Pipeline`` Protocol).
        config: where and when to checkpoint.
    """

    # ------------------------------------------------------------------ starting

    async def run(
        self,
        input_data: Any,
        run_id: str | None,
        listeners: StepListeners,
        stored: Callable[[], None] | None = None,
    ) -> Any:
        """Start a new run (or return the stored result of a completed one); ``stored`` is
        called once the new run is stored, before its first step."""
        run_id = self.new_id(run_id)
        data = to_plain(input_data)
        sealed_input = seal(encode_value(data, "input"))
        store = await self.ready()
        existing = await store.get_run(run_id)
        if existing is not None:
            return self._existing(existing, sealed_input)
        record = self._new_record(run_id, sealed_input, owned=True)
        try:
            await store.create_run(record)
        except RunExistsError:
            raced = await store.get_run(run_id)
            return self._existing(raced, sealed_input) if raced else None
        if stored is not None:
            stored()
        start = self.fresh_start(run_id, data, listeners)
        return await self.execute(record, start, [], [(RUN_STARTED, opening_payload())], data)

    def fresh_start(self, run_id: str, data: Any, listeners: StepListeners) -> PreparedRun:
        """Where a new run ``run_id`` of input ``data`` starts: before its first step."""
        ctx = self.clutch.new_context(run_id, data)
        cursor = self.clutch.new_cursor()
        base = Snapshot(0, 0, 0, "input", cursor.position(), NO_METADATA)
        return PreparedRun(ctx, cursor, base, 0, 0, None, listeners)

    def new_checkpointer(self, run: RunRecord, base: Snapshot, kept: list[str]) -> Checkpointer:
        """The checkpointer of the owned ``run`` from ``base``, ``kept`` its checkpoints."""
        return Checkpointer(
            self.store,
            self.config.policy,
            run,
            lease_seconds=self.lease,
            base=base,
            kept=kept,
            on_checkpoint=self.clutch.on_checkpoint,
            clock=self.config.clock,
        )

    async def execute(
        self,
        run: RunRecord,
        start: PreparedRun,
        kept: list[str],
        events: Sequence[tuple[str, dict[str, Any]]],
        input_data: Any,
        *,
        truncate_after: int | None = None,
        replay_until: int = 0,
        failed_step: int | None = None,
        request_again: bool = False,
    ) -> Any:
        """Build the execution of the owned ``run`` from ``start`` with its checkpointer and
        drive it; the opening commit writes ``events`` and the truncation, which keeps the
        journal of the steps up to ``replay_until`` (that of ``failed_step``, the step a
        resumed failed run failed in, replays up to its first failure). A new run awaits
        ``on_request``, and so does a resume with ``request_again`` (it starts the run from
        its input)."""
        recorder = self.new_checkpointer(run, start.base, kept)
        recorder.replay_until = replay_until
        recorder.failed_step = failed_step
        execution = self.new_execution(start, recorder)
        active_runs[run.run_id] = run.fence
        try:
            return await self._attempt(
                run,
                execution,
                events,
                recorder,
                input_data,
                truncate_after,
                replay_until,
                request_again=request_again,
            )
        except RunWaiting as error:
            # Its signal may have come while the step ran, unseen by the signaller: go on.
            if not await signal_came(self.store, error):
                raise
            waiting = error
        except StaleOwnerError as lost:  # taken from this process: cancelled, perhaps
            raise await ownership_lost(self.store, lost, settle=True) from None
        finally:
            if active_runs.get(run.run_id) == run.fence:
                del active_runs[run.run_id]
        try:
            return await self.resume_latest(run.run_id, execution.listeners, reopen_cancelled=False)
        except RunLockedError:  # the signaller resumed it after all (or cancelled it)
            raise waiting from None

    @telemetry_attempts.traced_attempt
    async def _attempt(
        self,
        run: RunRecord,
        execution: RunExecution,
        events: Sequence[tuple[str, dict[str, Any]]],
        recorder: Checkpointer,
        input_data: Any,
        truncate_after: int | None,
        replay_until: int,
        *,
        request_again: bool,
    ) -> Any:
        """One attempt at ``run``: its opening commit (``events``, the truncation), then the
        execution driven to its end. An ``on_request`` that raises fails the run with its
        error."""
        for kind, payload in events:
            recorder.event(kind, self.config.clock(), payload)
        kinds = {kind for kind, _ in events}
        fresh = RUN_STARTED in kinds and RUN_RESUMED not in kinds
        await recorder.start(truncate_after, replay_until, fresh=fresh)
        try:
            return await self.clutch.drive(
                execution,
                input_data,
                fresh=fresh or request_again,
                refused=recorder.request_failed,
            )
        except asyncio.CancelledError:
            if not recorder.ended:  # cancelled before its steps (in on_request): recorded
                await asyncio.shield(recorder.cancelled())
            raise
        finally:
            if not recorder.ended:  # the store failed before its steps: its heartbeat ends
                await recorder.abandon()

    def new_execution(self, start: PreparedRun, recorder: Recorder) -> RunExecution:
        """The execution that runs from ``start``, recording through ``recorder``."""
        return self.clutch.new_execution(
            start.ctx,
            recorder,
            start.listeners,
            cursor=start.cursor,
            seq=start.seq,
            data_seq=start.data_seq,
            next_agent=start.next_agent,
        )

    # ------------------------------------------------- distributed mode (workers)

    async def load_for_step(
        self, run: RunRecord, listeners: StepListeners, *, resumed: bool
    ) -> tuple[PreparedRun, list[str], CheckpointState]:
        """What continues the claimed ``run`` from its newest valid checkpoint (its
        execution is built with the worker's recorder), the kept checkpoints and the state
        loaded. Writes nothing.

        Its data is checked against the model of the agent it goes to when a step stored
        it, or when the claim resumes the run (``resumed``: a takeover, a release, a
        waiting run), as a resume checks it. A new run's input at its first step is not:
        it goes through the step, which fails on it, as in a run without workers.

        Raises:
            CheckpointCorruptedError: a fork without a valid checkpoint.
            IncompatibleCheckpointError: an agent the state continues with is gone, or
                (IncompatibleDataError) its data no longer fits the model of the agent
                it goes to.
        """
        state, checkpoints = await resume_point(self.store, run)
        start = self.prepare(run, state, listeners)
        if resumed or run.step_seq > 0:
            check_data(self.clutch, start.cursor, state)
        return start, [c.checkpoint_id for c in checkpoints], state

    # ------------------------------------------------------------------ resuming

    async def resume_latest(
        self,
        run_id: str | None,
        listeners: StepListeners,
        *,
        reopen_cancelled: bool = True,
        named: Callable[[str], None] | None = None,
    ) -> Any:
        """Resume a run from its newest valid checkpoint (or its input).

        The steps recorded after that checkpoint, and the one under way, run again and
        replay their journaled calls; the step a failed run failed in replays them up to its
        first failure and makes that call, and those after it, again. A waiting run goes on
        once its wait is over (its signal stored, its deadline or timer passed); before that
        it raises RunWaiting and nothing runs. A fork has no input to fall back to: without
        a valid checkpoint (its writing stopped between the run and its first commit, or
        every checkpoint is damaged) it raises CheckpointCorruptedError. ``on_request`` is
        awaited again when the run starts from its input and the store says the hook never
        passed (see :func:`~nestegg.checkpoint.admission.request_pending`). A cancelled run
        is reopened only with ``reopen_cancelled`` (RunFinishedError); one cancelled after
        it was read never is. ``named`` is told the run's id once it is read.
        """
        chosen = self.resumed_id(run_id)
        run = await self.get_run_record(chosen)
        if named is not None:
            named(chosen)
        if run.status == COMPLETED:
            check_pipeline(run, self.clutch.name)  # another pipeline's result is not ours
            return run_result(run)
        state, checkpoints = await resume_start(self.store, self.clutch, run, self.config.clock())
        kept = [c.checkpoint_id for c in checkpoints]
        # from its input again, and its on_request never passed as far as the store knows
        request_again = await request_pending(self.store, run, state)
        try:
            return await self._resume(
                run,
                state,
                kept,
                listeners,
                replay_until=run.step_seq + 1,
                request_again=request_again,
                reopen_cancelled=reopen_cancelled,
            )
        except RunFinishedError as refused:  # another process ended it since it was read
            if refused.status != COMPLETED:
                raise
            return run_result(await self.get_run_record(chosen))

    async def resume(
        self,
        checkpoint_id: str,
        listeners: StepListeners,
        *,
        reopen_cancelled: bool = True,
        named: Callable[[str], None] | None = None,
    ) -> Any:
        """Resume the run of ``checkpoint_id`` from that checkpoint.

        The steps recorded after it are dropped with their journaled calls: they run again
        and call again. With no step recorded after it, the step that was under way replays
        its calls, as :meth:`resume_latest` does; a cancelled run too, as there. ``named``
        is told the run's id once it is read.
        """
        record = await self.get_checkpoint_record(checkpoint_id)
        run = await self.get_run_record(record.run_id)
        if named is not None:
            named(run.run_id)
        check_not_owned(run, self.config.clock())
        state = await load_state(self.store, run, record)
        kept = [
            c.checkpoint_id
            for c in await self.store.list_checkpoints(run.run_id)
            if c.seq <= record.seq
        ]
        try:
            later = bool(await self.store.load_steps(run.run_id, record.seq, record.seq + 1))
        except CheckpointCorruptedError:  # recorded, in a damaged block the truncation drops
            later = True
        replay_until = record.seq if later else max(run.step_seq, record.seq) + 1
        return await self._resume(
            run,
            state,
            kept,
            listeners,
            replay_until=replay_until,
            reopen_cancelled=reopen_cancelled,
        )

    def prepare(
        self,
        run: RunRecord,
        state: CheckpointState,
        listeners: StepListeners,
        of_run: str | None = None,
    ) -> PreparedRun:
        """What continues ``run`` from ``state`` (a checkpoint of ``of_run``; None: of
        ``run``): its context and cursor restored and the snapshot its checkpointer starts
        from; checks all that can fail before a write, and writes nothing.

        Raises:
            ConfigurationError: the run is another pipeline's, or the Clutch is inconsistent.
            IncompatibleCheckpointError: an agent the state continues with is gone.
        """
        check_pipeline(run, self.clutch.name)
        self.clutch.validate()
        ctx = self.clutch.new_context(run.run_id, state.data)
        ctx.source = state.source
        ctx.state.turn = state.turn
        if state.stored_history is not None:
            ctx.state.defer_history(state.stored_history.decode)
        ctx.metadata.update(state.metadata)
        cursor = restored_cursor(self.clutch, state, of_run if of_run is not None else run.run_id)
        base = Snapshot(
            state.seq,
            state.turn,
            state.data_seq,
            state.source,
            cursor.position(),
            encode_value(state.metadata, "metadata"),
            encode_value(state.data, "data") if state.data_inline else None,
        )
        return PreparedRun(
            ctx, cursor, base, state.seq, state.data_seq, state.next_agent, listeners
        )

    async def _resume(
        self,
        run: RunRecord,
        state: CheckpointState,
        kept: list[str],
        listeners: StepListeners,
        *,
        replay_until: int,
        request_again: bool = False,
        reopen_cancelled: bool = True,
    ) -> Any:
        """Claim ``run`` and continue it from ``state``: the steps after it are dropped;
        those up to ``replay_until`` keep their journal entries and replay them (a failed
        run's failed step, up to its first failure: see
        :meth:`~nestegg.checkpoint.checkpointer.Checkpointer.journal_entry`). With
        ``request_again``, ``on_request`` is awaited before its first step. Its data is
        checked against the model of the agent it goes to before the claim; a cancelled
        run is reopened only with ``reopen_cancelled``."""
        start = self.prepare(run, state, listeners)
        check_data(self.clutch, start.cursor, state)
        now = self.config.clock()
        # A finished run is reopened on purpose; one read unfinished and finished since by
        # another process is not (RunFinishedError).
        claimed = await claim_to_resume(
            self.store, run, now + self.lease, now, reopen_cancelled=reopen_cancelled
        )
        checkpoint_id = state.checkpoint.checkpoint_id if state.checkpoint else None
        # still running: its owner died mid-run, this process takes it over
        events = resumption(run, checkpoint_id, state.seq, interrupted=run.status == RUNNING)
        return await self.execute(
            claimed,
            start,
            kept,
            events,
            run_input(run),
            truncate_after=state.seq,
            replay_until=replay_until,
            failed_step=run.step_seq + 1 if run.status == FAILED else None,
            request_again=request_again,
        )

    # ------------------------------------------------------------------- forking

    async def fork(
        self,
        checkpoint_id: str,
        data: Any,
        run_id: str | None,
        listeners: StepListeners,
        named: Callable[[str], None] | None = None,
    ) -> Any:
        """Start a new run from ``checkpoint_id`` (with ``data`` replaced unless None) and
        drive it; its result. A fork that raises stores nothing (see forks.py). ``named``
        is told the new run's id once it is stored.

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            RunExistsError: ``run_id`` is taken.
            ConfigurationError: the checkpoint belongs to another pipeline.
        """
        from nestegg.checkpoint.forks import start_fork

        started, start, kept, input_data = await start_fork(
            self, checkpoint_id, data, run_id, listeners
        )
        if named is not None:
            named(started.run_id)
        return await self.execute(started, start, kept, [], input_data)

    async def history(self, run_id: str) -> RunHistory:
        """The run's steps and checkpoints with parents, and the runs forked from it."""
        from nestegg.checkpoint.forks import run_history

        return await run_history(self, run_id)

    # ----------------------------------------------------------------- recovery

    async def recover(self) -> dict[str, Any]:
        """Resume every interrupted run, every waiting run whose deadline passed and every
        waiting run whose signal is stored, concurrently; run id -> result (or the
        exception: RunWaiting for a run that waits again, EventLogDamagedError for a
        waiting run whose event log is torn, left as it was). Runs queued for workers are
        left to them."""
        interrupted = await self.list_resumable()

        async def one(run_id: str) -> Any:  # a run cancelled meanwhile is left alone
            return await self.resume_latest(run_id, StepListeners(), reopen_cancelled=False)

        outcomes = await asyncio.gather(
            *(one(r.run_id) for r in interrupted), return_exceptions=True
        )
        return {
            info.run_id: outcome
            for info, outcome in zip(interrupted, outcomes, strict=True)
            if not isinstance(outcome, RunLockedError)
        }

    # ------------------------------------------------------------------ signals

    async def signal(
        self,
        run_id: str,
        name: str,
        value: Any,
        *,
        replace: bool,
        resume: bool,
        resume_with: Callable[[str], Awaitable[Any]] | None = None,
    ) -> Any:
        """Store a signal for a run; with ``resume``, resume the run if it waits for it:
        here, or by ``resume_with`` (a Clutch with a transport hands it to its workers).

        Returns the run's result when resumed here (None otherwise); raises RunWaiting when
        the resumed run waits again, and EventLogDamagedError, the signal not stored, when
        the run waits, its deadline has not passed and its event log is torn (what it
        waits for is unknown; past its deadline such a run is resumed, its wait over, the
        signal's warning saying that its name could not be checked).
        """
        store = await self.ready()
        clock = self.config.clock
        if resume and (run := await store.get_run(run_id)) is not None:
            await signal_resumes(store, run, name, clock(), f"its signal {name!r} not stored")
        await store_signal(  # a warning when the run waits for something else, or too late
            store,
            run_id,
            name,
            value,
            replace=replace,
            clock=clock,
            pipeline=self.clutch.name,
        )
        if not resume:
            return None
        if not await signal_resumes(store, await self.get_run_record(run_id), name, clock()):
            return None
        try:
            if resume_with is not None:
                return await resume_with(run_id)
            return await self.resume_latest(run_id, StepListeners(), reopen_cancelled=False)
        except RunLockedError:  # another process resumed (or cancelled) it first
            return None
