"""The ``store`` fixture: every checkpoint store, each isolated, for the contract suite.

memory, file (a temp dir), sqlite (a temp file), postgres (its own table prefix, dropped
afterwards) and redis (its own key prefix, deleted afterwards). The server stores skip
when their server cannot be reached (fail under ``CI=true``, see tests/conftest.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.stores.base import CheckpointStorage

STORE_KINDS = ("memory", "file", "sqlite", "postgres", "redis")
SERVER_KINDS = ("postgres", "redis")

StoreFactory = Callable[[], Awaitable[CheckpointStorage]]


def _open_memory(_: pytest.FixtureRequest, __: Path) -> tuple[Callable[[], Any], Any]:
    from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage

    shared = MemoryCheckpointStorage()
    return (lambda: shared), None


def _open_file(_: pytest.FixtureRequest, tmp_path: Path) -> tuple[Callable[[], Any], Any]:
    from nestegg.checkpoint.stores.file import FileCheckpointStorage

    return (lambda: FileCheckpointStorage(tmp_path)), None


def _open_sqlite(_: pytest.FixtureRequest, tmp_path: Path) -> tuple[Callable[[], Any], Any]:
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

    path = tmp_path / "n.db"
    return (lambda: SQLiteCheckpointStorage(path)), None


def _open_postgres(request: pytest.FixtureRequest, _: Path) -> tuple[Callable[[], Any], Any]:
    url = request.getfixturevalue("pg_url")
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    prefix = f"t{uuid.uuid4().hex[:12]}_"

    async def sweep() -> None:
        await drop_postgres_tables(url, prefix)

    return (lambda: PostgresCheckpointStorage(url, table_prefix=prefix)), sweep


def _open_redis(request: pytest.FixtureRequest, _: Path) -> tuple[Callable[[], Any], Any]:
    url = request.getfixturevalue("redis_url")
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    prefix = f"nestegg-test:{uuid.uuid4().hex[:12]}:"

    async def sweep() -> None:
        await delete_redis_keys(url, prefix)

    return (lambda: RedisCheckpointStorage(url, prefix=prefix)), sweep


_OPENERS = {
    "memory": _open_memory,
    "file": _open_file,
    "sqlite": _open_sqlite,
    "postgres": _open_postgres,
    "redis": _open_redis,
}


async def drop_postgres_tables(url: str, prefix: str) -> None:
    """Drop every table and function whose name starts with ``prefix`` (what ``drop()`` left)."""
    import psycopg
    from psycopg import sql

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables"
            " WHERE left(table_name, %s) = %s",
            (len(prefix), prefix),
        )
        for schema, table in await cursor.fetchall():
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(schema, table))
            )
        cursor = await conn.execute(
            "SELECT oid::regprocedure::text FROM pg_proc WHERE left(proname, %s) = %s",
            (len(prefix), prefix),
        )
        for (function,) in await cursor.fetchall():
            await conn.execute(
                sql.SQL("DROP FUNCTION IF EXISTS {} CASCADE").format(sql.SQL(function))
            )


async def delete_redis_keys(url: str, prefix: str) -> None:
    """Delete every key under ``prefix`` (whatever ``drop()`` left)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.unlink(*keys)
    finally:
        await client.aclose()


@pytest.fixture(
    params=[
        pytest.param(kind, marks=[pytest.mark.server] if kind in SERVER_KINDS else [])
        for kind in STORE_KINDS
    ]
)
async def store_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    """Opens (and sets up) handles on one isolated location of one kind of store.

    Every handle sees the same data (for memory: the same object). All are closed, and a
    server location dropped, when the test ends.
    """
    build, sweep = _OPENERS[request.param](request, tmp_path)
    opened: list[CheckpointStorage] = []

    async def open_handle() -> CheckpointStorage:
        handle: CheckpointStorage = build()
        opened.append(handle)
        await handle.setup()
        return handle

    yield open_handle

    try:
        drop = getattr(opened[0], "drop", None) if opened else None
        if drop is not None:
            await drop()
    finally:
        for handle in reversed(opened):
            await handle.close()
        if sweep is not None:
            await sweep()


@pytest.fixture
async def store(store_factory: StoreFactory) -> CheckpointStorage:
    """One set-up store of each kind, isolated from every other test."""
    return await store_factory()
