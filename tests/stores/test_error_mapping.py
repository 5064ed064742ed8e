"""Each store turns its driver's failures into nestegg's exception tree, in one place.

No raw ``sqlite3.Error``, ``OSError``, ``psycopg.Error`` or ``redis.RedisError`` reaches
the caller: an unreachable store is ``StorageUnavailableError``, anything else the driver
reports is ``StorageError``, with the driver's exception as ``__cause__``.
"""

from __future__ import annotations

import asyncio
import socket
import sqlite3
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.file import FileCheckpointStorage
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage, storage_error
from nestegg.errors import NestEggError, StorageError, StorageUnavailableError
from nestegg.testing.builders import commit_steps, create
from tests.servers import delete_redis_keys, drop_postgres_tables

UNREACHABLE_DEADLINE_S = 20


def _closed_port() -> int:
    """A local TCP port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def _raises(
    expected: type[Exception], call: Callable[[], Awaitable[Any]], driver_error: Any = None
) -> Exception:
    """Await ``call``; it must raise ``expected`` (never the driver's own error)."""
    with pytest.raises(expected) as caught:
        async with asyncio.timeout(UNREACHABLE_DEADLINE_S):
            await call()
    error = caught.value
    if driver_error is not None:
        # StorageUnavailableError is a ConnectionError, hence an OSError: only check the cause.
        if not issubclass(expected, driver_error):
            assert not isinstance(error, driver_error)
        assert isinstance(error.__cause__, driver_error), repr(error.__cause__)
    return error


def _readers(store: CheckpointStorage, run_id: str) -> list[Callable[[], Awaitable[Any]]]:
    return [
        lambda: store.get_run(run_id),
        lambda: store.list_runs(),
        lambda: store.load_steps(run_id),
        lambda: store.read_events(run_id),
        lambda: store.list_checkpoints(run_id),
        lambda: store.read_journal(run_id, 1),
    ]


# --- SQLite -----------------------------------------------------------------------------


async def test_sqlite_file_that_is_not_a_database_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    path.write_bytes(b"this is not a database, just bytes\n" * 200)
    store = SQLiteCheckpointStorage(path)
    try:
        await _raises(StorageError, store.setup, sqlite3.Error)
        await _raises(StorageError, lambda: store.get_run("r"), sqlite3.Error)
    finally:
        await store.close()


async def test_sqlite_path_under_a_regular_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    store = SQLiteCheckpointStorage(tmp_path / "plain" / "n.db")
    try:
        await _raises(StorageUnavailableError, store.setup, OSError)
    finally:
        await store.close()


async def test_sqlite_newer_schema_is_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 999999")
    conn.close()
    store = SQLiteCheckpointStorage(path)
    try:
        error = await _raises(StorageError, store.setup)
        assert not isinstance(error, StorageUnavailableError)
        assert "upgrade" in str(error)
    finally:
        await store.close()


async def test_sqlite_tables_dropped_behind_its_back_are_a_storage_error(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    try:
        await create(store, run_id="run-1")
        with sqlite3.connect(path) as conn:
            tables = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
            ]
            for table in tables:
                conn.execute(f'DROP TABLE "{table}"')
        conn.close()
        error = await _raises(StorageError, lambda: store.get_run("run-1"), sqlite3.Error)
        assert not isinstance(error, StorageUnavailableError)
    finally:
        await store.close()


def _error_of(conn: sqlite3.Connection, sql: str) -> sqlite3.Error:
    """The error sqlite3 raises running ``sql`` on ``conn`` (closed afterwards)."""
    try:
        with pytest.raises(sqlite3.Error) as caught:
            conn.execute(sql)
        return caught.value
    finally:
        conn.close()


def _locked(path: Path) -> sqlite3.Error:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    try:
        return _error_of(sqlite3.connect(path, timeout=0), "INSERT INTO t VALUES (1)")
    finally:
        holder.close()


def _cannot_open(path: Path) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as caught:
        sqlite3.connect(path.parent / "missing" / path.name)
    return caught.value


def _read_only(path: Path) -> sqlite3.Error:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    return _error_of(reader, "INSERT INTO t VALUES (1)")


def _not_a_database(path: Path) -> sqlite3.Error:
    path.write_bytes(b"this is not a database, only some text" * 200)
    return _error_of(sqlite3.connect(path), "SELECT * FROM sqlite_master")


def _constraint(path: Path) -> sqlite3.Error:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x NOT NULL)")
    return _error_of(conn, "INSERT INTO t VALUES (NULL)")


def _closed(path: Path) -> sqlite3.Error:
    conn = sqlite3.connect(path)
    conn.close()
    return _error_of(conn, "SELECT 1")


def _disk_io(path: Path) -> sqlite3.Error:
    # A real I/O error needs a failing disk; this is the error SQLite raises then.
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode = sqlite3.SQLITE_IOERR_SHORT_READ
    exc.sqlite_errorname = "SQLITE_IOERR_SHORT_READ"
    return exc


@pytest.mark.parametrize(
    ("provoke", "expected", "text"),
    [
        (_locked, StorageError, "stayed locked"),
        (_cannot_open, StorageUnavailableError, "cannot be used"),
        (_read_only, StorageUnavailableError, "cannot be used"),
        (_disk_io, StorageUnavailableError, "cannot be used"),
        (_not_a_database, StorageError, "failed"),
        (_constraint, StorageError, "failed"),
        (_closed, StorageError, "not usable"),
    ],
    ids=["locked", "cannot-open", "read-only", "disk-io", "not-a-database", "constraint", "closed"],
)
def test_sqlite_errors_map_by_their_result_code_and_class(
    tmp_path: Path, provoke: Callable[[Path], sqlite3.Error], expected: type[Exception], text: str
) -> None:
    mapped = storage_error(provoke(tmp_path / "n.db"), "n.db")
    assert type(mapped) is expected
    assert "n.db" in str(mapped) and text in str(mapped)


def test_the_message_never_decides_a_sqlite_error() -> None:
    # Words of a lock or an outage without SQLite's code change nothing, and back.
    worded = sqlite3.OperationalError("database is locked; disk I/O error; unable to open")
    assert type(storage_error(worded, "n.db")) is StorageError
    assert "stayed locked" not in str(storage_error(worded, "n.db"))
    coded = sqlite3.OperationalError("something")
    coded.sqlite_errorcode = sqlite3.SQLITE_CANTOPEN
    assert type(storage_error(coded, "n.db")) is StorageUnavailableError
    assert type(storage_error(PermissionError(13, "denied"), "n.db")) is StorageUnavailableError


# --- file -------------------------------------------------------------------------------


async def test_file_root_under_a_regular_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    store = FileCheckpointStorage(tmp_path / "plain" / "store")
    await _raises(StorageUnavailableError, store.setup, OSError)
    await _raises(StorageUnavailableError, lambda: store.get_run("run-1"), OSError)


@pytest.mark.parametrize(
    "garbage", [b"", b"\x00\xff garbage {", b'{"seq":', b"[]\n{}\n", b"{}", b"null"]
)
async def test_file_store_damaged_files_never_leak_raw_errors(
    tmp_path: Path, garbage: bytes
) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store, run_id="run-1")
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    leaks = []
    for path in sorted(p for p in tmp_path.rglob("*") if p.is_file()):
        kept = path.read_bytes()
        path.write_bytes(garbage)
        for number, read in enumerate(_readers(store, "run-1")):
            try:
                await read()
            except NestEggError:
                pass
            except Exception as exc:
                leaks.append(f"{path.relative_to(tmp_path)} (reader {number}): {exc!r}")
        path.write_bytes(kept)
    assert not leaks, "\n".join(leaks)


# --- PostgreSQL -------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("retries", [0, 1])
async def test_postgres_unreachable_url_is_unavailable(retries: int) -> None:
    import psycopg

    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    url = f"postgresql://postgres@127.0.0.1:{_closed_port()}/test"
    store = PostgresCheckpointStorage(url, connect_timeout=2, retries=retries)
    try:
        await _raises(StorageUnavailableError, store.setup, psycopg.Error)
        await _raises(StorageUnavailableError, lambda: store.get_run("run-1"), psycopg.Error)
    finally:
        await store.close()


@pytest.mark.server
async def test_postgres_tables_dropped_behind_its_back_are_a_storage_error(pg_url: str) -> None:
    import psycopg

    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    prefix = f"t{uuid.uuid4().hex[:12]}_"
    store = PostgresCheckpointStorage(pg_url, table_prefix=prefix)
    try:
        await create(store, run_id="run-1")
        await drop_postgres_tables(pg_url, prefix)
        error = await _raises(StorageError, lambda: store.get_run("run-1"), psycopg.Error)
        assert not isinstance(error, StorageUnavailableError)
    finally:
        await store.close()
        await drop_postgres_tables(pg_url, prefix)


# --- Redis ------------------------------------------------------------------------------


@pytest.mark.server
@pytest.mark.parametrize("retries", [0, 1])
async def test_redis_unreachable_url_is_unavailable(retries: int) -> None:
    import redis

    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    url = f"redis://127.0.0.1:{_closed_port()}/0"
    store = RedisCheckpointStorage(url, connect_timeout=2, retries=retries)
    try:
        await _raises(StorageUnavailableError, store.setup, redis.RedisError)
        await _raises(StorageUnavailableError, lambda: store.get_run("run-1"), redis.RedisError)
    finally:
        await store.close()


@pytest.mark.server
async def test_redis_keys_of_the_wrong_type_are_a_storage_error(redis_url: str) -> None:
    import redis
    import redis.asyncio as aioredis

    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    prefix = f"nestegg-test:{uuid.uuid4().hex[:12]}:"
    store = RedisCheckpointStorage(redis_url, prefix=prefix)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await store.setup()
        run = await create(store, run_id="run-1")
        await commit_steps(store, run, range(1, 3), checkpoints=True)
        keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
        assert keys
        for key in keys:
            await client.delete(key)
            await client.rpush(key, b"not what the store wrote")
        error = await _raises(StorageError, lambda: store.get_run("run-1"), redis.RedisError)
        assert not isinstance(error, StorageUnavailableError)
    finally:
        await client.aclose()
        await store.close()
        await delete_redis_keys(redis_url, prefix)
