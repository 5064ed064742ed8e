"""A run's event log as users read it.

A ``step_completed`` event stores only its step's seq: the step's agent, outcome and
duration are its step record's (each fact is stored once). Readers complete the events
from the records here (:func:`step_facts_for`, then
:meth:`~nestegg.checkpoint.views.Event.from_record`); the layouts are
:mod:`~nestegg.checkpoint.formats`'. Events written before hold those facts themselves and
are read as they are.

A resume from a checkpoint before step ``n`` drops the records of the steps after it,
and their next attempts write others (events are never deleted). An event that reported an
attempt whose record was dropped so shows its seq alone: it is followed, in the log, by a
``run_resumed`` event whose seq is lower than its own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from nestegg.checkpoint.formats import completed_step, parse_event
from nestegg.checkpoint.records import EventRecord, StepBlock
from nestegg.checkpoint.step_blocks import StepPiece, unpack_block
from nestegg.checkpoint.step_formats import step_facts
from nestegg.checkpoint.stores.base import CheckpointStorage, load_history
from nestegg.checkpoint.views import Event
from nestegg.constants import RUN_RESUMED, STEP_COMPLETED
from nestegg.errors import CheckpointCorruptedError

StepFacts = dict[int, dict[str, Any]]
"""An event's seq -> the fields but the data of the step record that completes it
(``{"unreadable": …}`` when the record is damaged)."""


async def read_events(store: CheckpointStorage, run_id: str, since_seq: int = 0) -> list[Event]:
    """The run's events after ``since_seq``, ``step_completed`` ones completed from their
    step records.

    Raises:
        CheckpointCorruptedError: an event is damaged.
    """
    records = await store.read_events(run_id, since_seq)
    steps = await step_facts_for(store, run_id, records)
    return [Event.from_record(record, steps.get(record.seq)) for record in records]


async def step_facts_for(
    store: CheckpointStorage, run_id: str, records: Sequence[EventRecord]
) -> StepFacts:
    """The fields of the step records that complete the ``step_completed`` events among
    ``records`` (read in order, the log's newest last), by event: those still holding the
    attempt the event reported. One read of the steps they span; none without such events."""
    reported = _reported_steps(records)
    if not reported:
        return {}
    wanted = set(reported.values())
    pieces = await load_history(store, run_id, min(wanted) - 1, max(wanted))
    by_step: StepFacts = {}
    for piece in pieces:
        _add_facts(by_step, piece, wanted, run_id)
    return {event: by_step[seq] for event, seq in reported.items() if seq in by_step}


def _reported_steps(records: Sequence[EventRecord]) -> dict[int, int]:
    """Event seq -> step seq of the ``step_completed`` events among ``records`` that take
    their facts from the step records, and whose records no later resume dropped."""
    reported: dict[int, int] = {}
    kept_through = math.inf  # the lowest seq a later resume went back to
    for record in reversed(records):
        if record.kind not in (STEP_COMPLETED, RUN_RESUMED):
            continue
        try:
            payload = parse_event(record.body, f"event {record.seq} of run {record.run_id!r}")
        except CheckpointCorruptedError:
            continue  # shown as unreadable by its reader
        if record.kind == RUN_RESUMED:
            seq = payload.get("seq")
            kept_through = min(kept_through, seq if type(seq) is int else -1)
        elif (seq := completed_step(payload)) is not None and seq <= kept_through:
            reported[record.seq] = seq
    return reported


def _add_facts(facts: StepFacts, piece: StepPiece, wanted: set[int], run_id: str) -> None:
    """Add the fields of the records of ``piece`` whose seq is ``wanted``, by step seq."""
    if isinstance(piece, StepBlock):
        try:
            records = unpack_block(piece)
        except CheckpointCorruptedError as error:
            for seq in wanted.intersection(range(piece.first_seq, piece.last_seq + 1)):
                facts[seq] = {"unreadable": str(error)}
            return
    else:
        records = [piece]
    for record in records:
        if record.seq in wanted:
            try:
                facts[record.seq] = step_facts(record.body, f"step {record.seq} of run {run_id!r}")
            except CheckpointCorruptedError as error:
                facts[record.seq] = {"unreadable": str(error)}


__all__ = ["StepFacts", "read_events", "step_facts_for"]
