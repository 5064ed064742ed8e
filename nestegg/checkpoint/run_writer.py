"""RunWriter: the commits of one checkpointed run, the base of its Checkpointer.

It keeps what the next commit carries (the pending commit: events, the step in flight's
start, the run's fields), writes it (``durability="sync"``: before the run goes on;
``"async"``: behind it, in order), keeps the run's lease (the heartbeat) and notes a cancel
from outside. What the commits hold (step records, checkpoints, journal entries, a run's
end or wait) is the Checkpointer's (checkpointer.py).
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
from nestegg.checkpoint.config import CheckpointPolicy
from nestegg.checkpoint.formats import (
    Snapshot,
    event_body,
    step_started_body,
)
from nestegg.checkpoint.heartbeat import Heartbeat, heartbeats
from nestegg.checkpoint.live_starts import LiveStarts, live_starts
from nestegg.checkpoint.records import (
    Commit,
    EventRecord,
    JournalRecord,
    RunRecord,
)
from nestegg.checkpoint.stores.base import CheckpointStorage, StepAdmission
from nestegg.checkpoint.views import CheckpointInfo
from nestegg.constants import (
    STEP_STARTED,
    WAITING,
)
from nestegg.errors import StaleOwnerError

log = logging.getLogger("nestegg")
CheckpointHook = Callable[[CheckpointInfo], Awaitable[None]]


class RunWriter:
    """The commits of one run in a store (the base of the Checkpointer)."""

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
        self._admission = store.step_admission if isinstance(store, StepAdmission) else None
        """What holds the run's next step back while the store's commits pile up."""
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
        self.hook_error: Exception | None = None
        """What ``on_checkpoint`` raised (it is called no more): behind the run
        (``durability="async"``), the run's next flush or its end raises it."""
        self.heartbeat: Heartbeat | None = None
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
        self.failed_step: int | None = None
        """The step a failed run failed in, when this resumes it: its journal replays only
        up to its first failure (see :meth:`Checkpointer.journal_entry`)."""
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
        self.heartbeat = heartbeats().beat(self)

    def _renewal_due_in(self) -> float:
        """The lease is renewed a third of it after it was last set: by a step's commit,
        which sets it too (a run whose steps commit more often sends no renewal), or by the
        last renewal."""
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

    async def _cancel_note(self) -> str | None:
        """What a cancel from outside noted, once a renewal found the run taken."""
        return await cancel_note(self.store, self.run_id)

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
        await self._drain()
        await self.commit(commit)
        await self._notify(saved)

    async def _flush(self) -> None:
        if self.durability == "sync":
            await self._commit_now()
        elif self.durability == "async":
            self._raise_writer_error()
            if self.hook_error is not None:  # fails the step, as in a commit of its own
                raise self.hook_error
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
                    with contextlib.suppress(Exception):  # kept in hook_error, not the store's
                        await self._notify(saved)
            except Exception as error:
                self.writer_error = error
            finally:
                self.queue.task_done()

    async def _drain(self) -> None:
        """Wait until the writes behind the run are stored (and their checkpoints
        reported); raise the store's error if one failed."""
        if self.writer is not None and self.queue is not None:
            await self.queue.join()
            self._raise_writer_error()

    def _raise_writer_error(self) -> None:
        if self.writer_error is not None:
            raise self.writer_error

    async def _notify(self, saved: list[CheckpointInfo]) -> None:
        """Call ``on_checkpoint`` with each of ``saved``, stored; once it raised, its error
        is kept (``hook_error``) and it is called no more."""
        if self.on_checkpoint is not None:
            for info in saved:
                if self.hook_error is not None:
                    return
                try:
                    await self.on_checkpoint(info)
                except Exception as error:
                    self.hook_error = error
                    raise

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
        heartbeat, writer, self.heartbeat, self.writer = self.heartbeat, self.writer, None, None
        try:
            if heartbeat is not None:
                await heartbeat.stop()
        finally:  # also if the renewal under way raised: the write-behind stops too
            if writer is not None:
                await cancel_and_wait(writer)


__all__ = ["CheckpointHook", "RunWriter"]
