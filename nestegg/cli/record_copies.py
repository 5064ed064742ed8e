"""The fields of a run export that copy what a record's sealed body holds.

A step's ``agent`` is also in its step record's body, a checkpoint's ``seq`` in its
checkpoint body; the stores keep the copy beside the body, and readers take it from there
(``nestegg show`` lists a step's agent from it). An import refuses a record whose copy and
body disagree: an edit of the copy alone (one of the body fails its checksum).

The other fields of a record (a step's ``seq``, a checkpoint's id, time and reason, an
event's ``seq``, time and kind, a journal entry's step and position, a signal's name and
time) and the run's fields (its pipeline name among them) are stored outside the bodies
only: there is nothing to compare them with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nestegg.checkpoint.formats import parse_checkpoint
from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.step_formats import step_facts
from nestegg.errors import CheckpointCorruptedError

Parse = Callable[[bytes, str], dict[str, Any]]


def copy_mismatch(commit: Commit) -> str | None:
    """The refusal of the first step whose ``agent``, or checkpoint whose ``seq``, is not
    what its sealed body holds, naming the record (``steps[0]``: its place in the export,
    which the commit keeps), the field and both values; None when every copy agrees (the
    bodies' checksums are checked already)."""
    rid = commit.run_id
    for i, step in enumerate(commit.steps):
        held = _held(step_facts, step.body, f"step {step.seq} of run {rid!r}", "agent")
        if (found := _differs(f"steps[{i}]", "agent", step.agent, held)) is not None:
            return found
    for i, checkpoint in enumerate(commit.checkpoints):
        where = f"checkpoint {checkpoint.checkpoint_id!r} of run {rid!r}"
        held = _held(parse_checkpoint, checkpoint.body, where, "seq")
        if (found := _differs(f"checkpoints[{i}]", "seq", checkpoint.seq, held)) is not None:
            return found
    return None


def _held(parse: Parse, sealed: bytes, where: str, name: str) -> tuple[Any] | None:
    """``(value,)`` of the field ``name`` of the body, None when the body has no such field
    (a body of another shape: nothing to compare)."""
    try:
        body = parse(sealed, where)
    except CheckpointCorruptedError:
        return None
    return (body[name],) if name in body else None


def _differs(at: str, name: str, value: Any, held: tuple[Any] | None) -> str | None:
    if held is None or (type(held[0]), held[0]) == (type(value), value):
        return None
    return f"{at}.{name} {value!r} is not what the record's sealed body holds, {held[0]!r}"
