"""The checkpointer: writes one run's steps, events and checkpoints to its store.

Per step it appends the step record and its events and, when the policy says so, a
small checkpoint record, all in one fenced commit (``durability="sync"``: before the
next step starts). It never rewrites the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from nestegg import telemetry
from nestegg.cancellation import CancelWatch, cancel_and_wait
from nestegg.checkpoint.cancels import cancel_note
from nestegg.checkpoint.codec import encode_value, seal
from nestegg.checkpoint.config import CheckpointPolicy
from nestegg.checkpoint.formats import (
    NO_METADATA,
    Snapshot,
    checkpoint_body,
    checkpoint_pruned_body,
    checkpoint_saved_body,
    ended_payload,
    event_body,
    failure_body,
    failure_commit,
    failure_detail,
    journal_error_body,
    journal_result_body,
    parse_journal,
    parse_signal,
    refusal_body,
    step_completed_body,
    step_started_body,
)
from nestegg.checkpoint.heartbeat import keep_leased
from nestegg.checkpoint.live_starts import LiveStarts, live_starts
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    RunRecord,
    StepRecord,
    new_checkpoint_id,
)
from nestegg.checkpoint.step_formats import step_body
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.views import CheckpointInfo
from nestegg.constants import (
    CANCELLED,
    CHECKPOINT_PRUNED,
    CHECKPOINT_SAVED,
    COMPLETED,
    FAILED,
    FINISHED,
    NO_DEADLINE,
    REASON_FINAL,
    REASON_MANUAL,
    REASON_POLICY,
    RUN_CANCELLED,
    RUN_COMPLETED,
    RUN_FAILED,
    RUN_WAITING,
    SIGNAL_RECEIVED,
    STEP_COMPLETED,
    STEP_FAILED,
    STEP_STARTED,
    WAITING,
)
from nestegg.errors import RecordTooLargeError, StaleOwnerError
from nestegg.recording import StepResult, Timed

log = logging.getLogger("nestegg")
CheckpointHook = Callable[[CheckpointInfo], Awaitable[None]]


class Checkpointer:
    """Records one run in a store by a policy (the Recorder of checkpointed runs)."""

    RENEWAL_FAILURES: tuple[type[Exception], ...] = (Exception,)
    """What a failed renewal of the lease raises that the heartbeat logs and outlives (the
    next step's commit reports store failures)."""

    def __init__(
        self,
        store: CheckpointStorage,
        policy: CheckpointPolicy,
        run: RunRecord,
        *,
        lease_seconds: float,
        base: Snapshot,
        kept: list[str],
        on_checkpoint: CheckpointHook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.clock = clock
        self.commit = telemetry.timed_commit(store)
        self.policy = policy
        self.run_id = run.run_id
        self.pipeline = run.pipeline
        self.fence = run.fence
        self.event_seq = run.event_seq
        self.lease_seconds = lease_seconds
        self.on_checkpoint = on_checkpoint
        self.last_good = base
        self.kept: deque[str] = deque(kept)
        self.checkpointed_seq = base.seq if kept else -1
        self.since_checkpoint = 0
        self.last_policy_at = 0.0
        self.pending = Commit(self.run_id, self.fence)
        self.saved: list[CheckpointInfo] = []
        self.requests: list[asyncio.Future[str]] = []
        self.queue: asyncio.Queue[tuple[Commit, list[CheckpointInfo]]] | None = None
        self.writer: asyncio.Task[None] | None = None
        self.writer_error: BaseException | None = None
        self.heartbeat: asyncio.Task[None] | None = None
        self._leased_at = time.monotonic()
        """When the lease was last set (monotonic): the heartbeat renews it a third of the
        lease later."""
        self.every = policy.every_n_steps
        self.on_agents = frozenset(policy.on_agent_complete or ())
        self.min_interval = policy.min_interval.total_seconds() if policy.min_interval else 0.0
        self.durability = policy.durability
        self.journals = True
        self.keeps_position = True
        self.replay_until = 0
        self._journal_step = -1
        self._journal: dict[int, JournalRecord] = {}
        self._unstarted: int | None = None
        """The seq of the step in flight whose start event is not written yet."""
        self._unstarted_agent = ""
        self._unstarted_at = 0.0
        self._stopped = False
        self._start_commit: asyncio.Task[None] | None = None
        self._starts: LiveStarts | None = None
        self._opening = False
        """Whether the pending commit holds a fresh run's opening, not written yet."""
        self._taken: StaleOwnerError | None = None
        """What a lease renewal got when another process had taken the run (a cancel from
        outside): the next step boundary raises it, also when no commit goes out there."""

    # ------------------------------------------------------------------ plumbing

    def event(self, kind: str, at: float, payload: dict[str, Any]) -> None:
        """Queue an event for the next commit."""
        self._queue_event(kind, at, event_body(payload))

    def _queue_event(self, kind: str, at: float, body: bytes) -> None:
        self.event_seq += 1
        self.pending.events.append(EventRecord(self.run_id, self.event_seq, at, kind, body))

    async def start(
        self,
        truncate_after: int | None = None,
        journal_after: int | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """Write the opening commit (queued events; on resume, the truncation, which keeps
        the journal through step ``journal_after``) and start the heartbeat.

        A ``fresh`` run's opening (its events only: the run is stored already) is not
        written on its own with ``durability="sync"``: it goes with the run's first write,
        the first step's start published while it runs, its first journaled call or its
        first step's commit, whichever comes first. One write fewer per run started."""
        self.pending.truncate_after = truncate_after
        self.pending.journal_after = journal_after
        if fresh and truncate_after is None and self.durability == "sync":
            self._opening = True
        else:
            await self._commit_now()
        self.heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        """Renew the lease a third of it after it was last set: by a step's commit, which
        sets it too (a run whose steps commit more often sends no renewal), or by the last
        renewal."""
        await keep_leased(
            self.run_id,
            self._renewal_due_in,
            self._renew,
            self.RENEWAL_FAILURES,
            lambda: cancel_note(self.store, self.run_id),
        )

    def _renewal_due_in(self) -> float:
        return self._leased_at + self.lease_seconds / 3 - time.monotonic()

    async def _renew(self) -> bool:
        """Renew the lease once; True: renew it again when due."""
        self._leased_at = time.monotonic()
        lease = self.clock() + self.lease_seconds
        try:
            await self.store.commit(Commit(self.run_id, self.fence, lease_until=lease))
        except StaleOwnerError as taken:
            self._taken = taken
            raise
        return True

    def _raise_if_taken(self) -> None:
        """Raise the StaleOwnerError a lease renewal got: the run is another process's now
        (with ``durability="exit"`` no step's commit would tell, until the run's end)."""
        if self._taken is not None:
            raise self._taken

    # ------------------------------------------------------- the step in flight

    @property
    def _live(self) -> bool:
        """Whether a commit may go out during a step: in sync mode nothing else is pending
        then but a fresh run's opening, which that commit takes along, so events written
        now keep their order in the store."""
        return self.durability == "sync" and (self._opening or not self.pending.events)

    def step_started(self, seq: int, agent: str, started: float) -> None:
        """Note that step ``seq`` started. Its ``step_started`` event is committed with the
        step's first journaled call, or on its own ``LIVE_STEP_DELAY`` after the start,
        whichever comes first (sync durability), else with the step's end.

        Raises StaleOwnerError, the step not started, when the run was taken meanwhile."""
        self._raise_if_taken()
        self._unstarted, self._unstarted_agent, self._unstarted_at = seq, agent, started
        if self.durability == "sync":  # one timer for all runs, not one a step
            starts = self._starts
            if starts is None:  # a checkpointer lives on one loop
                starts = self._starts = live_starts()
            starts.add(self, seq)

    def _take_start(self, commit: Commit) -> None:
        """Move the in-flight step's start event, not written yet, into ``commit``."""
        seq = self._unstarted
        if seq is None:
            return
        self._unstarted = None
        self.event_seq += 1
        body = step_started_body(seq, self._unstarted_agent)
        at = self._unstarted_at
        commit.events.append(EventRecord(self.run_id, self.event_seq, at, STEP_STARTED, body))
        commit.event_seq = self.event_seq

    def publish_start(self, seq: int) -> None:
        """Commit the start of step ``seq`` now if it is still in flight (LiveStarts calls
        this ``LIVE_STEP_DELAY`` after it started)."""
        if self._unstarted != seq or self._stopped:
            return
        if self._start_commit is None and self._live:
            commit = self._side_commit()
            self._take_start(commit)
            self._start_commit = asyncio.get_running_loop().create_task(self._send(commit))

    async def _send(self, commit: Commit) -> None:
        try:
            await self.store.commit(commit)
        except Exception as error:  # the step's own commit carries the event instead
            log.warning(
                "could not record the start of a step of run %r: %s",
                self.run_id,
                error,
                extra={"run_id": self.run_id},
            )
            self.pending.events[:0] = commit.events

    async def _settle_start(self) -> None:
        """Wait for the start commit in flight, so that it lands before what follows."""
        task = self._start_commit
        if task is not None:
            await asyncio.shield(task)
            if self._start_commit is task:
                self._start_commit = None

    def _side_commit(self) -> Commit:
        """A commit besides the step's own (a start, a journaled call): the pending one if
        it holds a fresh run's opening, else a new one."""
        return self._take_pending() if self._opening else Commit(self.run_id, self.fence)

    def _take_pending(self) -> Commit:
        self._opening = False
        commit, self.pending = self.pending, Commit(self.run_id, self.fence)
        now = self.clock()
        commit.updated_at = now
        if commit.status != WAITING:  # a waiting run's lease_until is when its wait ends
            commit.lease_until = now + self.lease_seconds
            if self.durability == "sync":  # written before the run goes on: no renewal due
                self._leased_at = time.monotonic()
        commit.event_seq = self.event_seq
        return commit

    def _commit_now(self) -> Awaitable[None]:
        """Write everything pending; the awaitable that waits until it is stored.

        A step's commit, with no start commit in flight, no checkpoint to report and no
        write-behind queue, is the store's own awaitable: no coroutine of this class
        stays suspended with it (with thousands of runs at once each one is a container
        more for the garbage collector to carry)."""
        if self._start_commit is None and not self.saved and self.writer is None:
            return self.commit(self._take_pending())
        return self._commit_in_order()

    async def _commit_in_order(self) -> None:
        """:meth:`_commit_now` after the start commit in flight and the queued writes,
        reporting the checkpoints it stores."""
        if self._start_commit is not None:
            await self._settle_start()
        commit = self._take_pending()
        saved, self.saved = self.saved, []
        if self.writer is not None and self.queue is not None:
            await self.queue.join()
            self._raise_writer_error()
        await self.commit(commit)
        await self._notify(saved)

    async def _flush(self) -> None:
        if self.durability == "sync":
            await self._commit_now()
        elif self.durability == "async":
            self._raise_writer_error()
            if self.queue is None:
                self.queue = asyncio.Queue()
                self.writer = asyncio.get_running_loop().create_task(self._write_behind())
            saved, self.saved = self.saved, []
            self.queue.put_nowait((self._take_pending(), saved))

    async def _write_behind(self) -> None:
        assert self.queue is not None
        stop = CancelWatch()
        while not stop.requested():  # stopped, also if a library lost the cancellation
            commit, saved = await self.queue.get()
            try:
                if self.writer_error is None:
                    await self.commit(commit)
                    await self._notify(saved)
            except Exception as error:
                self.writer_error = error
            finally:
                self.queue.task_done()

    def _raise_writer_error(self) -> None:
        if self.writer_error is not None:
            raise self.writer_error

    async def _notify(self, saved: list[CheckpointInfo]) -> None:
        if self.on_checkpoint is not None:
            for info in saved:
                await self.on_checkpoint(info)

    @property
    def ended(self) -> bool:
        """Whether the attempt's end (completed, failed, cancelled, waiting) was recorded,
        or the attempt given up on (:meth:`abandon`): nothing more is written."""
        return self._stopped

    async def abandon(self) -> None:
        """Stop the heartbeat of an attempt that ended before recording its end (the store
        failed before its first step): the run stays running, resumable once its owner
        is gone, instead of having its lease renewed as long as the process lives."""
        await self._stop()

    async def _stop(self) -> None:
        self._stopped = True
        with contextlib.suppress(Exception):
            await self._settle_start()
        for task in (self.heartbeat, self.writer):
            if task is not None:
                await cancel_and_wait(task)
        self.heartbeat = self.writer = None

    # ------------------------------------------------------------------- journal

    async def journal_entry(self, step: int, position: int) -> dict[str, Any] | None:
        """The recorded call at ``position`` of ``step`` (only steps that may be re-runs)."""
        if step > self.replay_until:
            return None
        if self._journal_step != step:
            records = await self.store.read_journal(self.run_id, step)
            self._journal = {r.position: r for r in records}
            self._journal_step = step
        record = self._journal.get(position)
        if record is None:
            return None
        where = f"journal entry {step}/{position} of run {self.run_id!r}"
        return parse_journal(record.body, where, values=True)

    async def journal_result(
        self, step: int, position: int, function: str, digest: str, result: Any, timed: Timed
    ) -> None:
        """Commit a call's result, when it began and how long it took to the journal now."""
        value = encode_value(result, f"result of {function}")
        body = journal_result_body(function, digest, value, *timed)
        await self._journal_commit(step, position, body)

    async def journal_error(
        self, step: int, position: int, function: str, digest: str, error: Exception, timed: Timed
    ) -> None:
        """Commit a call's final failure (type and message), when it began and how long it
        took to the journal now."""
        await self._journal_commit(
            step, position, journal_error_body(function, digest, error, *timed)
        )

    async def _journal_commit(self, step: int, position: int, sealed: bytes) -> None:
        """Commit a journal entry now, or in exit mode with the run's end, as its step (a
        kill loses both: the resumed run makes the call again)."""
        record = JournalRecord(self.run_id, step, position, sealed)
        if self.durability == "exit":
            self.pending.journal.append(record)
        else:
            await self._write_journal(record)
        if self._journal_step == step:
            self._journal[position] = record

    async def _write_journal(self, record: JournalRecord) -> None:
        """Commit ``record`` now; in sync mode with the step's start when that is not
        written yet, so that the live views show the step with its first call."""
        if self._unstarted is not None and self._live:
            await self._settle_start()
            commit = self._side_commit()
            self._take_start(commit)
        else:
            commit = self._side_commit()
        commit.journal.append(record)
        if commit.events:
            await self._commit_events_aside(commit)
        else:
            await self.store.commit(commit)

    async def _commit_events_aside(self, commit: Commit) -> None:
        """Write ``commit``, which carries events, beside the step's own commit: if it
        fails, its events go with the step's end instead. Cancelled meanwhile, the write
        goes on, since it may be stored already: the next commit waits for its outcome
        (as for a start commit in flight), so that its events are written once."""
        write = asyncio.ensure_future(self.store.commit(commit))
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            if not write.done():
                self._start_commit = asyncio.ensure_future(self._events_written(write, commit))
            elif write.cancelled() or write.exception() is not None:
                self.pending.events[:0] = commit.events
            raise
        except Exception:
            self.pending.events[:0] = commit.events
            raise

    async def _events_written(self, write: asyncio.Future[None], commit: Commit) -> None:
        """Wait for ``write``; if it failed, give its events back to the pending commit."""
        try:
            await write
        except Exception:  # the next commit reports store failures
            self.pending.events[:0] = commit.events
        except asyncio.CancelledError:
            self.pending.events[:0] = commit.events
            raise

    # -------------------------------------------------------------- checkpoints

    def _add_checkpoint(self, reason: str, state: Snapshot, next_agent: str | None) -> str:
        now = self.clock()
        checkpoint_id = new_checkpoint_id()
        body = seal(checkpoint_body(state, next_agent))
        record = CheckpointRecord(checkpoint_id, self.run_id, state.seq, now, reason, body)
        pending = self.pending
        pending.checkpoints.append(record)
        saved = checkpoint_saved_body(checkpoint_id, state.seq, reason)
        self._queue_event(CHECKPOINT_SAVED, now, saved)
        kept = self.kept
        kept.append(checkpoint_id)
        keep = self.policy.keep_latest
        if keep is not None and len(kept) > keep:
            pruned = [kept.popleft() for _ in range(len(kept) - keep)]
            pending.prune.extend(pruned)
            self._queue_event(CHECKPOINT_PRUNED, now, checkpoint_pruned_body(pruned))
        self.checkpointed_seq = state.seq
        self.since_checkpoint = 0
        if self.on_checkpoint is not None:
            self.saved.append(CheckpointInfo.from_record(record))
        return checkpoint_id

    def _policy_due(self, agent: str, now: float) -> bool:
        if self.durability == "exit":
            return False
        if self.since_checkpoint < self.every and agent not in self.on_agents:
            return False
        return not self.min_interval or now - self.last_policy_at >= self.min_interval

    # ------------------------------------------------------------ Recorder API

    def encode_output(self, value: Any) -> bytes | None:
        """The step output as stored JSON (raises CheckpointSerializationError)."""
        return encode_value(value, "data")

    def record_step(self, step: StepResult) -> Awaitable[None]:
        """Append the step record and events; checkpoint when due; commit by durability
        (the returned awaitable is the commit: await it at once). Raises StaleOwnerError,
        the step not recorded, when the run was taken meanwhile."""
        self._raise_if_taken()
        metadata = encode_value(step.metadata, "metadata") if step.metadata else NO_METADATA
        now = self.clock()
        seq, agent, pending = step.seq, step.agent, self.pending
        body = step_body(agent, step.outcome, step.target, step.started, step.duration, step.output)
        pending.steps.append(StepRecord(self.run_id, seq, agent, body))
        pending.step_seq = seq
        if self._unstarted is not None:
            self._take_start(pending)
        self._queue_event(STEP_COMPLETED, now, step_completed_body(seq))  # the rest: the record
        inline = None if step.data_seq == seq else self.last_good.inline_data
        self.last_good = Snapshot(
            seq, step.turn, step.data_seq, step.source, step.position, metadata, inline
        )
        self.since_checkpoint += 1
        if self._policy_due(agent, now):
            self.last_policy_at = now
            self._add_checkpoint(REASON_POLICY, self.last_good, None)
        if self.durability == "sync":  # one coroutine less per step than _flush()
            return self._commit_now()
        return self._flush()

    async def boundary(self) -> None:
        """Serve checkpoint() requests made from outside the run."""
        if self.requests:
            requests, self.requests = self.requests, []
            checkpoint_id = self._add_checkpoint(REASON_MANUAL, self.last_good, None)
            try:
                await self._commit_or_fail()
            except Exception as error:  # the requests get the error the run stops with
                if isinstance(error, RecordTooLargeError):  # stored failed: it ends here
                    await self._stop()
                for request in requests:
                    if not request.done():
                        request.set_exception(error)
                raise
            for request in requests:
                if not request.done():
                    request.set_result(checkpoint_id)

    async def checkpoint_now(self, reason: str, pending_agent: str | None) -> str:
        """A checkpoint now (from inside an agent) or at the next step boundary (outside)."""
        if reason == REASON_MANUAL:
            request: asyncio.Future[str] = asyncio.get_running_loop().create_future()
            self.requests.append(request)
            return await request
        checkpoint_id = self._add_checkpoint(reason, self.last_good, pending_agent)
        try:
            await self._commit_now()
        except BaseException:  # its lease was not stored: the heartbeat renews it when due
            self._leased_at = 0.0
            raise
        return checkpoint_id

    async def finish(self, result: Any, data_seq: int) -> None:
        """Record the result, a final checkpoint and the completed status."""
        final_result = seal(encode_value(result, "result"))
        if self.last_good.seq != self.checkpointed_seq or not self.kept:
            self._add_checkpoint(REASON_FINAL, self.last_good, None)
        checkpoint_id = self.kept[-1]
        self.event(RUN_COMPLETED, self.clock(), ended_payload(self.last_good.seq))
        self.pending.status = COMPLETED
        self.pending.result = final_result
        try:
            await self._commit_or_fail()
        finally:
            await self._stop()
        for request in self.requests:
            if not request.done():
                request.set_result(checkpoint_id)
        await self._expire()

    async def step_failed(self, seq: int, agent: str, error: BaseException, started: float) -> None:
        """Record the failure and a checkpoint of the last good state; status failed."""
        if isinstance(error, StaleOwnerError):  # the run is another's now: nothing to record
            await self._stop()
            return
        now = self.clock()
        detail = failure_detail(error, agent, seq, started, now)
        self._take_start(self.pending)
        self.event(STEP_FAILED, now, detail)
        await self._stop_with(FAILED, RUN_FAILED, failure_body(detail, error))

    async def request_failed(self, error: Exception) -> None:
        """Record that the run's ``on_request`` hook raised ``error`` before its steps:
        status failed, with the hook's error (a resume from its input awaits it again)."""
        await self._stop_with(FAILED, RUN_FAILED, refusal_body(error))

    async def cancelled(self) -> None:
        """Record the cancellation (after the start of the step under way, if not written
        yet) and a checkpoint of the last good state."""
        self._take_start(self.pending)
        await self._stop_with(CANCELLED, RUN_CANCELLED, None)

    async def _stop_with(self, status: str, kind: str, error: bytes | None) -> None:
        if self.durability == "exit" or self.last_good.seq != self.checkpointed_seq:
            self._add_checkpoint(REASON_FINAL, self.last_good, None)
        self.event(kind, self.clock(), ended_payload(self.last_good.seq))
        self.pending.status = status
        self.pending.error = error
        try:
            await self._commit_now()
        except Exception as failure:  # keep the original error; the run stays resumable
            if isinstance(failure, RecordTooLargeError) and status == FAILED and error:
                await self._fail_alone(error)  # failed all the same, not resumable
            log.warning(
                "could not record the %s status of run %r: %s",
                status,
                self.run_id,
                failure,
                extra={"run_id": self.run_id},
            )
        finally:
            await self._stop()
        for request in self.requests:
            if not request.done():
                request.cancel()

    async def _commit_or_fail(self) -> None:
        """Commit everything pending (with ``durability="exit"``: all the run piled up);
        refused as too large, store the run failed alone with the refusal, then raise it."""
        try:
            await self._commit_now()
        except RecordTooLargeError as error:
            await self._fail_alone(failure_body(failure_detail(error, None), error))
            raise

    async def _fail_alone(self, error: bytes) -> None:
        """Store the run failed with the sealed ``error`` after its last commit was refused
        as too large (what ``durability="exit"`` piled up: more than a store takes at
        once): the run's end alone, after what is stored of it (the refused records are
        lost, as in a kill), so that it is not left running, to be resumed into the same
        refusal."""
        with contextlib.suppress(Exception):  # the caller raises the refusal
            stored = await self.store.get_run(self.run_id)
            if stored is not None and stored.fence == self.fence:
                await self.commit(failure_commit(stored, self.clock(), error))

    # ---------------------------------------------------------------- waiting

    async def read_signal(self, name: str) -> tuple[bool, Any]:
        """Whether the signal ``name`` is stored for this run, and its value."""
        for signal in await self.store.read_signals(self.run_id):
            if signal.name == name:
                return True, parse_signal(signal.body, f"signal {name!r} of run {self.run_id!r}")
        return False, None

    def signal_received(self, name: str, timed_out: bool) -> None:
        """Queue the event saying that the wait for ``name`` ended (it came, or timed out)."""
        self.event(SIGNAL_RECEIVED, self.clock(), {"signal": name, "timed_out": timed_out})

    async def suspend(self, signal: str | None, deadline: float | None) -> None:
        """Store the run as waiting, with a checkpoint of the last good state; the step
        under way keeps its journal. The ``run_waiting`` event is the commit's last."""
        self._take_start(self.pending)
        if self.durability == "exit" or self.last_good.seq != self.checkpointed_seq:
            self._add_checkpoint(REASON_FINAL, self.last_good, None)
        payload = {"signal": signal, "deadline": deadline, "steps": self.last_good.seq}
        self.event(RUN_WAITING, self.clock(), payload)
        self.pending.status = WAITING
        self.pending.lease_until = NO_DEADLINE if deadline is None else deadline
        if self.heartbeat is not None:  # a renewal after this commit would move the deadline
            await cancel_and_wait(self.heartbeat)
            self.heartbeat = None
        try:
            await self._commit_or_fail()
        finally:
            await self._stop()
        for request in self.requests:
            if not request.done():
                request.cancel()

    async def _expire(self) -> None:
        if self.policy.ttl is None:
            return
        cutoff = self.clock() - self.policy.ttl.total_seconds()
        try:
            await self.store.expire_runs(FINISHED, cutoff, self.pipeline)
        except Exception as error:
            log.warning("expiring old runs failed: %s", error)
