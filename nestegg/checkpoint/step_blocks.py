"""Step blocks: consecutive step records kept as one, so a long run is read in few pieces.

A run's step records are written one by one, each as it completes (what a step has to
write anyway). A store may later pack consecutive ones into a :class:`StepBlock`: their
sealed bodies one after the other, unchanged (each keeps its own checksum), under a
sealed *head* that names each record's agent, where it ends and where its data JSON
starts, and the CRC-32 of the whole body. Checking the head's and the body's checksum
checks every record of the block at once: a resume of a 10,000-step run reads and checks
about forty blocks instead of ten thousand records, and finds their data without
searching them. Only intact records in the checkpointer's layout are packed, so a block
never vouches for a record that was already damaged.

A store keeps each step record in one place: loose, or in one block. Readers get either
(:func:`~nestegg.checkpoint.stores.base.load_history`); :func:`step_records` turns both
into records.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from itertools import accumulate

from nestegg.checkpoint.codec import all_intact
from nestegg.checkpoint.records import StepBlock, StepRecord
from nestegg.checkpoint.step_formats import (
    BlockHead,
    block_checksum,
    block_head_body,
    parse_block_head,
)

StepPiece = StepRecord | StepBlock
"""What a history is read as: a loose step record, or a block of them."""


def pack_block(records: Sequence[StepRecord]) -> StepBlock | None:
    """The block holding ``records`` (consecutive, in order); None if any of them is not
    intact or not in the checkpointer's layout (those stay loose, where a reader names a
    damaged one or parses it in full).
    """
    bodies = [record.body for record in records]
    first = records[0].seq
    if [record.seq for record in records] != list(range(first, first + len(records))):
        raise ValueError("a block holds consecutive step records, in order")
    if not all_intact(bodies):
        return None
    body = b"".join(bodies)
    agents = [record.agent for record in records]
    head = block_head_body(first, agents, body, list(accumulate(map(len, bodies))))
    if head is None:
        return None
    return StepBlock(records[0].run_id, first, records[-1].seq, head, body)


def block_where(block: StepBlock) -> str:
    """How errors name a block: the steps it holds and their run."""
    return f"steps {block.first_seq} to {block.last_seq} of run {block.run_id!r}"


def read_head(block: StepBlock) -> BlockHead:
    """The block's head, checked against the block (its checksum, the steps it names, the
    bounds of their records and where their data is).

    Raises:
        CheckpointCorruptedError: the head is damaged or does not fit the block.
    """
    where = f"the block of {block_where(block)}"
    count = block.last_seq - block.first_seq + 1
    return parse_block_head(block.head, where, block.first_seq, count, block.body)


def body_intact(block: StepBlock, head: BlockHead) -> bool:
    """Whether the block's body is what its head's checksum says (every record at once)."""
    return block_checksum(block.body) == head.checksum


def unpack_block(block: StepBlock, head: BlockHead | None = None) -> list[StepRecord]:
    """The block's records, each with its own sealed body (not checked here).

    Raises:
        CheckpointCorruptedError: the block's head is damaged.
    """
    head = head or read_head(block)
    body, run_id = block.body, block.run_id
    starts = [0, *head.ends[:-1]]
    return [
        StepRecord(run_id, seq, agent, body[start:end])
        for seq, agent, start, end in zip(
            range(block.first_seq, block.last_seq + 1), head.agents, starts, head.ends, strict=True
        )
    ]


def step_records(pieces: Sequence[StepPiece]) -> list[StepRecord]:
    """The step records of pieces read in order, blocks unpacked."""
    records: list[StepRecord] = []
    for piece in pieces:
        if isinstance(piece, StepBlock):
            records.extend(unpack_block(piece))
        else:
            records.append(piece)
    return records


def merged(
    blocks: Sequence[StepBlock], loose: Sequence[StepRecord], after: int, upto: int
) -> list[StepPiece]:
    """The pieces holding the steps ``after < seq <= upto``, in order, from blocks and loose
    records read from one snapshot of a store (each sorted by seq).

    A block is given whole when it lies in the range and no loose record has a seq inside
    it; otherwise it is unpacked there, and a loose record replaces the block's record of
    the same seq (a store that writes a step again keeps the newer one loose).
    """
    pieces: list[StepPiece] = []
    seqs = [record.seq for record in loose]
    taken = 0
    for block in blocks:
        inside = bisect.bisect_left(seqs, block.first_seq, taken)
        pieces.extend(loose[taken:inside])
        taken = bisect.bisect_right(seqs, block.last_seq, inside)
        if after < block.first_seq and block.last_seq <= upto and taken == inside:
            pieces.append(block)
            continue
        newer = {record.seq: record for record in loose[inside:taken]}
        pieces.extend(
            newer.pop(record.seq, record)
            for record in unpack_block(block)
            if after < record.seq <= upto
        )
    pieces.extend(loose[taken:])
    return pieces


__all__ = [
    "BlockHead",
    "StepPiece",
    "block_where",
    "body_intact",
    "merged",
    "pack_block",
    "read_head",
    "step_records",
    "unpack_block",
]
