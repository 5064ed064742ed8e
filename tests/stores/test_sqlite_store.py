"""What only the SQLite store does: processes sharing a file, schema versions, file modes,
a loop that keeps running while the database is busy, error mapping, size on disk."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.codec import seal_json, unseal
from nestegg.checkpoint.records import CheckpointRecord, Commit, SignalRecord, StepRecord
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.sqlite import connection as sqlite_connection
from nestegg.checkpoint.stores.sqlite import store as sqlite_store
from nestegg.checkpoint.stores.sqlite.schema import (
    INSERT_RUN,
    MIGRATIONS,
    SCHEMA_VERSION,
    SELECT_FORKS,
    run_to_row,
)
from nestegg.constants import SQLITE_BUSY_TIMEOUT_MS, SQLITE_RUNS_TABLE, STEP_BLOCK_STEPS
from nestegg.errors import (
    CheckpointCorruptedError,
    ConfigurationError,
    StorageError,
    StorageUnavailableError,
)
from nestegg.testing.builders import (
    assert_bytes_fields,
    commit_steps,
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_journal,
    make_run,
    make_step,
)

REPO = Path(__file__).resolve().parents[2]

# A child process: commits steps to one run, or races for claims of several runs.
CHILD = r"""
import asyncio, sys, time
from nestegg.checkpoint.stores import open_store
from nestegg.errors import RunLockedError
from nestegg.testing.builders import (
    OWNER, create, make_checkpoint, make_commit, make_event, make_step,
)

async def commit_run(url, run_id, seqs, start):
    store = open_store(url)
    run = await store.get_run(run_id) or await create(store, run_id=run_id)
    await asyncio.sleep(max(0.0, start - time.time()))
    kept = []
    for seq in seqs:
        checkpoint = make_checkpoint(run_id, seq)
        kept.append(checkpoint.checkpoint_id)
        await store.commit(make_commit(
            run, steps=[make_step(run_id, seq)], events=[make_event(run_id, seq)],
            checkpoints=[checkpoint], prune=kept[:-3], step_seq=seq, event_seq=seq))
        del kept[:-3]
    await store.close()

async def claim_runs(url, run_ids, start, pid):
    store = open_store(url)
    for i, run_id in enumerate(run_ids):
        await asyncio.sleep(max(0.0, start + 0.1 * i - time.time()))
        try:
            await store.claim_run(run_id, 1, OWNER, time.time() + 30, time.time())
            print(run_id, "won", flush=True)
        except RunLockedError:
            print(run_id, "locked", flush=True)
    await store.close()

mode, url = sys.argv[1], sys.argv[2]
if mode == "commit":
    seqs = [int(s) for s in sys.argv[4].split(",")]
    asyncio.run(commit_run(url, sys.argv[3], seqs, float(sys.argv[5])))
else:
    asyncio.run(claim_runs(url, sys.argv[3].split(","), float(sys.argv[4]), sys.argv[5]))
"""


def spawn(*args: str) -> subprocess.Popen[str]:
    """A child Python process running CHILD with ``args``."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(children: list[subprocess.Popen[str]]) -> list[str]:
    """Wait for the children; their stdout. Fails with stderr if one failed."""
    outputs = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
        outputs.append(out)
    return outputs


def race_claims_in_processes(url: str, run_ids: list[str]) -> dict[str, list[str]]:
    """Two processes claim each run at the same moment; each run's outcomes."""
    start = f"{time.time() + 1.5:.6f}"
    joined = ",".join(run_ids)
    outputs = finish([spawn("claim", url, joined, start, str(i)) for i in range(2)])
    outcomes: dict[str, list[str]] = {run_id: [] for run_id in run_ids}
    for line in "".join(outputs).splitlines():
        run_id, outcome = line.split()
        outcomes[run_id].append(outcome)
    return outcomes


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


# --- processes sharing one file ---------------------------------------------------------


async def test_opening_a_file_another_connection_is_writing_waits_to_convert_it_to_wal(
    tmp_path: Path,
) -> None:
    # Converting to WAL needs the file alone, and SQLite does not wait for that (no busy
    # handler: here it would deadlock with the writer), as when two processes open a new
    # file at the same moment. The store retries instead of failing the open.
    path = tmp_path / "rollback.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE other (x)")
    writer.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, writer.execute, ["COMMIT"]).start()
    store = SQLiteCheckpointStorage(path)
    try:
        started = time.monotonic()
        await store.setup()
        assert time.monotonic() - started >= 0.25
        assert await store.list_runs() == []
    finally:
        await store.close()
        writer.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_a_file_system_without_wal_keeps_its_journal_mode_at_once(tmp_path: Path) -> None:
    # A VFS without shared-memory locking refuses WAL without an error: the store goes on
    # in the mode SQLite gives it, without waiting for a lock that is not the cause.
    conn = sqlite3.connect(f"file:{tmp_path / 'plain.db'}?vfs=unix-none", uri=True)
    try:
        started = time.monotonic()
        sqlite_connection.use_wal(conn, timeout_s=5)
        assert time.monotonic() - started < 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


async def test_two_processes_commit_to_their_runs_on_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    seqs = ",".join(str(seq) for seq in range(1, 401))
    start = f"{time.time() + 1.5:.6f}"
    finish([spawn("commit", sqlite_url(path), f"run-proc-{i}", seqs, start) for i in range(2)])
    store = SQLiteCheckpointStorage(path)
    try:
        for i in range(2):
            run_id = f"run-proc-{i}"
            assert await store.load_steps(run_id) == [make_step(run_id, s) for s in range(1, 401)]
            assert [e.seq for e in await store.read_events(run_id)] == list(range(1, 401))
            assert [c.seq for c in await store.list_checkpoints(run_id)] == [398, 399, 400]
    finally:
        await store.close()


async def test_a_claim_race_between_processes_has_one_winner(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    store = SQLiteCheckpointStorage(path)
    run_ids = [f"run-race-{i}" for i in range(5)]
    for run_id in run_ids:
        await create(store, run_id=run_id)
    await store.close()
    outcomes = race_claims_in_processes(sqlite_url(path), run_ids)
    assert all(sorted(o) == ["locked", "won"] for o in outcomes.values()), outcomes
    store = SQLiteCheckpointStorage(path)
    for run_id in run_ids:
        stored = await store.get_run(run_id)
        assert stored is not None and stored.fence == 2
    await store.close()


# --- setup, schema, files ---------------------------------------------------------------


def _user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


async def test_setup_is_idempotent_and_records_the_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    await store.setup()
    await store.setup()
    run = await create(store)
    other = SQLiteCheckpointStorage(path)
    await other.setup()
    assert await other.get_run(run.run_id) == run
    await store.close()
    await other.close()
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 1
    assert _user_version(path) == SCHEMA_VERSION
    with sqlite3.connect(path) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert {SQLITE_RUNS_TABLE, "steps", "checkpoints", "event_batches", "journal"} <= tables
    assert "events" not in tables


async def test_a_version_1_database_keeps_its_runs_steps_and_events_after_the_migration(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v1.db"
    runs = [make_run(), make_run()]
    steps = {run.run_id: [make_step(run.run_id, seq) for seq in (1, 2)] for run in runs}
    events = {run.run_id: [make_event(run.run_id, seq) for seq in (1, 2, 3)] for run in runs}
    with sqlite3.connect(path) as conn:
        for statement in MIGRATIONS[0]:
            assert isinstance(statement, str)
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        for run in runs:
            conn.execute(INSERT_RUN, run_to_row(run))
            conn.executemany(
                "INSERT INTO steps (run_id, seq, agent, body) VALUES (?,?,?,?)",
                [(s.run_id, s.seq, s.agent, s.body) for s in steps[run.run_id]],
            )
            conn.executemany(
                "INSERT INTO events (run_id, seq, at, kind, body) VALUES (?,?,?,?,?)",
                [(e.run_id, e.seq, e.at, e.kind, e.body) for e in events[run.run_id]],
            )
    store = SQLiteCheckpointStorage(path)
    for run in runs:
        assert await store.get_run(run.run_id) == run
        assert await store.load_steps(run.run_id) == steps[run.run_id]
        assert await store.read_events(run.run_id) == events[run.run_id]
    run, rid = runs[0], runs[0].run_id
    assert await store.read_events(rid, since_seq=1, limit=1) == events[rid][1:2]
    await store.commit(
        make_commit(run, steps=[make_step(rid, 3)], events=[make_event(rid, 4)], event_seq=4)
    )
    assert [e.seq for e in await store.read_events(rid, since_seq=2)] == [3, 4]
    assert [s.seq for s in await store.load_steps(rid)] == [1, 2, 3]
    assert await store.load_steps(runs[1].run_id) == steps[runs[1].run_id]
    await store.close()
    assert _user_version(path) == SCHEMA_VERSION


async def test_a_version_6_database_gets_the_index_of_forks_a_reader_lists_them_without_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v6.db"
    runs = [make_run("p"), make_run("f1", parent_run="p"), make_run("f2", parent_run="p")]
    runs += [make_run("g", parent_run="f1"), make_run("other")]
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        for version in MIGRATIONS[:6]:
            for step in version:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
        conn.execute("PRAGMA user_version = 6")
        conn.executemany(INSERT_RUN, [run_to_row(run) for run in runs])

    def indexes() -> set[str]:
        with closing(sqlite3.connect(path)) as conn:
            return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}

    reader = SQLiteCheckpointStorage(path, read_only=True)
    assert [run.run_id for run in await reader.list_forks("p")] == ["f2", "f1"]
    assert await reader.list_forks("f1") == [runs[3]]
    await reader.close()
    assert (_user_version(path), "runs_by_parent" in indexes()) == (6, False)  # as it was

    writer = SQLiteCheckpointStorage(path)
    await writer.setup()
    assert (_user_version(path), "runs_by_parent" in indexes()) == (SCHEMA_VERSION, True)
    assert [run.run_id for run in await writer.list_forks("p")] == ["f2", "f1"]
    await writer.close()
    with closing(sqlite3.connect(path)) as conn:
        [plan] = conn.execute(f"EXPLAIN QUERY PLAN {SELECT_FORKS}", ("p", -1)).fetchall()
    assert plan[3] == "SEARCH runs USING INDEX runs_by_parent (parent_run=?)"  # no sort


async def test_a_run_created_again_under_its_id_gets_the_next_commits(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    writer, other = SQLiteCheckpointStorage(path), SQLiteCheckpointStorage(path)
    run = await create(writer, run_id="again")
    await writer.commit(make_commit(run, steps=[make_step("again", 1)]))  # remembers its key
    assert await other.delete_run("again")
    squatter = await create(other, run_id="squatter")  # may take the deleted run's key
    again = await create(other, run_id="again")
    await writer.commit(make_commit(again, steps=[make_step("again", 1), make_step("again", 2)]))
    assert [s.seq for s in await other.load_steps("again")] == [1, 2]
    assert await other.load_steps(squatter.run_id) == []
    await writer.close()
    await other.close()


async def test_a_sequence_number_beyond_the_key_range_is_refused_whole(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
    too_far = make_step(run.run_id, 2**32)
    with pytest.raises(StorageError, match=r"sequence number 4294967296 is outside"):
        await store.commit(make_commit(run, steps=[make_step(run.run_id, 2), too_far]))
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
    await store.close()


async def test_a_commit_failing_while_written_in_a_group_fails_alone(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"group-{i}") for i in range(6)]
    await store.commit(make_commit(runs[0], steps=[make_step(runs[0].run_id, 1)]))

    async def second_step(index: int) -> BaseException | None:
        rid = runs[index].run_id
        seq = 2**32 if index == 3 else 2  # run 3's step is beyond the key range
        steps = [make_step(rid, 1), make_step(rid, seq)] if index else [make_step(rid, seq)]
        try:
            await store.commit(make_commit(runs[index], steps=steps))
        except StorageError as error:
            return error
        return None

    outcomes = await asyncio.gather(*(second_step(i) for i in range(6)))
    assert [o is None for o in outcomes] == [True, True, True, False, True, True]
    assert "sequence number 4294967296 is outside" in str(outcomes[3])
    for index, run in enumerate(runs):  # run 3's commit is undone whole
        expected = [] if index == 3 else [1, 2]
        assert [s.seq for s in await store.load_steps(run.run_id)] == expected
    await store.close()


async def test_a_torn_event_batch_is_reported_as_corrupted(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    events = [make_event(run.run_id, seq) for seq in (1, 2, 3)]
    await store.commit(make_commit(run, events=events, event_seq=3))
    await store.close()
    with sqlite3.connect(path) as conn:
        (body,) = conn.execute("SELECT body FROM event_batches").fetchone()
        for cut in (0, 1, 5, len(body) // 2, len(body) - 1):
            conn.execute("UPDATE event_batches SET body = ?", (body[:cut],))
            conn.commit()
            store = SQLiteCheckpointStorage(path)
            with pytest.raises(CheckpointCorruptedError, match=r"event log of run .* is damaged"):
                await store.read_events(run.run_id)
            await store.close()


async def test_setup_is_lazy(tmp_path: Path) -> None:
    path = tmp_path / "lazy" / "n.db"
    store = SQLiteCheckpointStorage(path)
    assert not path.parent.exists()
    assert await store.get_run("run-x") is None
    assert _user_version(path) == SCHEMA_VERSION
    await store.close()


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    store = SQLiteCheckpointStorage(path)
    with pytest.raises(StorageError, match="upgrade nestegg"):
        await store.setup()
    await store.close()


async def test_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    files = sorted(path.parent.iterdir())
    assert {f.name for f in files} == {"n.db", "n.db-wal", "n.db-shm"}
    for file in files:
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file
    await store.close()


def test_from_url() -> None:
    assert SQLiteCheckpointStorage.from_url("sqlite:///runs.db").path == Path("runs.db")
    assert SQLiteCheckpointStorage.from_url("sqlite:///d/runs.db").path == Path("d/runs.db")
    assert SQLiteCheckpointStorage.from_url("sqlite:////var/x.db").path == Path("/var/x.db")
    assert SQLiteCheckpointStorage.from_url("sqlite://").path == ":memory:"
    assert isinstance(open_store("sqlite:///a%20b.db"), SQLiteCheckpointStorage)
    with pytest.raises(ConfigurationError):
        SQLiteCheckpointStorage.from_url("sqlite://host/x.db")


async def test_in_memory_store_works() -> None:
    store = SQLiteCheckpointStorage.from_url("sqlite://")
    run = await create(store)
    await commit_steps(store, run, range(1, 3))
    assert len(await store.load_steps(run.run_id)) == 2
    await store.close()


async def test_close_stops_the_thread_and_a_later_call_reopens(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())  # another test's open store keeps its own

    def workers() -> int:
        threads = set(threading.enumerate()) - threads_before
        return sum(t.name.startswith("nestegg-sqlite") for t in threads)

    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    assert workers() == 1
    await store.close()
    await store.close()
    assert workers() == 0
    assert await store.get_run(run.run_id) == run
    await store.close()


# --- the event loop keeps running -------------------------------------------------------


async def _max_tick_gap(work: asyncio.Task[object], period: float = 0.002) -> float:
    """The longest pause of a ticker that runs while ``work`` does."""
    longest, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(period)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    await work
    return longest


async def test_the_loop_keeps_ticking_while_the_database_is_locked(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    threading.Timer(0.4, blocker.commit).start()
    started = time.perf_counter()
    write = asyncio.create_task(store.commit(make_commit(run, steps=[make_step(run.run_id, 1)])))
    gap = await _max_tick_gap(write)
    assert time.perf_counter() - started >= 0.35  # the commit did wait for the lock
    assert gap < 0.1, gap
    assert len(await store.load_steps(run.run_id)) == 1
    blocker.close()
    await store.close()


async def test_the_loop_keeps_ticking_during_a_big_write(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    big = seal_json({"text": "x" * 50_000})
    steps = [StepRecord(run.run_id, seq, "agent", big) for seq in range(1, 1001)]
    write = asyncio.create_task(store.commit(make_commit(run, steps=steps)))
    gap = await _max_tick_gap(write)
    assert gap < 0.1, gap
    assert len(await store.load_steps(run.run_id, after=990)) == 10
    await store.close()


# --- which thread commits ------------------------------------------------------------------


def record_commit_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    threads: list[int] = []
    inner = sqlite_store.commit_alone

    def recording(conn: sqlite3.Connection, commit: Commit, run_keys: dict[str, int]) -> None:
        threads.append(threading.get_ident())
        inner(conn, commit, run_keys)

    monkeypatch.setattr(sqlite_store, "commit_alone", recording)
    return threads


async def test_a_small_commit_with_the_lock_free_runs_on_the_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = record_commit_threads(monkeypatch)
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    for seq in (1, 2, 3):
        await store.commit(make_commit(run, steps=[make_step(run.run_id, seq)]))
    assert threads == [threading.get_ident()] * 3
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3]
    await store.close()


async def test_a_small_group_of_commits_with_the_lock_free_runs_on_the_loop_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[tuple[int, int]] = []
    inner = sqlite_store.commit_batch

    def recorded(conn: Any, commits: Any, *args: Any) -> Any:
        batches.append((threading.get_ident(), len(commits)))
        return inner(conn, commits, *args)

    monkeypatch.setattr(sqlite_store, "commit_batch", recorded)
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"loop-{i}") for i in range(5)]
    await asyncio.gather(
        *(store.commit(make_commit(r, steps=[make_step(r.run_id, 1)])) for r in runs)
    )
    assert batches == [(threading.get_ident(), 4)]  # the first run's commit went alone
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
    await store.close()


async def test_a_big_commit_or_a_taken_lock_goes_to_the_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads = record_commit_threads(monkeypatch)
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    big = StepRecord(run.run_id, 1, "agent", seal_json({"text": "x" * 100_000}))
    await store.commit(make_commit(run, steps=[big]))
    blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    threading.Timer(0.2, blocker.commit).start()
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 2)]))
    assert threading.get_ident() not in threads and len(threads) == 2
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
    blocker.close()
    await store.close()


async def test_the_wal_is_copied_back_into_the_database_beside_the_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_connection, "_WAL_BYTES_PER_CHECKPOINT", 200_000)
    monkeypatch.setattr(sqlite_connection, "_WAL_CHECKPOINT_INTERVAL", 0.0)
    path = tmp_path / "n.db"
    threads_before = set(threading.enumerate())  # another test's open store keeps its own
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    size_before = path.stat().st_size
    text = seal_json({"text": "y" * 20_000})
    for seq in range(1, 21):
        await store.commit(make_commit(run, steps=[StepRecord(run.run_id, seq, "a", text)]))
    wal_thread = store._connection._wal_worker()
    await asyncio.wrap_future(wal_thread.submit(lambda: None))  # after the checkpoints
    assert path.stat().st_size > size_before + 10 * 20_000  # the store still open
    assert len(await store.load_steps(run.run_id)) == 20
    await store.close()
    threads_left = set(threading.enumerate()) - threads_before
    assert not [t for t in threads_left if t.name.startswith("nestegg-sqlite")]


async def test_wal_checkpoints_are_spaced_by_pages_written_and_by_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[float] = []
    inner = sqlite_connection.SQLiteConnection._checkpoint_wal

    def counted(self: sqlite_connection.SQLiteConnection) -> None:
        taken.append(time.monotonic())
        inner(self)

    monkeypatch.setattr(sqlite_connection.SQLiteConnection, "_checkpoint_wal", counted)
    monkeypatch.setattr(sqlite_connection, "_WAL_BYTES_PER_CHECKPOINT", 1)  # every write
    monkeypatch.setattr(sqlite_connection, "_WAL_CHECKPOINT_INTERVAL", 0.5)
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    for seq in range(1, 6):  # within the interval: one checkpoint
        await store.commit(make_commit(run, steps=[make_step(run.run_id, seq)]))
    wal_thread = store._connection._wal_worker()
    await asyncio.wrap_future(wal_thread.submit(lambda: None))
    assert len(taken) == 1
    await asyncio.sleep(0.6)
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 6)]))
    await asyncio.wrap_future(wal_thread.submit(lambda: None))
    assert len(taken) == 2 and taken[1] - taken[0] >= 0.5
    await store.close()


async def test_a_write_on_the_worker_does_not_wait_for_a_wal_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    inner = sqlite_connection.SQLiteConnection._checkpoint_wal

    def slow_checkpoint(self: sqlite_connection.SQLiteConnection) -> None:
        started.set()
        release.wait(5)
        inner(self)

    monkeypatch.setattr(sqlite_connection.SQLiteConnection, "_checkpoint_wal", slow_checkpoint)
    monkeypatch.setattr(sqlite_connection, "_WAL_BYTES_PER_CHECKPOINT", 1)
    monkeypatch.setattr(sqlite_connection, "_WAL_CHECKPOINT_INTERVAL", 0.0)
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
    assert await asyncio.to_thread(started.wait, 5)  # a checkpoint is under way
    big = StepRecord(run.run_id, 2, "agent", seal_json({"text": "x" * 100_000}))
    await asyncio.wait_for(store.commit(make_commit(run, steps=[big])), 2)  # on the worker
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
    release.set()
    await store.close()


async def test_a_failure_after_begin_leaves_no_transaction_and_the_next_commit_works(
    tmp_path: Path,
) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
    unsaveable = CheckpointRecord("c-2", run.run_id, 2, 0.0, "step", None)  # type: ignore[arg-type]
    with pytest.raises(StorageError, match="NOT NULL"):  # fails at its last insert
        await store.commit(
            make_commit(run, steps=[make_step(run.run_id, 2)], checkpoints=[unsaveable])
        )
    assert not store._connection._conn.in_transaction  # type: ignore[union-attr]
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
    other = sqlite3.connect(path, isolation_level=None, timeout=0.5)
    other.execute("BEGIN IMMEDIATE")  # the write lock was let go
    other.rollback()
    other.close()
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 2)]))
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
    await store.close()


async def test_the_worker_waits_for_the_write_lock_after_commits_on_the_loop_thread(
    tmp_path: Path,
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    await commit_steps(store, run, range(1, 4))

    def busy_timeout(conn: sqlite3.Connection) -> int:
        value: int = conn.execute("PRAGMA busy_timeout").fetchone()[0]
        return value

    assert await store._connection.call(busy_timeout) == SQLITE_BUSY_TIMEOUT_MS
    await store.close()


def test_a_forked_child_opens_its_own_connection(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")

    async def first() -> Any:
        run = await create(store)
        await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
        return run

    run = asyncio.run(first())

    async def in_child() -> None:
        await store.commit(make_commit(run, steps=[make_step(run.run_id, 2)]))
        assert len(await store.load_steps(run.run_id)) == 2
        await store.close()

    pid = os.fork()
    if pid == 0:  # the child: exit code 0 only if its commit and read worked
        code = 1
        try:
            asyncio.run(asyncio.wait_for(in_child(), 10))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

    async def last() -> list[int]:
        seqs = [s.seq for s in await store.load_steps(run.run_id)]
        await store.close()
        return seqs

    assert asyncio.run(last()) == [1, 2]


# --- errors -----------------------------------------------------------------------------


async def test_a_lock_held_beyond_the_busy_timeout_is_a_storage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "SQLITE_BUSY_TIMEOUT_MS", 100)
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StorageError, match="stayed locked") as caught:
            await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
        assert not isinstance(caught.value, StorageUnavailableError)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    finally:
        blocker.rollback()
        blocker.close()
    await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
    assert len(await store.load_steps(run.run_id)) == 1
    await store.close()


async def test_a_path_that_cannot_be_opened_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    store = SQLiteCheckpointStorage(tmp_path / "file" / "n.db")
    with pytest.raises(StorageUnavailableError):
        await store.setup()
    await store.close()  # a directory: a ConfigurationError when built (below)


async def test_a_file_that_is_no_database_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database, only some text" * 200)
    store = SQLiteCheckpointStorage(path)
    with pytest.raises(StorageError, match="not a database"):
        await store.setup()
    await store.close()


async def test_a_failing_commit_is_rolled_back_whole(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    before = (
        await store.get_run(run.run_id),
        await store.load_steps(run.run_id),
        await store.list_checkpoints(run.run_id),
    )
    bad_checkpoint = CheckpointRecord(  # fails the commit's last insert
        "c-3",
        run.run_id,
        3,
        0.0,
        "step",
        None,  # type: ignore[arg-type]
    )
    commit = make_commit(
        run,
        steps=[make_step(run.run_id, 3)],
        checkpoints=[make_checkpoint(run.run_id, 3), bad_checkpoint],
        prune=[c.checkpoint_id for c in before[2]],
        truncate_after=1,
        events=[make_event(run.run_id, 3)],
        step_seq=3,
    )
    with pytest.raises(StorageError, match="NOT NULL"):
        await store.commit(commit)
    after = (
        await store.get_run(run.run_id),
        await store.load_steps(run.run_id),
        await store.list_checkpoints(run.run_id),
    )
    assert after == before
    await store.close()


# --- size on disk -----------------------------------------------------------------------


async def test_a_thousand_steps_with_pruned_checkpoints_stay_small(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store)
    rid, kept = run.run_id, []
    for seq in range(1, 1001):
        step = StepRecord(rid, seq, "agent", seal_json({"content": "y" * 1150, "seq": seq}))
        checkpoint = make_checkpoint(rid, seq)
        kept.append(checkpoint.checkpoint_id)
        events = [make_event(rid, 3 * seq - i) for i in range(3)]
        await store.commit(
            Commit(
                run_id=rid,
                fence=run.fence,
                steps=[step],
                events=events,
                checkpoints=[checkpoint],
                prune=kept[:-3],
                step_seq=seq,
                event_seq=3 * seq,
                updated_at=time.time(),
            )
        )
        del kept[:-3]
    await store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = sum(f.stat().st_size for f in tmp_path.iterdir())
    assert size <= 2_500_000, size


def test_a_directory_is_refused_when_the_store_is_built(tmp_path: Path) -> None:
    for given in (tmp_path, str(tmp_path)):
        with pytest.raises(ConfigurationError) as refused:
            SQLiteCheckpointStorage(given)
        assert str(refused.value) == (
            f"SQLiteCheckpointStorage path {str(tmp_path)!r} is a directory: it needs the path "
            f"of a database file (such as {str(tmp_path / 'nestegg.db')!r})"
        )
    with pytest.raises(ConfigurationError, match="is a directory"):
        open_store(f"sqlite:///{tmp_path}")


async def test_a_body_column_altered_into_text_or_a_number_reads_as_damaged(
    tmp_path: Path,
) -> None:
    # A row changed by hand (sqlite3 "UPDATE steps SET body = replace(body, ...)") holds
    # TEXT where the store wrote a BLOB: it reads as bytes, and the record's checksum check
    # names it, as for a BLOB altered in place, rather than a TypeError far from the store.
    path = tmp_path / "x.db"
    store = SQLiteCheckpointStorage(path)
    run = await create(store, run_id="r")
    blocked = await commit_steps(store, run, range(1, STEP_BLOCK_STEPS + 1))  # one block
    await store.commit(
        make_commit(
            run,
            steps=[make_step("r", STEP_BLOCK_STEPS + 1)],
            checkpoints=[make_checkpoint("r", STEP_BLOCK_STEPS + 1, checkpoint_id="c")],
            journal=[make_journal("r", STEP_BLOCK_STEPS + 1, 0)],
            step_seq=STEP_BLOCK_STEPS + 1,
        )
    )
    await store.put_signal(SignalRecord("r", "go", 1.0, seal_json("r")))
    await store.close()
    with closing(sqlite3.connect(path)) as conn, conn:
        for table, was, now in (
            *((table, '"r"', '"R"') for table in ("steps", "checkpoints", "signals")),
            ("journal", "fetch", "fetcH"),
            ("event_batches", "r", "R"),
        ):
            conn.execute(f"UPDATE {table} SET body = replace(body, ?, ?)", (was, now))
        assert {type_ for (type_,) in conn.execute("SELECT typeof(body) FROM steps")} == {"text"}
    store = SQLiteCheckpointStorage(path)
    try:
        steps = await store.load_steps("r", upto=STEP_BLOCK_STEPS + 1)
        checkpoint = await store.get_checkpoint("c")
        assert checkpoint is not None
        assert steps[:-1] == blocked  # packed in a block, which stayed a BLOB
        records = [
            steps[-1],
            checkpoint,
            *await store.list_checkpoints("r"),
            *await store.read_journal("r", STEP_BLOCK_STEPS + 1),
            *await store.read_signals("r"),
        ]
        assert_bytes_fields(*records)
        for record in records:
            with pytest.raises(CheckpointCorruptedError, match="failed its checksum"):
                unseal(record.body, "record")
        await store.read_events("r")  # text batches: torn or damaged events, not a TypeError
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("UPDATE step_blocks SET body = 7")
        with pytest.raises(CheckpointCorruptedError):  # as for a torn block
            await store.load_steps("r")
    finally:
        await store.close()
