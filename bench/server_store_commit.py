"""Commit throughput of the PostgreSQL and Redis stores.

Workload per step, as the checkpointer writes it: one ~1.2 KB step record, 4 events, one
checkpoint, and pruning to the newest 3 checkpoints. Two measurements per store: one run
of N sequential commits (also given per baseline: the mean commit divided by an
autocommit INSERT for PostgreSQL, by a PING round trip for Redis, measured just before),
and 200 runs of 50 commits each, all at once in one process.

    python bench/server_store_commit.py [steps]

Servers: NESTEGG_TEST_PG_URL (default postgresql://postgres@127.0.0.1:5432/test) and
NESTEGG_TEST_REDIS_URL (default redis://127.0.0.1:6379/0). Each store uses its own table
or key prefix and drops it afterwards.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from typing import Any

from nestegg.checkpoint.codec import seal_json
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    Owner,
    RunRecord,
    StepRecord,
    new_checkpoint_id,
)
from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

KEEP_LATEST = 3
CONCURRENT_RUNS = 200
CONCURRENT_STEPS = 50
PG_URL = os.environ.get("NESTEGG_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("NESTEGG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def step_commit(run_id: str, fence: int, seq: int, kept: list[str]) -> Commit:
    now = time.time()
    message = {"role": "assistant", "content": "x" * 1100, "turn": seq}
    checkpoint = CheckpointRecord(
        new_checkpoint_id(),
        run_id,
        seq,
        now,
        "policy",
        seal_json({"seq": seq, "cursor": {"next": "agent"}, "turn": seq, "data_ref": seq}),
    )
    kept.append(checkpoint.checkpoint_id)
    prune = kept[:-KEEP_LATEST]
    del kept[:-KEEP_LATEST]
    kinds = ["step_started", "step_completed", "checkpoint_saved"]
    kinds += ["checkpoint_pruned"] if prune else []
    events = [
        EventRecord(run_id, 4 * seq - 3 + i, now, kind, seal_json({"agent": "agent", "seq": seq}))
        for i, kind in enumerate(kinds)
    ]
    return Commit(
        run_id=run_id,
        fence=fence,
        steps=[StepRecord(run_id, seq, "agent", seal_json({"agent": "agent", "entry": message}))],
        events=events,
        checkpoints=[checkpoint],
        prune=prune,
        lease_until=now + 30,
        step_seq=seq,
        event_seq=events[-1].seq,
        updated_at=now,
    )


async def start_run(store: Any, run_id: str) -> int:
    now = time.time()
    await store.create_run(RunRecord(run_id, "bench", "running", seal_json({"in": 1}), now, now))
    claimed = await store.claim_run(run_id, 1, Owner("h", os.getpid(), "s"), now + 30, now)
    return int(claimed.fence)


async def sequential(store: Any, steps: int, floor: float) -> None:
    fence = await start_run(store, "bench-seq")
    kept: list[str] = []
    commits = [step_commit("bench-seq", fence, seq, kept) for seq in range(1, steps + 1)]
    times = []
    start = time.perf_counter()
    for commit in commits:
        t0 = time.perf_counter_ns()
        await store.commit(commit)
        times.append(time.perf_counter_ns() - t0)
    total = time.perf_counter() - start
    print(
        f"  1 run x {steps} steps: {steps / total:,.0f} commits/s; per commit mean "
        f"{statistics.mean(times) / 1000:.0f} us, median {statistics.median(times) / 1000:.0f} "
        f"us, p99 {sorted(times)[int(len(times) * 0.99)] / 1000:.0f} us "
        f"(step body {len(commits[0].steps[0].body)} B); mean per baseline "
        f"{statistics.mean(times) / 1e9 / floor:.2f}"
    )


async def concurrent(store: Any) -> None:
    async def one(index: int) -> None:
        run_id = f"bench-con-{index}"
        fence = await start_run(store, run_id)
        kept: list[str] = []
        for seq in range(1, CONCURRENT_STEPS + 1):
            await store.commit(step_commit(run_id, fence, seq, kept))

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(CONCURRENT_RUNS)))
    total = time.perf_counter() - start
    steps = CONCURRENT_RUNS * CONCURRENT_STEPS
    print(
        f"  {CONCURRENT_RUNS} runs x {CONCURRENT_STEPS} steps at once: "
        f"{steps / total:,.0f} steps/s aggregate ({total:.2f} s, runs created and claimed "
        "inside the timing)"
    )


async def postgres_baseline(count: int = 500) -> float:
    import psycopg

    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        await conn.execute("CREATE TEMP TABLE bench_baseline (n int, b bytea)")
        start = time.perf_counter()
        for n in range(count):
            await conn.execute("INSERT INTO bench_baseline VALUES (%s, %s)", (n, b"x" * 100))
        per = (time.perf_counter() - start) / count
    # A temp table writes no WAL: add one durable commit the way a plain table pays it.
    async with await psycopg.AsyncConnection.connect(PG_URL, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_baseline_durable (n int, b bytea)")
        start = time.perf_counter()
        for n in range(count):
            await conn.execute(
                "INSERT INTO bench_baseline_durable VALUES (%s, %s)", (n, b"x" * 100)
            )
        durable = (time.perf_counter() - start) / count
        await conn.execute("DROP TABLE bench_baseline_durable")
    print(
        f"  baseline: autocommit insert {durable * 1e6:.0f} us "
        f"(into a temp table, no WAL flush: {per * 1e6:.0f} us)"
    )
    return durable


async def redis_baseline(count: int = 1000) -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        await client.ping()
        start = time.perf_counter()
        for _ in range(count):
            await client.ping()
        per = (time.perf_counter() - start) / count
    finally:
        await client.aclose()
    print(f"  baseline: PING round trip {per * 1e6:.0f} us")
    return per


async def main(steps: int) -> None:
    stores = [
        ("PostgreSQL", PostgresCheckpointStorage(PG_URL, table_prefix="bench_commit_")),
        ("Redis", RedisCheckpointStorage(REDIS_URL, prefix="bench-commit:")),
    ]
    baselines = {"PostgreSQL": postgres_baseline, "Redis": redis_baseline}
    for name, store in stores:
        print(name)
        floor = await baselines[name]()
        await store.setup()
        try:
            await store.drop()
            await sequential(store, steps, floor)
            await concurrent(store)
        finally:
            await store.drop()
            await store.close()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
