"""The checkpointer: writes one run's steps, events and checkpoints to its store.

Per step it appends the step record and its events and, when the policy says so, a
small checkpoint record, all in one fenced commit (``durability="sync"``: before the
next step starts). It never rewrites the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, NoReturn

from nestegg.checkpoint.codec import encode_value, seal
from nestegg.checkpoint.formats import (
    CHECKPOINT_HOOK,
    NO_METADATA,
    SELECTOR_HOOK,
    Snapshot,
    checkpoint_body,
    checkpoint_pruned_body,
    checkpoint_saved_body,
    ended_payload,
    failure_body,
    failure_commit,
    failure_detail,
    hook_failure_body,
    journal_error_body,
    journal_result_body,
    journaled_failure,
    parse_journal,
    parse_signal,
    refusal_body,
    step_completed_body,
)
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    JournalRecord,
    StepRecord,
    new_checkpoint_id,
)
from nestegg.checkpoint.run_writer import RunWriter
from nestegg.checkpoint.step_formats import step_body
from nestegg.checkpoint.views import CheckpointInfo
from nestegg.constants import (
    CANCELLED,
    CHECKPOINT_PRUNED,
    CHECKPOINT_SAVED,
    COMMIT_MAX_BYTES,
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
    WAITING,
)
from nestegg.errors import CheckpointCorruptedError, RecordTooLargeError, StaleOwnerError
from nestegg.recording import StepResult, Timed

log = logging.getLogger("nestegg")


class Checkpointer(RunWriter):
    """Records one run in a store by a policy (the Recorder of checkpointed runs): its
    steps, checkpoints, journaled calls, end and waits, in the commits of its
    :class:`~nestegg.checkpoint.run_writer.RunWriter`."""

    # ------------------------------------------------------------------- journal

    async def start(
        self,
        truncate_after: int | None = None,
        journal_after: int | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        """:meth:`RunWriter.start`; the resume of a failed run also drops, in its opening
        commit, the entries of its failed step from the first failure on (see
        :meth:`_redo_failed_step`)."""
        step = self.failed_step
        keeps = journal_after if journal_after is not None else truncate_after
        later = None
        if step is not None and (keeps is None or keeps >= step):
            later = await self._redo_failed_step(step)
        if later is not None and step is not None:
            journal_after = step - 1  # the step's journal goes; its kept entries come back
            if truncate_after is None:  # no step or checkpoint is past the last completed
                truncate_after = step - 1
        await super().start(truncate_after, journal_after, fresh=fresh)
        try:
            for batch in later or ():  # what did not fit in the opening commit
                await self.store.commit(Commit(self.run_id, self.fence, journal=batch))
        except BaseException:  # as when the opening commit fails: no heartbeat left behind
            if self.heartbeat is not None:
                await self.heartbeat.stop()
                self.heartbeat = None
            raise

    async def _redo_failed_step(self, step: int) -> list[list[JournalRecord]] | None:
        """Queue the entries of failed ``step``'s journal up to its first failure for the
        opening commit, which drops the step's whole journal first; None if the step has
        no entry from a failure on (nothing to drop), or one that cannot be read (the step
        meets it when it replays it, and fails as before). Without this, an attempt
        interrupted after it made a failed call again would later replay the failed
        attempt's entries past that call, which another way through the step, taken since,
        meets as a change of its calls. The kept entries that do not fit in the opening
        commit are returned in batches that each fit in one, to be written just after it
        (a crash between loses them: their calls are made again)."""
        records = await self.store.read_journal(self.run_id, step)
        try:
            kept = self._before_first_failure(records)
        except CheckpointCorruptedError:
            return None
        self._journal, self._journal_step = {r.position: r for r in kept}, step
        if len(kept) == len(records):
            return None
        size, batches = self.pending.size(), [self.pending.journal]
        for record in kept:
            size += len(record.body)
            if size > COMMIT_MAX_BYTES and (batches[-1] or len(batches) == 1):
                size = len(record.body)
                batches.append([])
            batches[-1].append(record)
        return batches[1:]

    async def journal_entry(self, step: int, position: int) -> dict[str, Any] | None:
        """The recorded call at ``position`` of ``step`` (only steps that may be re-runs).

        In the step a resumed failed run failed in (:attr:`failed_step`), the calls from
        its first journaled failure on are not replayed: the opening commit dropped their
        entries (:meth:`start`), so they are made again and journaled anew, and the calls
        before it replay. The step's output was never recorded, so nothing after it
        depends on its failed calls, and running it again from its first failure is a
        fresh attempt, deterministic up to there (the calls an outage made fail are made
        once it is over). An interrupted run's step replays its failures, as every
        replayed step does."""
        if step > self.replay_until:
            return None
        if self._journal_step != step:
            records = await self.store.read_journal(self.run_id, step)
            if step == self.failed_step:  # what start() kept (a damaged entry raises here)
                records = self._before_first_failure(records)
            self._journal = {r.position: r for r in records}
            self._journal_step = step
        record = self._journal.get(position)
        if record is None:
            return None
        where = f"journal entry {step}/{position} of run {self.run_id!r}"
        return parse_journal(record.body, where, values=True)

    def _before_first_failure(self, records: list[JournalRecord]) -> list[JournalRecord]:
        """The entries of ``records`` (one step's) made before its first failure, in the
        order of the calls: the selector's (-1, -2, ...), then the agent's (0, 1, ...)."""
        kept = []
        for record in sorted(records, key=_call_order):
            where = f"journal entry {record.step}/{record.position} of run {self.run_id!r}"
            if journaled_failure(record.body, where):
                break
            kept.append(record)
        return kept

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
        """Wait while the store holds back new steps; serve checkpoint() requests made
        from outside the run."""
        if self._admission is not None:
            held = self._admission()
            if held is not None:
                await held
        if self.requests:
            requests, self.requests = self.requests, []
            checkpoint_id = self._add_checkpoint(REASON_MANUAL, self.last_good, None)
            saved, self.saved = self.saved, []  # reported once stored, below
            try:
                await self._commit_or_fail()
                await self._notify_or_fail(saved)
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

    async def _notify_or_fail(self, saved: list[CheckpointInfo]) -> None:
        """Report the stored checkpoints ``saved`` to ``on_checkpoint`` outside a step; if
        it raises, the run fails with its error (:meth:`_hook_failed`)."""
        try:
            await self._notify(saved)
        except Exception as error:
            await self._hook_failed(error)

    async def _hook_failed(self, error: Exception) -> NoReturn:
        """Store the run failed with the error ``on_checkpoint`` raised outside a step
        (``"hook": "on_checkpoint"``), then raise it."""
        await self._stop_with(FAILED, RUN_FAILED, hook_failure_body(error, CHECKPOINT_HOOK))
        raise error

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
        """Record the result, a final checkpoint and the completed status (failed when
        ``on_checkpoint`` raised behind the run: its error is raised)."""
        await self._drain()
        if self.hook_error is not None:
            await self._hook_failed(self.hook_error)
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

    async def step_failed(
        self, seq: int, agent: str | None, error: BaseException, started: float
    ) -> None:
        """Record the failure of step ``seq`` (of ``agent``; None: of the selector picking
        its agent, ``"hook": "selector"``) and a checkpoint of the last good state; status
        failed."""
        if isinstance(error, StaleOwnerError):  # the run is another's now: nothing to record
            await self._stop()
            return
        now = self.clock()
        hook = SELECTOR_HOOK if agent is None else None
        detail = failure_detail(error, agent, seq, started, now, hook=hook)
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

    async def read_signal(self, name: str, by: float | None = None) -> tuple[bool, Any]:
        """Whether the signal ``name`` is stored for this run, stored by ``by`` if given (a
        signal that came after a wait's deadline did not end it; a replaced one counts
        from when its name first came), and its value."""
        for signal in await self.store.read_signals(self.run_id):
            if signal.name == name and signal.came_by(by):
                return True, parse_signal(signal.body, f"signal {name!r} of run {self.run_id!r}")
        return False, None

    def signal_received(self, name: str, timed_out: bool) -> None:
        """Queue the event saying that the wait for ``name`` ended (it came, or timed out),
        after the start of the step it ended in, if that is not written yet."""
        self._take_start(self.pending)
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
            await self.heartbeat.stop()
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


def _call_order(record: JournalRecord) -> tuple[bool, int]:
    """Where ``record``'s call came in its step: the selector's calls (positions -1, -2,
    ...) before the agent's (0, 1, ...)."""
    return record.position >= 0, abs(record.position)
