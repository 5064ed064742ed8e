"""The SQLite store's group commits: a big batch on the worker thread in a few statements,
and batches that must be written commit by commit (see sqlite/group_writes.py)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.sqlite import store as sqlite_store
from nestegg.checkpoint.stores.sqlite.schema import SCHEMA_VERSION
from nestegg.constants import COMPLETED, SQLITE_INLINE_BATCH_COMMITS
from nestegg.errors import RunExistsError, StorageError
from nestegg.testing.builders import (
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_journal,
    make_run,
    make_step,
)

RUNS = SQLITE_INLINE_BATCH_COMMITS + 8


def _step(run: RunRecord, seq: int, **fields: Any) -> Any:
    rid = run.run_id
    return make_commit(
        run,
        steps=[make_step(rid, seq)],
        events=[make_event(rid, seq)],
        checkpoints=[make_checkpoint(rid, seq)],
        step_seq=seq,
        event_seq=seq,
        **fields,
    )


class CountedConnection:
    """A connection that notes the statements the store runs on it (and, given a list for
    them, their parameters)."""

    def __init__(
        self, conn: sqlite3.Connection, statements: list[str], params: list[Any] | None = None
    ) -> None:
        self.conn, self.statements, self.params = conn, statements, params

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.statements.append(sql)
        if self.params is not None:
            self.params.append(params)
        return self.conn.execute(sql, params)


def record_batches(
    monkeypatch: pytest.MonkeyPatch, parameters: int | None = None
) -> list[tuple[int, int, list[str]]]:
    """Each batch written from now on: (thread, commits, statements the store ran for it);
    with ``parameters``, SQLite allows that many in one statement."""
    seen: list[tuple[int, int, list[str]]] = []
    inner = sqlite_store.commit_batch

    def recorded(conn: sqlite3.Connection, commits: Any, *args: Any) -> Any:
        statements: list[str] = []
        seen.append((threading.get_ident(), len(commits), statements))
        if parameters is not None:
            conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, parameters)
        return inner(CountedConnection(conn, statements), commits, *args)

    monkeypatch.setattr(sqlite_store, "commit_batch", recorded)
    return seen


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, list[str]]]:
    return record_batches(monkeypatch)


def row_counts(path: Path) -> list[int]:
    """Rows in steps, event_batches, group_steps and group_event_batches."""
    tables = ("steps", "event_batches", "group_steps", "group_event_batches")
    with sqlite3.connect(path) as conn:
        return [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables]


async def test_a_big_group_goes_to_the_worker_thread_in_a_few_statements(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"big-{i:02d}") for i in range(RUNS)]
    await asyncio.gather(*(store.commit(_step(run, 1)) for run in runs))
    [(thread, commits, statements)] = batches  # the first run's commit went alone
    assert thread != threading.get_ident() and commits == RUNS - 1
    # BEGIN, the runs' update, steps, event batches, checkpoints, COMMIT: all the commits
    # may go together, so no savepoint.
    assert len(statements) == 6, statements
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
        assert [e.seq for e in await store.read_events(run.run_id)] == [1]
        assert [c.seq for c in await store.list_checkpoints(run.run_id)] == [1]
        stored = await store.get_run(run.run_id)
        assert stored is not None and (stored.step_seq, stored.event_seq) == (1, 1)
    await store.close()


async def test_a_group_is_written_in_more_statements_where_sqlite_allows_few_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = record_batches(monkeypatch, parameters=40)  # rows of 4 in 8s, of 6 in 6s
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"few-{i:02d}") for i in range(RUNS)]
    await asyncio.gather(*(store.commit(_step(run, 1)) for run in runs))
    [(_, _, statements)] = batches
    assert sum(s.startswith("INSERT OR REPLACE INTO group_steps") for s in statements) == 3
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
        assert [e.seq for e in await store.read_events(run.run_id)] == [1]
        assert [c.seq for c in await store.list_checkpoints(run.run_id)] == [1]
        stored = await store.get_run(run.run_id)
        assert stored is not None and stored.step_seq == 1
    await store.close()


async def test_a_record_written_again_reads_as_the_newest_of_the_two_tables(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    runs = [await create(store, run_id=f"again-{i:02d}") for i in range(RUNS)]
    again = runs[1]

    def commit(run: RunRecord, agent: str) -> Any:
        step = make_step(run.run_id, 1, agent=agent)
        return make_commit(run, steps=[step], events=[make_event(run.run_id, 1)])

    async def group(agent: str) -> None:
        await asyncio.gather(*(store.commit(commit(run, agent)) for run in runs))

    await group("first")  # in a group: the group tables
    await store.commit(commit(again, "alone"))  # alone: the keyed tables
    assert [s.agent for s in await store.load_steps(again.run_id)] == ["alone"]
    assert [e.seq for e in await store.read_events(again.run_id)] == [1]
    await group("third")  # in a group again: its keys leave the keyed tables
    for run in runs:
        assert [s.agent for s in await store.load_steps(run.run_id)] == ["third"]
        assert [e.seq for e in await store.read_events(run.run_id)] == [1]
    await store.close()
    assert row_counts(path) == [1, 1, RUNS - 1, RUNS - 1]  # the first run's commits went alone


async def test_a_group_writes_journals_prunes_and_different_run_fields_together(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"mixed-{i:02d}") for i in range(RUNS)]
    first = [make_checkpoint(run.run_id, 1) for run in runs]
    for run, checkpoint in zip(runs, first, strict=True):
        await store.commit(
            make_commit(run, steps=[make_step(run.run_id, 1)], checkpoints=[checkpoint])
        )

    def second(index: int) -> Any:
        run = runs[index]
        if index % 3 == 1:  # a journaled step that prunes the first checkpoint
            journal = [make_journal(run.run_id, 2, 0), make_journal(run.run_id, 2, 1)]
            return _step(run, 2, journal=journal, prune=[first[index].checkpoint_id])
        if index % 3 == 2:  # the last step: the run completes
            return _step(run, 2, status=COMPLETED, result=b'{"done":true}')
        return _step(run, 2)

    batches.clear()
    await asyncio.gather(*(store.commit(second(i)) for i in range(RUNS)))
    assert [commits for _, commits, _ in batches] == [RUNS - 1]
    assert len(batches[0][2]) == 9, batches[0][2]  # together, not ~5 per commit
    for index, run in enumerate(runs):
        rid = run.run_id
        assert [s.seq for s in await store.load_steps(rid)] == [1, 2]
        kept = [c.seq for c in await store.list_checkpoints(rid)]
        assert kept == ([2] if index % 3 == 1 else [1, 2])
        journal = await store.read_journal(rid, 2)
        assert [j.position for j in journal] == ([0, 1] if index % 3 == 1 else [])
        stored = await store.get_run(rid)
        assert stored is not None and stored.step_seq == 2
        if index % 3 == 2:
            assert (stored.status, stored.result) == (COMPLETED, b'{"done":true}')
        else:
            assert (stored.status, stored.result) == (run.status, None)
    await store.close()


async def test_no_statement_of_a_group_commit_reads_a_whole_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each statement finds its rows by key: a scan would cost every group commit time in
    proportion to all the runs and checkpoints the store holds."""
    statements: list[str] = []
    params: list[Any] = []
    inner = sqlite_store.commit_batch

    def noted(conn: sqlite3.Connection, commits: Any, *args: Any) -> Any:
        return inner(CountedConnection(conn, statements, params), commits, *args)

    monkeypatch.setattr(sqlite_store, "commit_batch", noted)
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    runs = [await create(store, run_id=f"keyed-{i:02d}") for i in range(RUNS)]
    first = [make_checkpoint(run.run_id, 1) for run in runs]

    def second(run: RunRecord, pruned: Any) -> Any:
        journal = [make_journal(run.run_id, 2, 0)]
        return _step(run, 2, prune=[pruned.checkpoint_id], journal=journal)

    pairs = list(zip(runs, first, strict=True))
    await asyncio.gather(*(store.commit(make_commit(r, checkpoints=[c])) for r, c in pairs))
    await asyncio.gather(*(store.commit(second(run, pruned)) for run, pruned in pairs))
    assert [c.seq for c in await store.list_checkpoints(runs[1].run_id)] == [2]
    await store.close()
    plans: dict[str, list[str]] = {}
    with closing(sqlite3.connect(path)) as conn:
        for sql, values in zip(statements, params, strict=True):
            if sql.split()[0] in ("INSERT", "UPDATE", "DELETE", "SELECT"):
                plan = conn.execute("EXPLAIN QUERY PLAN " + sql, values).fetchall()
                plans[sql.split("(")[0]] = [row[3] for row in plan]
    assert any(head.startswith("DELETE FROM checkpoints") for head in plans), plans
    for head, plan in plans.items():
        assert not [step for step in plan if _is_table_scan(step)], (head, plan)


def _is_table_scan(step: str) -> bool:
    """A step of a query plan that reads a whole table or index (not the statement's own
    ``VALUES`` rows: ``v``, a subquery or the constant rows themselves)."""
    if not step.startswith("SCAN ") or "CONSTANT ROWS" in step:
        return False
    return step.split()[1] != "v" and not step.startswith("SCAN (subquery")


async def test_two_commits_of_one_run_in_a_group_land_in_order_beside_the_others(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    runs = [await create(store, run_id=f"twice-{i:02d}") for i in range(RUNS)]
    twice = runs[1]
    commits = [_step(runs[0], 1), _step(twice, 1), _step(twice, 2)]
    commits += [_step(run, 1) for run in runs[2:]]
    await asyncio.gather(*(store.commit(commit) for commit in commits))
    assert [n for _, n, _ in batches] == [RUNS]  # both of the run's commits in one batch
    assert [s.seq for s in await store.load_steps(twice.run_id)] == [1, 2]
    assert [c.seq for c in await store.list_checkpoints(twice.run_id)] == [1, 2]
    stored = await store.get_run(twice.run_id)
    assert stored is not None and stored.step_seq == 2
    for run in runs[2:]:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
    await store.close()
    # The first run's commit alone and the two commits of one run, one by one, in the keyed
    # tables; the other runs' commits together.
    assert row_counts(path) == [3, 3, RUNS - 2, RUNS - 2]


async def test_a_version_5_database_keeps_its_records_and_takes_group_commits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v5.db"
    old = SQLiteCheckpointStorage(path)
    runs = [await create(old, run_id=f"old-{i:02d}") for i in range(RUNS)]
    for run in runs:  # one by one: into the keyed tables
        await old.commit(_step(run, 1))
    await old.close()
    with sqlite3.connect(path) as conn:  # back to version 5, as an older nestegg left it
        conn.execute("DROP TABLE group_steps")
        conn.execute("DROP TABLE group_event_batches")
        conn.execute("DROP INDEX runs_by_parent")
        conn.execute("PRAGMA user_version = 5")
    store = SQLiteCheckpointStorage(path)
    await asyncio.gather(*(store.commit(_step(run, 2)) for run in runs))
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
        assert [e.seq for e in await store.read_events(run.run_id)] == [1, 2]
        assert [c.seq for c in await store.list_checkpoints(run.run_id)] == [1, 2]
    assert await store.delete_run(runs[3].run_id)
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    # Step 1 of every run and step 2 of the first (alone) keyed, the other step 2 in the
    # group tables; run 3's records gone from all four.
    assert row_counts(path) == [RUNS, RUNS, RUNS - 2, RUNS - 2]


async def test_runs_created_and_read_at_once_go_to_the_worker_together_not_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of runs starting at once must not queue one by one on the worker thread
    (their first commits would wait behind them)."""
    calls: list[str] = []
    connection_type = type(SQLiteCheckpointStorage(tmp_path / "x.db")._connection)
    inner_call = connection_type.call

    async def counted(self: Any, work: Any, *args: Any) -> Any:
        calls.append(work.__name__)
        return await inner_call(self, work, *args)

    monkeypatch.setattr(connection_type, "call", counted)
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    await store.setup()
    taken = await create(store, run_id="taken")
    calls.clear()
    runs = [make_run(f"start-{i:03d}") for i in range(200)]
    created = await asyncio.gather(
        *(store.create_run(r) for r in [*runs, make_run("taken")]), return_exceptions=True
    )
    assert created[:200] == [None] * 200 and isinstance(created[200], RunExistsError)
    read = await asyncio.gather(*(store.get_run(r.run_id) for r in [*runs, taken]))
    assert read == [*runs, taken]
    assert calls.count("_create_run") == 1 and calls.count("create_together") == 1
    assert calls.count("_get_run") == 1 and calls.count("_get_runs") == 1
    await store.close()


async def test_a_bad_run_or_id_among_runs_created_or_read_at_once_fails_alone(
    tmp_path: Path,
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    await store.setup()
    runs = [make_run(f"good-{i}") for i in range(4)]
    bad = make_run("bad", pipeline="p\udc80")  # not UTF-8: SQLite cannot take it
    created = await asyncio.gather(
        *(store.create_run(r) for r in [runs[0], runs[1], bad, runs[2], runs[3]]),
        return_exceptions=True,
    )
    assert [c is None for c in created] == [True, True, False, True, True]
    assert isinstance(created[2], UnicodeEncodeError)
    ids = [runs[0].run_id, runs[1].run_id, "bad\ud800", runs[2].run_id, "ghost"]
    read = await asyncio.gather(*(store.get_run(i) for i in ids), return_exceptions=True)
    assert read[:2] == runs[:2] and read[3] == runs[2] and read[4] is None
    assert isinstance(read[2], UnicodeEncodeError)
    assert await store.get_run("bad") is None
    await store.close()


async def test_runs_created_and_read_at_once_where_sqlite_allows_few_parameters(
    tmp_path: Path,
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    await store.setup()
    await store.get_run("warm-up")  # the connection is open now
    conn = store._connection._conn
    assert conn is not None
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 100)
    runs = [make_run(f"few-{i:03d}") for i in range(300)]
    assert await asyncio.gather(*(store.create_run(r) for r in runs)) == [None] * 300
    assert await asyncio.gather(*(store.get_run(r.run_id) for r in runs)) == runs
    await store.close()


async def test_a_batch_that_finds_the_write_lock_held_fails_after_one_wait_not_two(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batches: list[tuple[int, int, list[str]]]
) -> None:
    """A lock held elsewhere beyond the busy timeout fails the batch: its commits are not
    written again one by one, which would wait as long again."""
    monkeypatch.setattr(sqlite_store, "SQLITE_BUSY_TIMEOUT_MS", 200)
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"held-{i:02d}") for i in range(RUNS)]
    blocker = sqlite3.connect(tmp_path / "n.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        outcomes = await asyncio.gather(
            *(store.commit(_step(run, 1)) for run in runs), return_exceptions=True
        )
    finally:
        blocker.rollback()
        blocker.close()
    assert all(isinstance(outcome, StorageError) for outcome in outcomes), outcomes
    [(_, commits, statements)] = batches  # the first run's commit went alone
    assert commits == RUNS - 1 and statements == ["BEGIN IMMEDIATE"]
    for run in runs:
        assert await store.load_steps(run.run_id) == []
    await store.close()
