"""What users read back: runs, checkpoints, restored states and events, decoded."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nestegg.checkpoint.codec import decode_value, unseal_value
from nestegg.checkpoint.formats import completed_event, parse_event, parse_failure
from nestegg.checkpoint.records import CheckpointRecord, EventRecord, RunRecord
from nestegg.checkpoint.step_formats import HistoryEntry
from nestegg.constants import STEP_COMPLETED


def to_datetime(seconds: float | None) -> datetime | None:
    """UNIX seconds as an aware UTC datetime (None stays None)."""
    return datetime.fromtimestamp(seconds, UTC) if seconds is not None else None


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A stored run: status, owner, progress and outcome."""

    run_id: str
    pipeline: str
    status: str
    steps: int
    created_at: datetime
    updated_at: datetime
    owner: dict[str, Any] | None
    lease_until: datetime | None
    fence: int
    parent_run: str | None
    parent_checkpoint: str | None
    error: dict[str, Any] | None

    @classmethod
    def from_record(cls, run: RunRecord) -> RunInfo:
        """The view of a stored run; ``error`` is that of its last failure while it is failed."""
        error = None
        if run.error is not None and run.status == "failed":
            error = parse_failure(run.error, f"error of run {run.run_id!r}")
        return cls(
            run_id=run.run_id,
            pipeline=run.pipeline,
            status=run.status,
            steps=run.step_seq,
            created_at=to_datetime(run.created_at) or datetime.now(UTC),
            updated_at=to_datetime(run.updated_at) or datetime.now(UTC),
            owner=run.owner.to_json() if run.owner else None,
            lease_until=to_datetime(run.lease_until),
            fence=run.fence,
            parent_run=run.parent_run,
            parent_checkpoint=run.parent_checkpoint,
            error=error,
        )


def run_result(run: RunRecord) -> Any:
    """The stored result of a completed run."""
    if run.result is None:
        return None
    return unseal_value(run.result, f"result of run {run.run_id!r}")


def run_input(run: RunRecord) -> Any:
    """The stored input of a run."""
    return unseal_value(run.input, f"input of run {run.run_id!r}")


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A checkpoint's header: id, run, the step it covers, when and why it was taken."""

    checkpoint_id: str
    run_id: str
    seq: int
    created_at: datetime
    reason: str

    @classmethod
    def from_record(cls, record: CheckpointRecord) -> CheckpointInfo:
        """The header of a stored checkpoint."""
        return cls(
            checkpoint_id=record.checkpoint_id,
            run_id=record.run_id,
            seq=record.seq,
            created_at=to_datetime(record.created_at) or datetime.now(UTC),
            reason=record.reason,
        )


@dataclass(frozen=True, slots=True)
class StoredHistory:
    """A run's history as loaded from its step records, each entry's data still JSON.

    Resuming a long run needs its history in place but rarely reads it: the entries are
    decoded when first read (their checksums were checked when they were loaded). An
    entry that cannot be decoded (say, an Enum member that no longer exists) is reported
    then, as CheckpointCorruptedError, and on every later read.
    """

    run_id: str
    first: dict[str, Any]
    """The entry of the run's input, decoded."""
    steps: list[HistoryEntry]
    """``(seq, agent, raw, start, stop)`` of every later entry, in order."""

    def __len__(self) -> int:
        return 1 + len(self.steps)

    def decode(self) -> list[dict[str, Any]]:
        """The entries ``{"source": ..., "data": ...}``, decoded.

        Raises:
            CheckpointCorruptedError: an entry's data is not what nestegg wrote.
        """
        entries = [copy.deepcopy(self.first)]
        for seq, agent, raw, start, stop in self.steps:
            where = f"data of step {seq} of run {self.run_id!r}"
            entries.append({"source": agent, "data": decode_value(raw[start:stop], where)})
        return entries


@dataclass(frozen=True, slots=True)
class CheckpointState:
    """A checkpoint restored: the run's data, history, metadata, turn and what runs next.

    ``checkpoint`` is None for the state a run starts from (its input).
    """

    run_id: str
    checkpoint: CheckpointInfo | None
    seq: int
    turn: int
    data: Any
    source: str
    data_seq: int
    stored_history: StoredHistory | None
    """The history before the current data; None when there is none."""
    metadata: dict[str, Any]
    position: dict[str, Any] | None
    next_agent: str | None
    data_inline: bool = False

    @property
    def history(self) -> list[dict[str, Any]]:
        """The history entries before the current data, decoded (on every call)."""
        return self.stored_history.decode() if self.stored_history is not None else []

    def to_json(self) -> dict[str, Any]:
        """The state as plain data (for printing and diffing)."""
        return {
            "run_id": self.run_id,
            "checkpoint_id": self.checkpoint.checkpoint_id if self.checkpoint else None,
            "seq": self.seq,
            "turn": self.turn,
            "source": self.source,
            "data": self.data,
            "metadata": self.metadata,
            "history": self.history,
            "position": self.position,
            "next_agent": self.next_agent,
        }


@dataclass(frozen=True, slots=True)
class Event:
    """One entry of a run's event log."""

    run_id: str
    seq: int
    at: datetime
    kind: str
    data: dict[str, Any]

    @classmethod
    def from_record(cls, record: EventRecord, step: dict[str, Any] | None = None) -> Event:
        """The view of a stored event; a ``step_completed`` event takes its step's agent,
        outcome and duration from ``step``, the fields of the step record that completes it
        (see :mod:`~nestegg.checkpoint.event_log`; None: its payload as stored).

        Raises:
            CheckpointCorruptedError: the event is damaged.
        """
        data = parse_event(record.body, f"event {record.seq} of run {record.run_id!r}")
        if step is not None and record.kind == STEP_COMPLETED:
            data = completed_event(data, step)
        return cls(
            run_id=record.run_id,
            seq=record.seq,
            at=to_datetime(record.at) or datetime.now(UTC),
            kind=record.kind,
            data=data,
        )


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One executed step of a run: agent, outcome and timing."""

    seq: int
    agent: str
    outcome: str
    started: datetime
    duration: float
    produced_data: bool


@dataclass(frozen=True, slots=True)
class HistoryCheckpoint:
    """A checkpoint in a run's tree: ``parent_id`` is the checkpoint before it (for the
    first checkpoint of a fork: the checkpoint it was forked from, in the parent run)."""

    info: CheckpointInfo
    parent_id: str | None


@dataclass(frozen=True, slots=True)
class RunHistory:
    """A run's steps and checkpoints with their parents, and the runs forked from it."""

    run: RunInfo
    steps: list[StepInfo]
    checkpoints: list[HistoryCheckpoint]
    forks: list[RunInfo]
