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
from typing import Any, NamedTuple

from nestegg.checkpoint.bulk import collector_paused
from nestegg.checkpoint.codec import all_intact, decode_value, rebuild, unseal
from nestegg.checkpoint.formats import parse_checkpoint
from nestegg.checkpoint.records import CheckpointRecord, RunRecord, StepBlock, StepRecord
from nestegg.checkpoint.step_blocks import (
    StepPiece,
    block_where,
    body_intact,
    read_head,
    step_records,
    unpack_block,
)
from nestegg.checkpoint.step_formats import HistoryEntry, block_entries, record_entries, step_data
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


class _Header(NamedTuple):
    """What a checkpoint's body says, checked: where it is (for errors), the steps it
    covers, its turn, metadata and body, and its inline data (:data:`_NO_DATA`: none)."""

    where: str
    seq: int
    turn: int
    metadata: Any
    body: dict[str, Any]
    data: Any


_NO_DATA = object()


def _header(run: RunRecord, checkpoint: CheckpointRecord) -> _Header:
    where = f"checkpoint {checkpoint.checkpoint_id!r} of run {run.run_id!r}"
    body = parse_checkpoint(checkpoint.body, where)
    try:
        seq, turn = int(body["seq"]), int(body["turn"])
        metadata = rebuild(body.get("metadata") or {}, where)
    except (KeyError, TypeError, ValueError):
        raise CheckpointCorruptedError(f"{where} lacks its fields") from None
    data = rebuild(body["data"], where) if "data" in body else _NO_DATA
    return _Header(where, seq, turn, metadata, body, data)


def _covered(header: _Header, steps: int, last: int) -> None:
    """Raise unless ``steps`` step records, the last with seq ``last`` (0: none), are
    the ``header.seq`` steps its checkpoint covers."""
    if steps != header.seq or (steps and last != header.seq):
        raise CheckpointCorruptedError(
            f"{header.where} covers {header.seq} steps but {steps} step records are stored"
        )


def _turns(header: _Header, entries: int) -> None:
    """Raise unless ``entries`` steps that hold data make the checkpoint's turn."""
    if entries != header.turn:
        raise CheckpointCorruptedError(
            f"{header.where} says turn {header.turn} but the steps give {entries}"
        )


async def _load(
    store: CheckpointStorage, run: RunRecord, checkpoint: CheckpointRecord
) -> tuple[CheckpointState, Sequence[StepPiece]]:
    header = _header(run, checkpoint)
    seq, body = header.seq, header.body
    pieces = await load_history(store, run.run_id, upto=seq)
    _covered(
        header, sum(_steps_in(piece) for piece in pieces), _last_seq(pieces[-1]) if pieces else 0
    )
    run_id = run.run_id
    entries = _history_entries(pieces, run_id)
    _turns(header, len(entries))
    first = {"source": "input", "data": run_input(run)}
    if entries:
        data_seq, source, raw, start, stop = entries.pop()
        data = decode_value(raw[start:stop], f"data of step {data_seq} of run {run_id!r}")
        history: StoredHistory | None = StoredHistory(run_id, first, entries)
    else:
        data_seq, source, data, history = 0, "input", first["data"], None
    if header.data is not _NO_DATA:
        data = header.data
    state = CheckpointState(
        run_id=run_id,
        checkpoint=CheckpointInfo.from_record(checkpoint),
        seq=seq,
        turn=header.turn,
        data=data,
        source=source,
        data_seq=data_seq,
        stored_history=history,
        metadata=header.metadata if isinstance(header.metadata, dict) else {},
        position=body.get("position"),
        next_agent=body.get("next"),
        data_inline=header.data is not _NO_DATA,
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


async def unusable_checkpoints(
    store: CheckpointStorage, run: RunRecord, checkpoints: Sequence[CheckpointRecord]
) -> dict[str, CheckpointCorruptedError]:
    """The checkpoints of ``run`` that :func:`load_state` refuses, by id, each with why:
    a damaged body, or a step record it rests on damaged or missing.

    The run's steps are read once for them all, and checked once, not once per
    checkpoint (but for the records of a block that a checkpoint splits). The data of a
    checkpoint's last step is checked by its checksum, not decoded (a resume decodes it).

    Args:
        store: the store holding the run.
        run: the run.
        checkpoints: its checkpoints (``store.list_checkpoints(run.run_id)``).

    Returns:
        The damaged ones; an empty dict when a resume can use each.

    Example:
        ``damaged = await unusable_checkpoints(store, run, await store.list_checkpoints(id))``
    """
    unusable: dict[str, CheckpointCorruptedError] = {}
    headers: list[tuple[str, _Header]] = []
    for checkpoint in checkpoints:
        try:
            headers.append((checkpoint.checkpoint_id, _header(run, checkpoint)))
        except CheckpointCorruptedError as error:
            unusable[checkpoint.checkpoint_id] = error
    if not headers:
        return unusable
    headers.sort(key=lambda pair: pair[1].seq)
    upto = headers[-1][1].seq
    steps = _SharedHistory(await load_history(store, run.run_id, upto=upto), run.run_id)
    for checkpoint_id, header in headers:
        try:
            steps.check(header)
        except CheckpointCorruptedError as error:
            unusable[checkpoint_id] = error
    return unusable


class _SharedHistory:
    """A run's step pieces read once, checked as :func:`load_state` checks those up to
    each checkpoint's seq, for checkpoints taken in order of their seq: a prefix is
    checked once, as checkpoints at higher seqs reach further."""

    def __init__(self, pieces: Sequence[StepPiece], run_id: str) -> None:
        self.pieces, self.run_id = pieces, run_id
        self.taken = 0  # the pieces wholly up to the last seq asked for
        self.steps = self.last = self.entries = 0  # in the pieces taken
        self.damage: CheckpointCorruptedError | None = None

    def check(self, header: _Header) -> None:
        """Raise what :func:`load_state` raises for the history of ``header``'s checkpoint."""
        seq, end = header.seq, self.taken
        while end < len(self.pieces) and _last_seq(self.pieces[end]) <= seq:
            end += 1
        fresh = self.pieces[self.taken : end]
        if fresh:
            self.taken = end
            self.steps += sum(_steps_in(piece) for piece in fresh)
            self.last = _last_seq(fresh[-1])
            if self.damage is None:
                try:
                    self.entries += len(_history_entries(fresh, self.run_id))
                except CheckpointCorruptedError as error:
                    self.damage = error
        rest = self._split_block(seq)  # a resume gets its records up to seq alone
        _covered(header, self.steps + len(rest), rest[-1].seq if rest else self.last)
        if self.damage is not None:
            raise self.damage
        _turns(header, self.entries + len(_history_entries(rest, self.run_id)))

    def _split_block(self, seq: int) -> list[StepRecord]:
        """The records up to ``seq`` of the next piece when it is a block going past it."""
        if self.taken == len(self.pieces):
            return []
        piece = self.pieces[self.taken]
        if not isinstance(piece, StepBlock) or piece.first_seq > seq:
            return []
        return [record for record in unpack_block(piece) if record.seq <= seq]
