"""Durable checkpoints on the servers: PostgreSQL (against LangGraph's PostgresSaver) and Redis.

The workload of ``checkpoint_vs_langgraph.py``: one agent loop, a ~1 KB message per step,
a durable checkpoint after every step (``every_n_steps=1, keep_latest=3,
durability="sync"``). nestegg's ``SQLCheckpointStorage(postgresql://...)`` runs interleaved
with LangGraph's ``PostgresSaver`` (autocommit connection, ``durability="sync"``) in this
one process; nestegg's ``RedisCheckpointStorage`` runs alone (LangGraph's Redis saver needs
Redis modules). Then 200 runs of 50 steps at once, on each store, in one process.

Each repetition also measures the floors of ``floors.py`` on the servers (a PostgreSQL
autocommit INSERT of a ~1 KB row, a Redis SET of ~1 KB): each result is given as a
multiple of its server's floor measured in the same run, so that results taken on a
slower or busier machine compare (targets: PostgreSQL at most 2.5x, Redis 2.7x).

Each measurement uses its own table prefix (nestegg), schema (LangGraph) or key prefix,
dropped afterwards. Servers: ``NESTEGG_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), ``NESTEGG_TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``).

    .venv-bench/bin/python bench/server_stores.py [--sizes 100 1000 10000] [--reps N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import redis.asyncio as aioredis
from floors import PG_URL, REDIS_URL, Floors
from harness import (
    LARGE_TIMEOUT,
    START_INPUT,
    Table,
    dump_tasks_on_sigusr1,
    fmt_bytes,
    fmt_int,
    fmt_ratio,
    fmt_us,
    interleaved,
    median,
    next_message,
    print_tables,
    progress,
    timed,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph_workload import build_loop, run_loop
from psycopg import sql
from psycopg.rows import dict_row

from nestegg import Clutch, Strategy
from nestegg.checkpoint import (
    CheckpointConfig,
    CheckpointPolicy,
    RedisCheckpointStorage,
    SQLCheckpointStorage,
    SQLiteCheckpointStorage,
)

DEFAULT_SIZES = (100, 1000, 10_000)
DEFAULT_REPS = {100: 11, 1000: 3, 10_000: 2}
LANGGRAPH_MAX_STEPS = 1000
CONCURRENT_RUNS = 200
CONCURRENT_STEPS = 50
CONCURRENT_REPS = 3

POLICY = CheckpointPolicy(every_n_steps=1, keep_latest=3, durability="sync")

NESTEGG_PG = "nestegg PostgreSQL"
LANGGRAPH_PG = "LangGraph PostgresSaver"
NESTEGG_REDIS = "nestegg Redis"

FLOOR_OPS = 300
PG_FLOOR = "PostgreSQL autocommit INSERT of a ~1 KB row"
REDIS_FLOOR = "Redis SET of ~1 KB"
FLOOR_OF = {NESTEGG_PG: PG_FLOOR, LANGGRAPH_PG: PG_FLOOR, NESTEGG_REDIS: REDIS_FLOOR}
TARGETS = {NESTEGG_PG: 2.5, NESTEGG_REDIS: 2.7}
"""Per-step time as a multiple of the floor that nestegg aims to stay under."""


@dataclass
class Sample:
    seconds: float
    stored_bytes: int


def unique_name(kind: str) -> str:
    return f"bench_{kind}_{uuid.uuid4().hex[:8]}"


def loop_clutch(storage: Any, steps: int, run_id: str | None) -> Clutch:
    clutch = Clutch(
        "bench",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=storage, policy=POLICY, run_id=run_id),
    )

    @clutch.agent()
    async def step(data):  # untyped, like the agents of clutch_vs_eggai.py
        return next_message(data)

    return clutch


# -- PostgreSQL -----------------------------------------------------------------------------


async def pg_prefixed_bytes(prefix: str) -> int:
    """Bytes of the tables (with their indexes and TOAST) whose names start with ``prefix``."""
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        await conn.execute("CHECKPOINT")
        cursor = await conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = current_schema() "
            "AND starts_with(c.relname, %s)",
            (prefix,),
        )
        row = await cursor.fetchone()
        return int(row[0]) if row else 0


async def pg_drop_prefixed(prefix: str) -> None:
    """Drops what is left under ``prefix`` (tables and functions) after the store's drop()."""
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind = 'r' AND n.nspname = current_schema() "
            "AND starts_with(c.relname, %s)",
            (prefix,),
        )
        for (name,) in await cursor.fetchall():
            await conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name))
            )
        cursor = await conn.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND starts_with(p.proname, %s)",
            (prefix,),
        )
        for (signature,) in await cursor.fetchall():
            await conn.execute(sql.SQL("DROP FUNCTION IF EXISTS {}").format(sql.SQL(signature)))


@asynccontextmanager
async def nestegg_pg_store() -> AsyncIterator[tuple[Any, str]]:
    prefix = unique_name("ne") + "_"
    storage = SQLCheckpointStorage(PG_URL, table_prefix=prefix)
    try:
        await storage.setup()
        yield storage, prefix
    finally:
        try:
            await storage.drop()
        finally:
            await storage.close()
            await pg_drop_prefixed(prefix)


async def measure_nestegg_pg(steps: int, rep: int) -> Sample:
    async with nestegg_pg_store() as (storage, prefix):
        clutch = loop_clutch(storage, steps, f"loop-{steps}-{rep}")
        elapsed, result = await timed(partial(clutch.run, START_INPUT, timeout=LARGE_TIMEOUT))
        if result["turn"] != steps:
            raise AssertionError(f"nestegg ran {result['turn']} steps, not {steps}")
        return Sample(elapsed, await pg_prefixed_bytes(prefix))


def langgraph_pg_sample(steps: int, rep: int, schema: str) -> tuple[float, int]:
    """Runs the loop on PostgresSaver in its own schema; seconds and bytes stored."""
    with psycopg.Connection.connect(PG_URL, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        with psycopg.Connection.connect(
            PG_URL,
            autocommit=True,
            prepare_threshold=0,
            row_factory=dict_row,
            options=f"-c search_path={schema}",
        ) as conn:
            saver = PostgresSaver(conn)
            saver.setup()
            app = build_loop(saver, steps)
            start = time.perf_counter()
            run_loop(app, f"loop-{steps}-{rep}", steps)
            elapsed = time.perf_counter() - start
            conn.execute("CHECKPOINT")
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) AS size FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relkind = 'r' AND n.nspname = %s",
                (schema,),
            ).fetchone()
            stored = int(row["size"]) if row else 0
    finally:
        with psycopg.Connection.connect(PG_URL, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
            )
    return elapsed, stored


async def measure_langgraph_pg(steps: int, rep: int) -> Sample:
    gc.collect()
    elapsed, stored = langgraph_pg_sample(steps, rep, unique_name("lg"))
    return Sample(elapsed, stored)


# -- Redis ----------------------------------------------------------------------------------


async def redis_prefixed_bytes(prefix: str) -> int:
    client = aioredis.from_url(REDIS_URL)
    try:
        total = 0
        async for key in client.scan_iter(match=f"{prefix}*", count=1000):
            total += int(await client.memory_usage(key, samples=0) or 0)
        return total
    finally:
        await client.aclose()


async def redis_drop_prefixed(prefix: str) -> None:
    client = aioredis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        for start in range(0, len(keys), 500):
            await client.delete(*keys[start : start + 500])
    finally:
        await client.aclose()


@asynccontextmanager
async def nestegg_redis_store() -> AsyncIterator[tuple[RedisCheckpointStorage, str]]:
    prefix = unique_name("ne") + ":"
    storage = RedisCheckpointStorage(REDIS_URL, prefix=prefix)
    try:
        await storage.setup()
        yield storage, prefix
    finally:
        try:
            await storage.drop()
        finally:
            await storage.close()
            await redis_drop_prefixed(prefix)


async def measure_nestegg_redis(steps: int, rep: int) -> Sample:
    async with nestegg_redis_store() as (storage, prefix):
        clutch = loop_clutch(storage, steps, f"loop-{steps}-{rep}")
        elapsed, result = await timed(partial(clutch.run, START_INPUT, timeout=LARGE_TIMEOUT))
        if result["turn"] != steps:
            raise AssertionError(f"nestegg ran {result['turn']} steps, not {steps}")
        return Sample(elapsed, await redis_prefixed_bytes(prefix))


# -- measurements ---------------------------------------------------------------------------

MEASURES: dict[str, Callable[[int, int], Any]] = {
    NESTEGG_PG: measure_nestegg_pg,
    LANGGRAPH_PG: measure_langgraph_pg,
    NESTEGG_REDIS: measure_nestegg_redis,
}


async def measure_size(
    steps: int, reps: int, floors: Floors
) -> tuple[dict[str, list[Sample]], dict[str, float]]:
    """Samples per contender, and the median floors measured between them (seconds)."""
    contenders = [NESTEGG_PG, NESTEGG_REDIS]
    if steps <= LANGGRAPH_MAX_STEPS:
        contenders.insert(1, LANGGRAPH_PG)
    samples: dict[str, list[Sample]] = {name: [] for name in contenders}
    floor_seconds: dict[str, list[float]] = {PG_FLOOR: [], REDIS_FLOOR: []}
    for rep in range(reps):
        floor_seconds[PG_FLOOR].append(await floors.pg_insert(FLOOR_OPS))
        floor_seconds[REDIS_FLOOR].append(await floors.redis_set(FLOOR_OPS))
        for name in interleaved(contenders, rep):
            progress(f"{steps} steps, {name}, repetition {rep + 1}")
            samples[name].append(await MEASURES[name](steps, rep))
    return samples, {name: median(values) for name, values in floor_seconds.items()}


async def concurrent_runs(storage: Any) -> float:
    """Seconds for CONCURRENT_RUNS runs of CONCURRENT_STEPS steps at once on one Clutch."""
    clutch = loop_clutch(storage, CONCURRENT_STEPS, None)

    async def all_runs() -> list[Any]:
        return await asyncio.gather(
            *(
                clutch.run(START_INPUT, run_id=f"c-{i}", timeout=LARGE_TIMEOUT)
                for i in range(CONCURRENT_RUNS)
            )
        )

    elapsed, results = await timed(all_runs)
    if any(r["turn"] != CONCURRENT_STEPS for r in results):
        raise AssertionError("a concurrent run did not complete all its steps")
    return elapsed


@asynccontextmanager
async def sqlite_store() -> AsyncIterator[tuple[SQLiteCheckpointStorage, str]]:
    with tempfile.TemporaryDirectory(prefix="nestegg-bench-") as tmp:
        storage = SQLiteCheckpointStorage(Path(tmp) / "nestegg.db")
        try:
            await storage.setup()
            yield storage, tmp
        finally:
            await storage.close()


CONCURRENT_STORES = {
    "PostgreSQL": nestegg_pg_store,
    "Redis": nestegg_redis_store,
    "SQLite (embedded, for reference)": sqlite_store,
}


async def measure_concurrency(reps: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {name: [] for name in CONCURRENT_STORES}
    for rep in range(reps):
        for name in interleaved(list(CONCURRENT_STORES), rep):
            progress(f"{CONCURRENT_RUNS} concurrent runs, {name}, repetition {rep + 1}")
            async with CONCURRENT_STORES[name]() as (storage, _):
                seconds[name].append(await concurrent_runs(storage))
    return seconds


def throughput_table(
    results: dict[int, dict[str, list[Sample]]],
    floors: dict[int, dict[str, float]],
    reps: dict[int, int],
) -> Table:
    table = Table(
        title="Durable checkpoint every step on the servers: nestegg vs LangGraph PostgresSaver",
        headers=[
            "steps",
            "store",
            "steps/s",
            "µs/step",
            "floor µs",
            "per floor",
            "stored",
            "vs LangGraph",
            "reps",
        ],
    )
    for steps, samples in results.items():
        anchor = samples.get(LANGGRAPH_PG)
        anchor_rate = steps / median([s.seconds for s in anchor]) if anchor else None
        for name, values in samples.items():
            rate = steps / median([s.seconds for s in values])
            versus = ""
            if anchor_rate and name != LANGGRAPH_PG:
                versus = fmt_ratio(rate / anchor_rate)
            floor = floors[steps][FLOOR_OF[name]]
            table.rows.append(
                [
                    fmt_int(steps),
                    name,
                    fmt_int(rate),
                    fmt_us(1 / rate),
                    fmt_us(floor),
                    f"{1 / rate / floor:.2f}",
                    fmt_bytes(median([s.stored_bytes for s in values])),
                    versus,
                    str(reps[steps]),
                ]
            )
    table.notes += [
        "Median over the repetitions, all contenders interleaved in one process; "
        "own table prefix / schema / key prefix per measurement, dropped afterwards.",
        "Stored: PostgreSQL `pg_total_relation_size` of the tables (with indexes and TOAST) "
        "after `CHECKPOINT`; Redis `MEMORY USAGE` of the keys, summed.",
        "nestegg: `SQLCheckpointStorage(postgresql_url, table_prefix=...)` and "
        "`RedisCheckpointStorage(url, prefix=...)` with their default pools; LangGraph: "
        "`PostgresSaver` on one autocommit connection (as `from_conn_string` opens it).",
        "Floor: the median, over the repetitions of that size, of the mean time of "
        f"{FLOOR_OPS} operations measured in this process between the contenders "
        "(`floors.py`): a PostgreSQL autocommit INSERT of a ~1 KB row for the PostgreSQL "
        "rows, a Redis SET of ~1 KB for Redis. Per floor = µs/step / floor; nestegg aims at "
        + ", ".join(f"{name} ≤ {limit}x" for name, limit in TARGETS.items())
        + ".",
    ]
    return table


def concurrency_table(seconds: dict[str, list[float]], reps: int) -> Table:
    table = Table(
        title=f"{CONCURRENT_RUNS} runs of {CONCURRENT_STEPS} steps at once, one process",
        headers=["store", "aggregate steps/s", "wall time", "reps"],
    )
    total_steps = CONCURRENT_RUNS * CONCURRENT_STEPS
    for name, values in seconds.items():
        table.rows.append(
            [
                name,
                fmt_int(total_steps / median(values)),
                f"{median(values):.2f} s",
                str(reps),
            ]
        )
    table.notes.append(
        "`asyncio.gather` of 200 `clutch.run(input, run_id=...)` on one Clutch, a durable "
        "checkpoint after every step; aggregate = 10,000 steps / median wall time."
    )
    return table


async def run(sizes: Sequence[int], reps: int | None) -> list[Table]:
    results: dict[int, dict[str, list[Sample]]] = {}
    floors: dict[int, dict[str, float]] = {}
    used_reps: dict[int, int] = {}
    dump_tasks_on_sigusr1()
    with tempfile.TemporaryDirectory(prefix="nestegg-floor-") as tmp:
        probes = Floors(Path(tmp))
        try:
            await probes.open_servers()
            if probes.notes:
                raise RuntimeError("; ".join(probes.notes))
            for steps in sizes:
                used_reps[steps] = reps or DEFAULT_REPS.get(steps, 3)
                results[steps], floors[steps] = await measure_size(steps, used_reps[steps], probes)
        finally:
            await probes.close()
    concurrency_reps = reps or CONCURRENT_REPS
    concurrency = await measure_concurrency(concurrency_reps)
    return [
        throughput_table(results, floors, used_reps),
        concurrency_table(concurrency, concurrency_reps),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--reps", type=int, default=None, help="repetitions for every size")
    args = parser.parse_args()
    print_tables(asyncio.run(run(args.sizes, args.reps)))


if __name__ == "__main__":
    main()
