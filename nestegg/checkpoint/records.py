"""What stores keep: runs, step records, checkpoints, events, journal entries and signals.

Every payload a store keeps is *sealed* bytes (see :mod:`nestegg.checkpoint.codec`): the
store writes them as they are and never looks inside; readers check the checksum.
Times are UNIX seconds (float).
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True, slots=True)
class Owner:
    """The process that executes a run: host, pid and a token of the process's start."""

    host: str
    pid: int
    started: str

    def to_json(self) -> dict[str, Any]:
        """The owner as plain JSON."""
        return {"host": self.host, "pid": self.pid, "started": self.started}

    @classmethod
    def from_json(cls, raw: dict[str, Any] | None) -> Owner | None:
        """An owner from :meth:`to_json`'s form (None stays None)."""
        if not raw:
            return None
        return cls(host=str(raw["host"]), pid=int(raw["pid"]), started=str(raw["started"]))


@dataclass(slots=True)
class RunRecord:
    """A run as stored. ``input``, ``result`` and ``error`` are sealed bytes.

    ``fence`` is the fencing token: it grows by one at every claim, and a write carrying
    an older token is refused. ``step_seq`` is the sequence number of the last step
    record, ``event_seq`` that of the last event.
    """

    run_id: str
    pipeline: str
    status: str
    input: bytes
    created_at: float
    updated_at: float
    fence: int = 1
    owner: Owner | None = None
    lease_until: float | None = None
    result: bytes | None = None
    error: bytes | None = None
    step_seq: int = 0
    event_seq: int = 0
    parent_run: str | None = None
    parent_checkpoint: str | None = None


class StepRecord(NamedTuple):
    """One executed step (append-only): sequence number, agent and sealed body.

    A named tuple, not a dataclass like the other records: resuming a long run builds ten
    thousand of them, at about half the cost.
    """

    run_id: str
    seq: int
    agent: str
    body: bytes


class StepBlock(NamedTuple):
    """Consecutive step records kept as one (see :mod:`nestegg.checkpoint.step_blocks`):
    those with ``first_seq <= seq <= last_seq``.

    ``body`` holds their sealed bodies one after the other, unchanged; ``head`` is sealed
    JSON naming each one's agent, where it ends in ``body`` and where its data is, and the
    checksum of ``body``.
    """

    run_id: str
    first_seq: int
    last_seq: int
    head: bytes
    body: bytes


class CheckpointRecord(NamedTuple):
    """A small record of where a run stands after step ``seq``; body is sealed.

    A named tuple, like :class:`StepRecord`: a step makes one, at a third of a frozen
    dataclass's cost, and the garbage collector stops tracking it once it has outlived
    one young collection (it holds no container).
    """

    checkpoint_id: str
    run_id: str
    seq: int
    created_at: float
    reason: str
    body: bytes


class EventRecord(NamedTuple):
    """One entry of a run's append-only event log; body is sealed.

    A named tuple, like :class:`CheckpointRecord`: a step makes four or five.
    """

    run_id: str
    seq: int
    at: float
    kind: str
    body: bytes


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """The recorded outcome of one durable call: step, position in the step, sealed body."""

    run_id: str
    step: int
    position: int
    body: bytes


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """A signal sent to a run (see :func:`nestegg.wait_for`): its name, when it was stored,
    and its sealed value. A run holds at most one signal per name."""

    run_id: str
    name: str
    at: float
    body: bytes

    def came_by(self, deadline: float | None) -> bool:
        """Whether it came by ``deadline`` (None: there is none), so that a wait for it
        with that deadline receives it; the one rule of a signal's lateness. ``at`` is
        when its name first came: a replacement keeps it."""
        return deadline is None or self.at <= deadline


@dataclass(slots=True)
class Commit:
    """Everything one atomic, fenced write does to a run.

    Applied in this order: check ``fence`` against the stored run (StaleOwnerError if it
    moved on); drop the step records and checkpoints past ``truncate_after`` and the
    journal entries of the steps past ``journal_after`` (None: past ``truncate_after``;
    events stay: their log is append-only); append ``steps``, ``events``, ``journal``,
    ``checkpoints``; delete the checkpoints in ``prune``; then update the run row with the
    fields that are not None.
    """

    run_id: str
    fence: int
    steps: list[StepRecord] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    journal: list[JournalRecord] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    prune: list[str] = field(default_factory=list)
    truncate_after: int | None = None
    journal_after: int | None = None
    """With ``truncate_after``: keep the journal of the steps up to this one (the steps a
    resume runs again and replays); None: up to ``truncate_after``."""
    status: str | None = None
    result: bytes | None = None
    error: bytes | None = None
    lease_until: float | None = None
    step_seq: int | None = None
    event_seq: int | None = None
    updated_at: float = 0.0

    def journal_kept_through(self, after: int) -> int:
        """The last step whose journal entries a truncation after step ``after`` keeps."""
        return after if self.journal_after is None else self.journal_after

    def size(self) -> int:
        """Bytes of the bodies it writes, about."""
        size = len(self.result or b"") + len(self.error or b"")
        for records in (self.steps, self.events, self.journal, self.checkpoints):
            for record in records:  # weighed by every store's commit: kept cheap
                size += len(record.body or b"")
        return size


_counter = itertools.count()
_process_tag = [secrets.token_hex(5)]


def _renew_tag() -> None:
    _process_tag[0] = secrets.token_hex(5)


# A random tag per process, renewed in a forked child, so ids need no system call each.
os.register_at_fork(after_in_child=_renew_tag)


def new_checkpoint_id() -> str:
    """A new checkpoint id: sortable by creation time, unique across processes."""
    millis = time.time_ns() // 1_000_000
    return f"{millis:012x}-{_process_tag[0]}{next(_counter) & 0xFFFFFF:06x}"


def new_run_id() -> str:
    """A new run id: sortable by creation time."""
    millis = time.time_ns() // 1_000_000
    return f"run-{millis:012x}{secrets.token_hex(6)}"
