"""The SQLite store packs full blocks of step records into one row each: when it does and
when it does not, what a truncation does to them, the migration from version 2, reads
beside a writer, damaged blocks, and deletion."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.codec import seal, seal_json
from nestegg.checkpoint.records import RunRecord, StepBlock, StepRecord
from nestegg.checkpoint.step_blocks import body_intact, read_head, step_records
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.sqlite import blocks as sqlite_blocks
from nestegg.checkpoint.stores.sqlite import store as sqlite_store
from nestegg.checkpoint.stores.sqlite.schema import (
    INSERT_RUN,
    MAX_SEQ,
    MIGRATIONS,
    SCHEMA_VERSION,
    SELECT_STEPS,
    SEQ_SPAN,
    run_to_row,
)
from nestegg.constants import COMPLETED, STEP_BLOCK_STEPS
from nestegg.errors import CheckpointCorruptedError
from nestegg.testing.builders import commit_steps, create, make_commit, make_run, make_step
from tests.stores.test_sqlite_store import record_commit_threads

BLOCK = STEP_BLOCK_STEPS


def table_rows(path: Path) -> dict[str, int]:
    """How many rows the step tables hold."""
    with sqlite3.connect(path) as conn:
        return {
            table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            for table in ("steps", "step_blocks")
        }


def rewrite_block(path: Path, column: str, change: int, block: int = 0) -> None:
    """Flip the byte at ``change`` of a column (head or body) of the file's first block
    (or of the ``block``-th, from 0)."""
    with sqlite3.connect(path) as conn:
        key, value = conn.execute(
            f"SELECT block_key, {column} FROM step_blocks ORDER BY block_key LIMIT 1 OFFSET ?",
            (block,),
        ).fetchone()
        damaged = bytearray(value)
        damaged[change] ^= 0x01
        conn.execute(
            f"UPDATE step_blocks SET {column} = ? WHERE block_key = ?", (bytes(damaged), key)
        )


async def commit_at_once(
    store: SQLiteCheckpointStorage, run: RunRecord, steps: list[StepRecord]
) -> None:
    await store.commit(make_commit(run, steps=steps, step_seq=steps[-1].seq))


@pytest.fixture
async def store(tmp_path: Path) -> SQLiteCheckpointStorage:
    opened = SQLiteCheckpointStorage(tmp_path / "n.db")
    yield opened  # type: ignore[misc]
    await opened.close()


async def test_each_full_block_of_steps_becomes_one_row(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 2 * BLOCK + 11))
    assert table_rows(tmp_path / "n.db") == {"steps": 10, "step_blocks": 2}
    pieces = await store.load_history(run.run_id)
    assert [type(piece) for piece in pieces] == [StepBlock, StepBlock] + [StepRecord] * 10
    for number, block in enumerate(pieces[:2]):
        assert isinstance(block, StepBlock)
        assert (block.first_seq, block.last_seq) == (number * BLOCK + 1, (number + 1) * BLOCK)
        assert body_intact(block, read_head(block))
    assert step_records(pieces) == steps == await store.load_steps(run.run_id)


@pytest.mark.parametrize(
    "odd_body",
    [
        pytest.param(lambda body: body[:-3] + b"x}}", id="damaged"),
        pytest.param(lambda body: b"not a sealed record", id="not-sealed"),
        pytest.param(lambda body: seal_json({"data": 1, "agent": "a"}), id="another-layout"),
    ],
)
async def test_a_block_with_a_damaged_or_unusual_record_stays_loose(
    store: SQLiteCheckpointStorage, tmp_path: Path, odd_body: object
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq) for seq in range(1, BLOCK + 1)]
    steps[99] = steps[99]._replace(body=odd_body(steps[99].body))  # type: ignore[operator]
    await commit_at_once(store, run, steps)
    assert table_rows(tmp_path / "n.db") == {"steps": BLOCK, "step_blocks": 0}
    assert await store.load_steps(run.run_id) == steps
    assert await store.load_history(run.run_id) == steps


async def test_a_commit_that_packs_a_block_runs_on_the_worker_thread(
    store: SQLiteCheckpointStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = record_commit_threads(monkeypatch)
    run = await create(store)
    await commit_steps(store, run, range(1, BLOCK + 2))
    loop_thread = threading.get_ident()
    assert threads[BLOCK - 1] != loop_thread  # step 256 packs the block
    assert [*threads[: BLOCK - 1], threads[BLOCK]] == [loop_thread] * BLOCK
    assert table_rows(tmp_path / "n.db") == {"steps": 1, "step_blocks": 1}


@pytest.mark.parametrize(("slack", "packed"), [(0, 1), (-1, 0)])
async def test_a_block_larger_than_the_limit_stays_loose(
    store: SQLiteCheckpointStorage,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    slack: int,
    packed: int,
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq, data="x" * 100) for seq in range(1, BLOCK + 1)]
    size = sum(len(step.body) for step in steps)
    monkeypatch.setattr(sqlite_blocks, "STEP_BLOCK_MAX_BYTES", size + slack)
    await commit_at_once(store, run, steps)
    assert table_rows(tmp_path / "n.db")["step_blocks"] == packed
    assert await store.load_steps(run.run_id) == steps


async def test_a_truncation_inside_a_block_unpacks_it_and_drops_later_blocks(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq) for seq in range(1, 3 * BLOCK + 1)]
    await commit_at_once(store, run, steps)
    assert table_rows(tmp_path / "n.db") == {"steps": 0, "step_blocks": 3}
    cut = BLOCK + 44
    await store.commit(make_commit(run, truncate_after=cut))
    assert table_rows(tmp_path / "n.db") == {"steps": 44, "step_blocks": 1}
    assert await store.load_steps(run.run_id) == steps[:cut]
    await commit_at_once(store, run, steps[cut : 2 * BLOCK])
    assert table_rows(tmp_path / "n.db") == {"steps": 0, "step_blocks": 2}
    assert await store.load_steps(run.run_id) == steps[: 2 * BLOCK]


async def test_a_truncation_at_a_block_edge_keeps_that_block_whole(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq) for seq in range(1, 2 * BLOCK + 1)]
    await commit_at_once(store, run, steps)
    await store.commit(make_commit(run, truncate_after=BLOCK))
    assert table_rows(tmp_path / "n.db") == {"steps": 0, "step_blocks": 1}
    assert await store.load_steps(run.run_id) == steps[:BLOCK]


async def test_a_version_2_database_keeps_its_steps_and_packs_new_blocks(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    run = make_run()
    steps = [make_step(run.run_id, seq) for seq in range(1, BLOCK + 45)]
    with sqlite3.connect(path) as conn:
        for statement in (*MIGRATIONS[0], *MIGRATIONS[1]):
            assert isinstance(statement, str) or callable(statement)
            conn.execute(statement) if isinstance(statement, str) else statement(conn)
        conn.execute("PRAGMA user_version = 2")
        conn.execute(INSERT_RUN, run_to_row(run))
        [key] = conn.execute("SELECT run_key FROM runs").fetchone()
        conn.executemany(
            "INSERT INTO steps (step_key, agent, body) VALUES (?,?,?)",
            [(key * SEQ_SPAN + s.seq, s.agent, s.body) for s in steps],
        )
    store = SQLiteCheckpointStorage(path)
    assert await store.load_steps(run.run_id) == steps
    more = [make_step(run.run_id, seq) for seq in range(BLOCK + 45, 2 * BLOCK + 1)]
    await commit_at_once(store, run, more)
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert table_rows(path) == {"steps": BLOCK, "step_blocks": 1}
    reopened = SQLiteCheckpointStorage(path)
    assert await reopened.load_steps(run.run_id) == [*steps, *more]
    await reopened.close()


async def read_after(seen: list[int], reads: int) -> None:
    """Wait (a second at most) until the reader thread has read again, on a busy machine
    too."""
    for _ in range(1000):
        if len(seen) > reads + 1:  # a read begun after the last commit has ended
            return
        await asyncio.sleep(0.001)


async def test_reads_beside_a_packing_writer_always_see_whole_histories(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    writer = SQLiteCheckpointStorage(path)
    run = await create(writer)
    steps = [make_step(run.run_id, seq) for seq in range(1, 3 * BLOCK + 21)]
    done = threading.Event()
    seen: list[int] = []

    async def read_until_done() -> None:  # in its own thread, loop and store
        reader = SQLiteCheckpointStorage(path)
        while not done.is_set():
            records = step_records(await reader.load_history(run.run_id))
            assert records == steps[: len(records)]
            seen.append(len(records))
        await reader.close()

    reading = threading.Thread(target=lambda: asyncio.run(read_until_done()))
    reading.start()
    try:
        for step in steps:
            await writer.commit(make_commit(run, steps=[step], step_seq=step.seq))
            if not step.seq % 8:  # let reads meet this length (and each packed block)
                await read_after(seen, len(seen))
    finally:
        done.set()
        reading.join()
        await writer.close()
    assert len(set(seen)) > 10 and max(seen) >= 2 * BLOCK


async def test_a_block_with_a_damaged_head_is_reported_as_corrupted(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    await commit_at_once(store, run, [make_step(run.run_id, s) for s in range(1, BLOCK + 1)])
    rewrite_block(tmp_path / "n.db", "head", 30)
    message = f"the block of steps 1 to {BLOCK} of run {run.run_id!r}"
    with pytest.raises(CheckpointCorruptedError, match=message):
        await store.load_steps(run.run_id)
    [block] = await store.load_history(run.run_id)
    with pytest.raises(CheckpointCorruptedError, match="failed its checksum"):
        read_head(block)  # type: ignore[arg-type]


async def test_a_damaged_block_body_fails_its_checksum_and_the_damaged_record_its_own(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, s) for s in range(1, BLOCK + 1)]
    await commit_at_once(store, run, steps)
    at = sum(len(step.body) for step in steps[:7]) + 40  # inside step 8's record
    rewrite_block(tmp_path / "n.db", "body", at)
    [block] = await store.load_history(run.run_id)
    assert isinstance(block, StepBlock) and not body_intact(block, read_head(block))
    records = await store.load_steps(run.run_id)
    assert [r.body != s.body for r, s in zip(records, steps, strict=True)].index(True) == 7


async def test_deleting_or_expiring_a_run_removes_its_blocks(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    kept, deleted, expired = [await create(store) for _ in range(3)]
    for run in (kept, deleted, expired):
        await commit_at_once(store, run, [make_step(run.run_id, s) for s in range(1, BLOCK + 1)])
    assert table_rows(tmp_path / "n.db")["step_blocks"] == 3
    assert await store.delete_run(deleted.run_id)
    await store.commit(make_commit(expired, status=COMPLETED, updated_at=1.0))
    assert await store.expire_runs([COMPLETED], updated_before=time.time()) == [expired.run_id]
    assert table_rows(tmp_path / "n.db") == {"steps": 0, "step_blocks": 1}
    assert len(await store.load_steps(kept.run_id)) == BLOCK


async def test_loose_records_of_blocks_never_packed_read_back_beside_blocks(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq) for seq in range(1, 3 * BLOCK + 1)]
    steps[10] = steps[10]._replace(body=seal(b'{"data":1}'))  # the first block stays loose
    await commit_at_once(store, run, steps)
    assert table_rows(tmp_path / "n.db") == {"steps": BLOCK, "step_blocks": 2}
    pieces = await store.load_history(run.run_id)
    assert [type(p) for p in pieces] == [StepRecord] * BLOCK + [StepBlock, StepBlock]
    assert await store.load_steps(run.run_id, after=BLOCK - 5, upto=BLOCK + 5) == steps[251:261]


class WriterBetweenReads:
    """A reader's connection that lets ``write`` run just before it reads loose records
    (after it read the blocks): the moment a packing commit would tear a read apart."""

    def __init__(self, conn: sqlite3.Connection, write: Callable[[], None]) -> None:
        self.conn, self.write = conn, write

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        if sql == SELECT_STEPS:
            self.write()
        return self.conn.execute(sql, params)


async def test_a_read_takes_blocks_and_records_from_one_snapshot(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq) for seq in range(1, BLOCK + 1)]
    await commit_at_once(store, run, steps[:-1])
    await store.close()
    reader = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
    writer = sqlite3.connect(tmp_path / "n.db", isolation_level=None)
    packing = make_commit(run, steps=steps[-1:], step_seq=BLOCK)
    read = WriterBetweenReads(reader, lambda: sqlite_store.commit_alone(writer, packing, {}))
    pieces = sqlite_blocks.read_history(read, (run.run_id, 0, MAX_SEQ))  # type: ignore[arg-type]
    assert step_records(pieces) == steps[:-1]  # what was there when the read began
    assert table_rows(tmp_path / "n.db") == {"steps": 0, "step_blocks": 1}
    reader.close()
    writer.close()
    assert await store.load_steps(run.run_id) == steps


async def test_a_truncation_into_a_block_with_a_damaged_head_is_refused_and_changes_nothing(
    store: SQLiteCheckpointStorage, tmp_path: Path
) -> None:
    run = await create(store)
    steps = [make_step(run.run_id, seq) for seq in range(1, BLOCK + 11)]
    await commit_at_once(store, run, steps)
    await store.close()
    rewrite_block(tmp_path / "n.db", "head", 30)
    with sqlite3.connect(tmp_path / "n.db") as conn:
        before = conn.execute("SELECT block_key, head, body FROM step_blocks").fetchall()
    message = f"the block of steps 1 to {BLOCK} of run {run.run_id!r}"
    with pytest.raises(CheckpointCorruptedError, match=message):
        await store.commit(make_commit(run, truncate_after=100))
    assert table_rows(tmp_path / "n.db") == {"steps": 10, "step_blocks": 1}
    with sqlite3.connect(tmp_path / "n.db") as conn:
        assert conn.execute("SELECT block_key, head, body FROM step_blocks").fetchall() == before
    assert await store.load_steps(run.run_id, after=BLOCK) == steps[BLOCK:]
