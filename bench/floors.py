"""What the machine itself charges: the floor under one durable step on each store.

Measured in rounds, interleaved, medians of the per-operation means: a thread hop from
the event loop (``run_in_executor`` of a no-op), a SQLite commit of one ~1 KB row (WAL,
synchronous=NORMAL) on the loop thread and through a worker thread, a PostgreSQL
autocommit insert of one ~1 KB row and a ``SELECT 1`` round trip (psycopg async, one
connection), and a Redis ``SET`` of ~1 KB (redis-py asyncio). Servers:
``NESTEGG_TEST_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``) and
``NESTEGG_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``); a server that does not
answer is left out with a note. server_stores.py measures the server floors beside its
own results with the same probes.

    .venv-bench/bin/python bench/floors.py [--ops 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import psycopg
import redis.asyncio as aioredis
from harness import Table, fmt_us, median, message, print_tables
from psycopg import sql

PG_URL = os.environ.get("NESTEGG_TEST_PG_URL") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("NESTEGG_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
ROW = orjson.dumps(message(1))
Probe = Callable[[int], Awaitable[float]]


def open_sqlite(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, body BLOB)")
    return conn


def sqlite_commit(conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO floor (body) VALUES (?)", (ROW,))
    conn.execute("COMMIT")


class Floors:
    """Holds the connections; each probe returns the mean seconds of one operation."""

    def __init__(self, directory: Path) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.sqlite = open_sqlite(directory / "floor.db")
        self.pg: psycopg.AsyncConnection[Any] | None = None
        self.pg_table = f"bench_floor_{uuid.uuid4().hex[:8]}"
        self.redis: Any = None
        self.redis_key = f"bench_floor_{uuid.uuid4().hex[:8]}"
        self.notes: list[str] = []

    async def open_servers(self) -> None:
        try:
            self.pg = await psycopg.AsyncConnection.connect(PG_URL, autocommit=True)
            await self.pg.execute(
                sql.SQL("CREATE TABLE {} (id bigserial PRIMARY KEY, body bytea)").format(
                    sql.Identifier(self.pg_table)
                )
            )
        except Exception as exc:
            self.notes.append(f"PostgreSQL left out: {exc}")
            self.pg = None
        try:
            self.redis = aioredis.from_url(REDIS_URL)
            await self.redis.ping()
        except Exception as exc:
            self.notes.append(f"Redis left out: {exc}")
            self.redis = None

    async def close(self) -> None:
        self.executor.shutdown(wait=True)
        self.sqlite.close()
        if self.pg is not None:
            await self.pg.execute(
                sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.pg_table))
            )
            await self.pg.close()
        if self.redis is not None:
            await self.redis.delete(self.redis_key)
            await self.redis.aclose()

    async def thread_hop(self, ops: int) -> float:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for _ in range(ops):
            await loop.run_in_executor(self.executor, int)
        return (time.perf_counter() - start) / ops

    async def sqlite_inline(self, ops: int) -> float:
        start = time.perf_counter()
        for _ in range(ops):
            sqlite_commit(self.sqlite)
        return (time.perf_counter() - start) / ops

    async def sqlite_threaded(self, ops: int) -> float:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for _ in range(ops):
            await loop.run_in_executor(self.executor, sqlite_commit, self.sqlite)
        return (time.perf_counter() - start) / ops

    async def pg_insert(self, ops: int) -> float:
        assert self.pg is not None
        query = sql.SQL("INSERT INTO {} (body) VALUES (%s)").format(sql.Identifier(self.pg_table))
        start = time.perf_counter()
        for _ in range(ops):
            await self.pg.execute(query, (ROW,))
        return (time.perf_counter() - start) / ops

    async def pg_select(self, ops: int) -> float:
        assert self.pg is not None
        start = time.perf_counter()
        for _ in range(ops):
            await self.pg.execute("SELECT 1")
        return (time.perf_counter() - start) / ops

    async def redis_set(self, ops: int) -> float:
        start = time.perf_counter()
        for _ in range(ops):
            await self.redis.set(self.redis_key, ROW)
        return (time.perf_counter() - start) / ops

    def probes(self) -> dict[str, Probe]:
        probes: dict[str, Probe] = {
            "thread hop (run_in_executor of a no-op)": self.thread_hop,
            "SQLite commit of a ~1 KB row, on the loop thread": self.sqlite_inline,
            "SQLite commit of a ~1 KB row, through a worker thread": self.sqlite_threaded,
        }
        if self.pg is not None:
            probes["PostgreSQL autocommit INSERT of a ~1 KB row"] = self.pg_insert
            probes["PostgreSQL SELECT 1 round trip"] = self.pg_select
        if self.redis is not None:
            probes["Redis SET of ~1 KB"] = self.redis_set
        return probes


async def run(ops: int, rounds: int) -> list[Table]:
    with tempfile.TemporaryDirectory(prefix="nestegg-floor-") as tmp:
        floors = Floors(Path(tmp))
        try:
            await floors.open_servers()
            probes = floors.probes()
            seconds: dict[str, list[float]] = {name: [] for name in probes}
            for _ in range(rounds):
                for name, probe in probes.items():
                    seconds[name].append(await probe(ops))
        finally:
            await floors.close()
    table = Table(
        title="Floors: what one operation costs on this machine",
        headers=["operation", "µs", "rounds"],
    )
    for name, values in seconds.items():
        table.rows.append([name, fmt_us(median(values)), str(rounds)])
    table.notes.append(f"Median over {rounds} rounds of the mean of {ops:,} operations each.")
    table.notes.extend(floors.notes)
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print_tables(asyncio.run(run(args.ops, args.rounds)))


if __name__ == "__main__":
    main()
