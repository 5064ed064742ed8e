"""An in-process store: dicts and lists. Fast, gone with the process; doubles as a test fake."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from urllib.parse import urlsplit

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.common import (
    change_set,
    check_size,
    claim_refusal,
    run_exists,
    run_not_found,
    set_run_fields,
    stale_fence,
)
from nestegg.checkpoint.stores.memory_threads import MemoryThreadRows
from nestegg.constants import RUNNING
from nestegg.errors import (
    ConfigurationError,
)
from nestegg.urls import query_problem, without_password


class _RunData:
    __slots__ = ("checkpoints", "events", "journal", "run", "signals", "steps")

    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.steps: dict[int, StepRecord] = {}
        self.checkpoints: dict[str, CheckpointRecord] = {}
        self.events: list[EventRecord] = []
        self.journal: dict[tuple[int, int], JournalRecord] = {}
        self.signals: dict[str, SignalRecord] = {}


class MemoryCheckpointStorage(MemoryThreadRows):
    """Keeps everything in memory, in this process.

    Example:
        >>> clutch = Clutch("p", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))
    """

    def __init__(self) -> None:
        self._runs: dict[str, _RunData] = {}
        self._checkpoint_runs: dict[str, str] = {}

    @classmethod
    def from_url(cls, url: str) -> MemoryCheckpointStorage:
        """A new, empty store for ``memory://``.

        Raises:
            ConfigurationError: the URL's scheme is not ``memory``, or it has a query (the
                store takes no options).
        """
        if urlsplit(url).scheme != "memory":
            raise ConfigurationError(f"not a memory store URL: {url!r} (expected memory://)")
        problem = query_problem(url)
        if problem is not None:
            raise ConfigurationError(f"memory store URL {without_password(url)!r}: {problem}")
        return cls()

    async def setup(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def _data(self, run_id: str) -> _RunData:
        data = self._runs.get(run_id)
        if data is None:
            raise run_not_found(run_id)
        return data

    async def create_run(self, run: RunRecord) -> None:
        if run.run_id in self._runs:
            raise run_exists(run.run_id)
        self._runs[run.run_id] = _RunData(dataclasses.replace(run))

    async def get_run(self, run_id: str) -> RunRecord | None:
        data = self._runs.get(run_id)
        return dataclasses.replace(data.run) if data else None

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        runs = [
            dataclasses.replace(d.run)
            for d in self._runs.values()
            if (pipeline is None or d.run.pipeline == pipeline)
            and (statuses is None or d.run.status in statuses)
            and (before is None or (d.run.created_at, d.run.run_id) < before)
        ]
        runs.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return runs[:limit] if limit is not None else runs

    async def list_forks(self, run_id: str, limit: int | None = None) -> list[RunRecord]:
        """The runs forked from ``run_id``, newest first (a scan: see ``ForkListing``)."""
        forks = [
            dataclasses.replace(d.run) for d in self._runs.values() if d.run.parent_run == run_id
        ]
        forks.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return forks[:limit] if limit is not None else forks

    async def claim_run(
        self,
        run_id: str,
        expected_fence: int,
        owner: Owner,
        lease_until: float,
        now: float,
        *,
        reopen: bool = False,
    ) -> RunRecord:
        run = self._data(run_id).run
        refusal = claim_refusal(run_id, run.fence, run.status, expected_fence, reopen)
        if refusal is not None:
            raise refusal
        run.fence += 1
        run.owner = owner
        run.lease_until = lease_until
        run.status = RUNNING
        run.updated_at = now
        return dataclasses.replace(run)

    async def commit(self, commit: Commit) -> None:
        check_size(commit)
        changes = change_set(commit)
        data = self._data(changes.run_id)
        if data.run.fence != changes.fence:
            raise stale_fence(changes.run_id, data.run.fence, changes.fence)
        if changes.truncate_after is not None and changes.journal_after is not None:
            self._truncate(data, changes.truncate_after, changes.journal_after)
        for step in changes.steps:
            data.steps[step.seq] = step
        data.events.extend(changes.events)
        for entry in changes.journal:
            data.journal[(entry.step, entry.position)] = entry
        for checkpoint in changes.checkpoints:
            data.checkpoints[checkpoint.checkpoint_id] = checkpoint
            self._checkpoint_runs[checkpoint.checkpoint_id] = changes.run_id
        for checkpoint_id in changes.prune:
            if data.checkpoints.pop(checkpoint_id, None) is not None:
                self._checkpoint_runs.pop(checkpoint_id, None)
        set_run_fields(data.run, changes)

    def _truncate(self, data: _RunData, after: int, journal_after: int) -> None:
        data.steps = {seq: s for seq, s in data.steps.items() if seq <= after}
        data.journal = {key: e for key, e in data.journal.items() if key[0] <= journal_after}
        for checkpoint_id, record in list(data.checkpoints.items()):
            if record.seq > after:
                del data.checkpoints[checkpoint_id]
                self._checkpoint_runs.pop(checkpoint_id, None)

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        data = self._runs.get(run_id)
        if data is None:
            return []
        return [
            data.steps[seq]
            for seq in sorted(data.steps)
            if seq > after and (upto is None or seq <= upto)
        ]

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        data = self._runs.get(run_id)
        if data is None:
            return []
        return sorted(data.checkpoints.values(), key=lambda c: (c.seq, c.checkpoint_id))

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        run_id = self._checkpoint_runs.get(checkpoint_id)
        if run_id is None:
            return None
        return self._runs[run_id].checkpoints.get(checkpoint_id)

    async def read_events(
        self, run_id: str, since_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        data = self._runs.get(run_id)
        if data is None:
            return []
        events = [e for e in data.events if e.seq > since_seq]
        return events[:limit] if limit is not None else events

    async def read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        data = self._runs.get(run_id)
        if data is None:
            return []
        return sorted(
            (e for (s, _), e in data.journal.items() if s == step), key=lambda e: e.position
        )

    async def put_signal(self, signal: SignalRecord, replace: bool = False) -> bool:
        data = self._data(signal.run_id)
        if signal.name in data.signals and not replace:
            return False
        data.signals[signal.name] = signal
        return True

    async def read_signals(self, run_id: str) -> list[SignalRecord]:
        data = self._runs.get(run_id)
        return sorted(data.signals.values(), key=lambda s: s.name) if data else []

    async def delete_run(self, run_id: str) -> bool:
        data = self._runs.pop(run_id, None)
        if data is None:
            return False
        for checkpoint_id in data.checkpoints:
            self._checkpoint_runs.pop(checkpoint_id, None)
        return True

    async def delete_checkpoints(self, run_id: str, checkpoint_ids: Sequence[str]) -> int:
        data = self._runs.get(run_id)
        if data is None:
            return 0
        gone = 0
        for checkpoint_id in checkpoint_ids:
            if data.checkpoints.pop(checkpoint_id, None) is not None:
                self._checkpoint_runs.pop(checkpoint_id, None)
                gone += 1
        return gone

    async def expire_runs(
        self, statuses: Sequence[str], updated_before: float, pipeline: str | None = None
    ) -> list[str]:
        expired = [
            run_id
            for run_id, d in self._runs.items()
            if d.run.status in statuses
            and d.run.updated_at < updated_before
            and (pipeline is None or d.run.pipeline == pipeline)
        ]
        for run_id in expired:
            await self.delete_run(run_id)
        return expired
