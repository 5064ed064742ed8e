"""LangGraph's checkpointer, side by side: NestEggSaver against SqliteSaver and PostgresSaver.

The workload of ``langgraph_workload.py``: a graph whose one node appends a ~1 KB message
to ``messages`` (``operator.add``) per step, invoked with ``durability="sync"`` (each
checkpoint committed before the next step starts). The same graph runs on LangGraph's
``SqliteSaver`` (synchronous=NORMAL, as nestegg's SQLite store), on ``NestEggSaver`` over
nestegg's SQLite store, on LangGraph's ``PostgresSaver`` (autocommit, own schema) and on
``NestEggSaver`` over nestegg's PostgreSQL store (own table prefix), interleaved in this one
process; then NestEggSaver alone on Redis. Measured: steps per second and the bytes stored
(SQLite: database and WAL after a ``wal_checkpoint(TRUNCATE)``; PostgreSQL: the tables with
their indexes and TOAST after a ``CHECKPOINT``; Redis: ``MEMORY USAGE`` of the keys).
Then NestEggSaver's bytes per step at 100, 1,000 and 10,000 steps (linear storage).

    .venv-bench/bin/python bench/langgraph_saver.py [--steps 1000] [--reps 3]
        [--linear 100 1000 10000] [--stores sqlite postgres redis]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from checkpoint_vs_langgraph import truncate_wal
from floors import PG_URL, REDIS_URL, Floors
from harness import (
    Table,
    directory_bytes,
    fmt_bytes,
    fmt_int,
    fmt_ratio,
    fmt_us,
    median,
    print_tables,
)
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph_workload import build_loop, run_loop
from server_stores import (
    langgraph_pg_sample,
    pg_drop_prefixed,
    pg_prefixed_bytes,
    redis_drop_prefixed,
    redis_prefixed_bytes,
)

from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.langgraph import NestEggSaver

Sample = tuple[float, int]
"""Seconds and bytes stored."""
FLOOR_OPS = 200
"""Autocommit inserts timed for the PostgreSQL commit floor of a repetition."""


def timed_loop(store: Any, steps: int) -> float:
    """Seconds the loop graph takes on a NestEggSaver over ``store`` (closed afterwards);
    set up before the clock starts, as the LangGraph savers are."""
    with NestEggSaver(store, close_storage=True) as saver:
        saver.setup()
        app = build_loop(saver, steps)
        start = time.perf_counter()
        run_loop(app, "t", steps)
        return time.perf_counter() - start


def sqlite_saver(steps: int) -> Sample:
    with tempfile.TemporaryDirectory(prefix="lg-sqlite-") as tmp:
        db_path = Path(tmp) / "langgraph.db"
        conn = sqlite3.connect(db_path, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            saver = SqliteSaver(conn)
            saver.setup()
            app = build_loop(saver, steps)
            start = time.perf_counter()
            run_loop(app, "t", steps)
            elapsed = time.perf_counter() - start
        finally:
            conn.close()
        truncate_wal(db_path)
        return elapsed, directory_bytes(Path(tmp))


def nestegg_sqlite(steps: int) -> Sample:
    with tempfile.TemporaryDirectory(prefix="lg-nestegg-") as tmp:
        db_path = Path(tmp) / "nestegg.db"
        elapsed = timed_loop(SQLiteCheckpointStorage(db_path), steps)
        truncate_wal(db_path)
        return elapsed, directory_bytes(Path(tmp))


def postgres_saver(steps: int) -> Sample:
    return langgraph_pg_sample(steps, 0, f"bench_lg_{uuid.uuid4().hex[:8]}")


def nestegg_postgres(steps: int) -> Sample:
    prefix = f"bench_lgs_{uuid.uuid4().hex[:8]}_"
    try:
        elapsed = timed_loop(PostgresCheckpointStorage(PG_URL, table_prefix=prefix), steps)
        return elapsed, asyncio.run(pg_prefixed_bytes(prefix))
    finally:
        asyncio.run(pg_drop_prefixed(prefix))


def nestegg_redis(steps: int) -> Sample:
    prefix = f"bench-lgs:{uuid.uuid4().hex[:8]}:"
    try:
        elapsed = timed_loop(RedisCheckpointStorage(REDIS_URL, prefix=prefix), steps)
        return elapsed, asyncio.run(redis_prefixed_bytes(prefix))
    finally:
        asyncio.run(redis_drop_prefixed(prefix))


SIDES: dict[str, Callable[[int], Sample]] = {
    "LangGraph SqliteSaver": sqlite_saver,
    "NestEggSaver (SQLite)": nestegg_sqlite,
    "LangGraph PostgresSaver": postgres_saver,
    "NestEggSaver (PostgreSQL)": nestegg_postgres,
    "NestEggSaver (Redis)": nestegg_redis,
}
STORES = {
    "sqlite": ("LangGraph SqliteSaver", "NestEggSaver (SQLite)"),
    "postgres": ("LangGraph PostgresSaver", "NestEggSaver (PostgreSQL)"),
    "redis": ("NestEggSaver (Redis)",),
}
"""The sides each ``--stores`` choice runs."""
PAIRS = (
    ("NestEggSaver (SQLite)", "LangGraph SqliteSaver"),
    ("NestEggSaver (PostgreSQL)", "LangGraph PostgresSaver"),
)


async def pg_commit_floor() -> float:
    """Mean seconds of an autocommit INSERT of a ~1 KB row (one commit, WAL flushed)."""
    with tempfile.TemporaryDirectory(prefix="lg-floor-") as tmp:
        probes = Floors(Path(tmp))
        await probes.open_servers()
        try:
            return await probes.pg_insert(FLOOR_OPS)
        finally:
            await probes.close()


def side_by_side(steps: int, reps: int, sides: list[str]) -> Table:
    samples: dict[str, list[Sample]] = {name: [] for name in sides}
    floors: list[float] = []
    for rep in range(reps):
        if "LangGraph PostgresSaver" in sides:
            floors.append(asyncio.run(pg_commit_floor()))
        names = sides if rep % 2 == 0 else list(reversed(sides))
        for name in names:
            samples[name].append(SIDES[name](steps))
            print(f"  {name} rep {rep + 1}: {samples[name][-1]}", flush=True)
    rate = {n: steps / median([s for s, _ in v]) for n, v in samples.items()}
    stored = {n: median([b for _, b in v]) for n, v in samples.items()}
    table = Table(
        f'{steps} steps, a ~1 KB message each, durability="sync" (median of {reps})',
        ["saver", "steps/s", "stored", "vs LangGraph: steps/s", "vs LangGraph: less stored"],
    )
    anchors = dict(PAIRS)
    for name in sides:
        anchor = anchors.get(name)
        speed = fmt_ratio(rate[name] / rate[anchor]) if anchor in rate else ""
        less = fmt_ratio(stored[anchor] / stored[name]) if anchor in stored else ""
        table.rows.append([name, fmt_int(rate[name]), fmt_bytes(stored[name]), speed, less])
    for name, anchor in PAIRS:
        if name in samples and anchor in samples:
            per_rep = ", ".join(
                f"{a:.2f} s / {n:.2f} s = {fmt_ratio(a / n)}"
                for (n, _), (a, _) in zip(samples[name], samples[anchor], strict=True)
            )
            table.notes.append(f"{anchor} / {name}, per repetition: {per_rep}")
    if floors:
        table.notes.append(
            f"PostgreSQL commit floor (an autocommit INSERT of ~1 KB, {FLOOR_OPS} in a row "
            f"before each repetition): median {fmt_us(median(floors))} µs "
            f"({', '.join(fmt_us(f) for f in floors)})"
        )
    return table


def linear(sizes: list[int]) -> Table:
    table = Table(
        "NestEggSaver (SQLite): bytes stored per step",
        ["steps", "stored", "bytes per step", "steps/s"],
    )
    for steps in sizes:
        elapsed, stored = nestegg_sqlite(steps)
        table.rows.append(
            [fmt_int(steps), fmt_bytes(stored), fmt_int(stored / steps), fmt_int(steps / elapsed)]
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--linear", type=int, nargs="*", default=[100, 1000, 10_000])
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=sorted(STORES),
        default=sorted(STORES),
        help="run only these stores' savers (each with its LangGraph anchor)",
    )
    args = parser.parse_args()
    with psycopg.Connection.connect(PG_URL):  # fail early without the server
        pass
    sides = [name for name in SIDES if any(name in STORES[s] for s in args.stores)]
    tables = [side_by_side(args.steps, args.reps, sides)]
    if args.linear:
        tables.append(linear(args.linear))
    print_tables(tables)


if __name__ == "__main__":
    main()
