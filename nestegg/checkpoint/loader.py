"""Loading a run's state: a checkpoint plus the step records up to its sequence number.

Every record's checksum is checked (a block's checksum checks all its records). A torn
or altered checkpoint or step record makes that checkpoint unusable; :func:`load_latest`
then falls back to the newest valid one (or to the run's input) with a
:class:`CheckpointFallbackWarning`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from itertools import groupby
from operator import attrgetter

from nestegg.checkpoint.bulk import collector_paused
from nestegg.checkpoint.codec import all_intact, decode_value, rebuild, unseal
from nestegg.checkpoint.formats import (
    HistoryEntry,
    block_entries,
    parse_checkpoint,
    record_entries,
    step_data,
)
from nestegg.checkpoint.records import CheckpointRecord, RunRecord, StepBlock, StepRecord
from nestegg.checkpoint.step_blocks import (
    StepPiece,
    block_where,
    body_intact,
    read_head,
    step_records,
    unpack_block,
)
from nestegg.checkpoint.stores.base import CheckpointStorage, load_history
from nestegg.checkpoint.views import (
    CheckpointInfo,
    CheckpointState,
    StoredHistory,
    run_input,
)
from nestegg.errors import CheckpointCorruptedError, CheckpointFallbackWarning

log = logging.getLogger("nestegg")


def initial_state(run: RunRecord) -> CheckpointState:
    """The state a run starts from: its input, before any step."""
    return CheckpointState(
        run_id=run.run_id,
        checkpoint=None,
        seq=0,
        turn=0,
        data=run_input(run),
        source="input",
        data_seq=0,
        stored_history=None,
        metadata={},
        position=None,
        next_agent=None,
    )


def _history_entries(pieces: Sequence[StepPiece], run_id: str) -> list[HistoryEntry]:
    """The history entries of the steps that hold data, every checksum checked.

    The hot part of a resume (ten thousand records for a 10,000-step run). A block's
    records are checked at once by its checksum; loose records, when intact and in the
    checkpointer's layout, which is the rule, by checks that run in C over all of them
    (``map``). Neither is decoded or copied: an entry keeps the record or block and where
    its data JSON lies in it, sliced when the history is decoded. Otherwise the records
    are read one by one, which names the damaged one.
    """
    entries: list[HistoryEntry] = []
    with collector_paused():
        for kind, group in groupby(pieces, type):
            if kind is StepBlock:
                for block in group:
                    entries += _block_entries(block)  # type: ignore[arg-type]
            else:
                entries += _record_entries(list(group), run_id)  # type: ignore[arg-type]
    return entries


def _record_entries(records: list[StepRecord], run_id: str) -> list[HistoryEntry]:
    """The entries of loose step records (see _history_entries)."""
    bodies = [record.body for record in records]
    if all_intact(bodies):
        seqs, agents = map(attrgetter("seq"), records), map(attrgetter("agent"), records)
        entries = record_entries(seqs, agents, bodies)
        if entries is not None:
            return entries
    return [entry for record in records if (entry := _entry(record, run_id)) is not None]


def _block_entries(block: StepBlock) -> list[HistoryEntry]:
    """The entries of a block of step records (see _history_entries)."""
    head = read_head(block)
    if not body_intact(block, head):
        _record_entries(unpack_block(block, head), block.run_id)  # names a damaged record
        raise CheckpointCorruptedError(f"{block_where(block)} failed their block's checksum")
    return block_entries(block.first_seq, head.agents, block.body, head.ends, head.data_keys)


def _entry(record: StepRecord, run_id: str) -> HistoryEntry | None:
    """The entry of one record, or None if it holds no data; raises if it is damaged."""
    where = f"step {record.seq} of run {run_id!r}"
    data = step_data(unseal(record.body, where), where)
    return None if data is None else (record.seq, record.agent, data, 0, None)


async def load_state(
    store: CheckpointStorage, run: RunRecord, checkpoint: CheckpointRecord
) -> CheckpointState:
    """The run's state at ``checkpoint``.

    Every step record's checksum is checked; the history entries are decoded when first
    read (see :class:`StoredHistory`), the current data now.

    Raises:
        CheckpointCorruptedError: the checkpoint or a step record it needs is damaged
            or missing.
    """
    state, _ = await _load(store, run, checkpoint)
    return state


async def load_state_and_steps(
    store: CheckpointStorage, run: RunRecord, checkpoint: CheckpointRecord
) -> tuple[CheckpointState, list[StepRecord]]:
    """:func:`load_state`, with the step records it read (those up to ``checkpoint``),
    for a caller that copies them (a fork): read once, not twice."""
    state, pieces = await _load(store, run, checkpoint)
    return state, step_records(pieces)


async def _load(
    store: CheckpointStorage, run: RunRecord, checkpoint: CheckpointRecord
) -> tuple[CheckpointState, Sequence[StepPiece]]:
    where = f"checkpoint {checkpoint.checkpoint_id!r} of run {run.run_id!r}"
    body = parse_checkpoint(checkpoint.body, where)
    try:
        seq, turn = int(body["seq"]), int(body["turn"])
        metadata = rebuild(body.get("metadata") or {}, where)
    except (KeyError, TypeError, ValueError):
        raise CheckpointCorruptedError(f"{where} lacks its fields") from None
    pieces = await load_history(store, run.run_id, upto=seq)
    stored = sum(_steps_in(piece) for piece in pieces)
    if stored != seq or (pieces and _last_seq(pieces[-1]) != seq):
        raise CheckpointCorruptedError(
            f"{where} covers {seq} steps but {stored} step records are stored"
        )
    run_id = run.run_id
    entries = _history_entries(pieces, run_id)
    if len(entries) != turn:
        raise CheckpointCorruptedError(
            f"{where} says turn {turn} but the steps give {len(entries)}"
        )
    first = {"source": "input", "data": run_input(run)}
    if entries:
        data_seq, source, raw, start, stop = entries.pop()
        data = decode_value(raw[start:stop], f"data of step {data_seq} of run {run_id!r}")
        history: StoredHistory | None = StoredHistory(run_id, first, entries)
    else:
        data_seq, source, data, history = 0, "input", first["data"], None
    if "data" in body:
        data = rebuild(body["data"], where)
    state = CheckpointState(
        run_id=run_id,
        checkpoint=CheckpointInfo.from_record(checkpoint),
        seq=seq,
        turn=turn,
        data=data,
        source=source,
        data_seq=data_seq,
        stored_history=history,
        metadata=metadata if isinstance(metadata, dict) else {},
        position=body.get("position"),
        next_agent=body.get("next"),
        data_inline="data" in body,
    )
    return state, pieces


def _steps_in(piece: StepPiece) -> int:
    return piece.last_seq - piece.first_seq + 1 if isinstance(piece, StepBlock) else 1


def _last_seq(piece: StepPiece) -> int:
    return piece.last_seq if isinstance(piece, StepBlock) else piece.seq


async def load_latest(
    store: CheckpointStorage, run: RunRecord
) -> tuple[CheckpointState, list[CheckpointRecord]]:
    """The newest valid state of ``run`` and the checkpoints it keeps (up to that state).

    Falls back past damaged checkpoints with a warning; with none valid, the run's input.

    Raises:
        CheckpointCorruptedError: even the run's input is damaged.
    """
    checkpoints = await store.list_checkpoints(run.run_id)
    skipped: list[CheckpointCorruptedError] = []
    for index in range(len(checkpoints) - 1, -1, -1):
        checkpoint = checkpoints[index]
        try:
            state = await load_state(store, run, checkpoint)
        except CheckpointCorruptedError as error:
            skipped.append(error)
            continue
        if skipped:
            _warn_fallback(skipped, f"checkpoint {checkpoint.checkpoint_id!r} at step {state.seq}")
        return state, checkpoints[: index + 1]
    if skipped:
        _warn_fallback(skipped, None)
    return initial_state(run), []


def _warn_fallback(skipped: list[CheckpointCorruptedError], older: str | None) -> None:
    """One warning for the damaged checkpoints a load skipped, saying where it resumes."""
    if older is not None:
        where = f"falling back to the older {older}"
    else:
        where = "there is no older checkpoint: falling back to the run's input (step 0)"
    damaged = "; ".join(str(error) for error in skipped)
    count = "a damaged checkpoint" if len(skipped) == 1 else f"{len(skipped)} damaged checkpoints"
    message = f"skipping {count}: {damaged}; {where}"
    # a warning only (logging it too would print it twice where no logging is set up)
    warnings.warn(message, CheckpointFallbackWarning, stacklevel=3)
