"""How the SQLite store keeps step records in blocks (see :mod:`~nestegg.checkpoint.step_blocks`).

A step's commit writes the step's record as one row. The commit that writes step
``k * STEP_BLOCK_STEPS`` also packs the records of that block of steps (``(k - 1) * 256 + 1``
to ``k * 256``) into one row of the blocks table and deletes their rows, when all of
them are there, intact, in the checkpointer's layout, and together no larger than
``STEP_BLOCK_MAX_BYTES``: one more row written every 256 steps, and a resume of a
10,000-step run reads 39 blocks and 16 rows instead of 10,000 rows. Steps left as rows
(a database of schema version 2, a block that did not qualify) stay rows.

A truncation (a resume from an earlier step) unpacks the block it cuts into (its records
up to the cut become rows again) and deletes the blocks past it. A step written again
inside a packed block stays a row, which replaces the block's record when read. Reads
take the blocks and the rows from one snapshot and merge them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from nestegg.checkpoint.bulk import collector_paused
from nestegg.checkpoint.records import StepBlock, StepRecord
from nestegg.checkpoint.step_blocks import StepPiece, merged, pack_block, unpack_block
from nestegg.checkpoint.stores.sqlite.schema import (
    DELETE_BLOCKS_AFTER,
    DELETE_STEPS_AFTER,
    INSERT_BLOCK,
    INSERT_STEP_IF_NEW,
    KEY_OF,
    MAX_SEQ,
    SELECT_BLOCK_HOLDING,
    SELECT_BLOCKS,
    SELECT_STEPS,
    SEQ_SPAN,
)
from nestegg.constants import STEP_BLOCK_MAX_BYTES, STEP_BLOCK_STEPS


def blocks_completed(steps: Sequence[StepRecord]) -> list[int]:
    """The last steps of the blocks a commit's ``steps`` complete (each may be packed by it)."""
    return [step.seq for step in steps if not step.seq % STEP_BLOCK_STEPS]


def pack_completed_blocks(
    conn: sqlite3.Connection, run_id: str, steps: Sequence[StepRecord], base: int
) -> None:
    """Pack the blocks a commit's ``steps`` complete (inside its transaction)."""
    for last in blocks_completed(steps):
        _pack(conn, run_id, base, last - STEP_BLOCK_STEPS)


def _pack(conn: sqlite3.Connection, run_id: str, base: int, before: int) -> None:
    """Pack the steps ``before + 1`` to ``before + STEP_BLOCK_STEPS`` if they qualify."""
    rows = conn.execute(SELECT_STEPS, (base, before, before + STEP_BLOCK_STEPS))
    records = [StepRecord(run_id, seq, agent, body) for seq, agent, body in rows]
    if len(records) < STEP_BLOCK_STEPS:
        return
    if sum(len(record.body) for record in records) > STEP_BLOCK_MAX_BYTES:
        return
    block = pack_block(records)
    if block is None:
        return
    conn.execute(INSERT_BLOCK, (base + block.first_seq, block.last_seq, block.head, block.body))
    _delete_steps(conn, base + before, base + block.last_seq)


def truncate_steps(conn: sqlite3.Connection, run_id: str, base: int, after: int) -> None:
    """Drop the run's step records past ``after``, loose or in blocks (in a transaction).

    Raises:
        CheckpointCorruptedError: the block holding step ``after`` has a damaged head.
    """
    cut_from = after
    row = conn.execute(SELECT_BLOCK_HOLDING, (base, after, STEP_BLOCK_STEPS)).fetchone()
    if row is not None:
        block = StepBlock(run_id, *row)
        kept = [record for record in unpack_block(block) if record.seq <= after]
        rows = [(base + record.seq, record.agent, record.body) for record in kept]
        conn.executemany(INSERT_STEP_IF_NEW, rows)
        cut_from = block.first_seq - 1
    conn.execute(DELETE_BLOCKS_AFTER, (base + cut_from, base + MAX_SEQ))
    _delete_steps(conn, base + after, base + MAX_SEQ)


def _delete_steps(conn: sqlite3.Connection, after_key: int, upto_key: int) -> None:
    for statement in DELETE_STEPS_AFTER:
        conn.execute(statement, (after_key, upto_key))


@contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """The statements of the block read one snapshot of the database."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:  # SQLite may have ended it on an error: keep that error
            conn.execute("COMMIT")


def read_history(conn: sqlite3.Connection, params: tuple[str, int, int]) -> list[StepPiece]:
    """The steps ``after < seq <= upto`` of a run as pieces: blocks and loose records."""
    run_id, after, upto = params
    with read_snapshot(conn), collector_paused():
        found = conn.execute(KEY_OF, (run_id,)).fetchone()
        if found is None:
            return []
        base = found[0] * SEQ_SPAN
        lowest = max(after + 1 - STEP_BLOCK_STEPS, 0)  # a block holding step after + 1
        blocks = [
            StepBlock(run_id, first, last, head, body)
            for first, last, head, body in conn.execute(SELECT_BLOCKS, (base, lowest, upto))
        ]
        loose = [
            StepRecord(run_id, seq, agent, body)
            for seq, agent, body in conn.execute(SELECT_STEPS, (base, after, upto))
        ]
    return merged(blocks, loose, after, upto)


__all__ = [
    "blocks_completed",
    "pack_completed_blocks",
    "read_history",
    "read_snapshot",
    "truncate_steps",
]
