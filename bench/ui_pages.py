"""How long ``nestegg ui``'s pages take on a big store: 100,000 runs and a 10,000-step run.

Each page is requested through the application (Starlette, in this process, over ASGI: no
socket), after one warm-up request; the median of ``--reps`` requests is printed.

- the runs table's first page, its page ``--depth`` pages deep (following the ``older``
  cursor), and the first page filtered by a status 1 % of the runs have;
- the page of a run of 10,000 steps (its newest 200 steps) and its first 200 steps.

Stores: SQLite (a temp file), PostgreSQL and Redis (``NESTEGG_TEST_PG_URL``,
``NESTEGG_TEST_REDIS_URL``; their own table or key prefix, dropped afterwards).

    .venv/bin/python bench/ui_pages.py [--runs 100000] [--steps 10000]
        [--stores sqlite postgres redis]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.codec import encode_value, seal
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.ui import UISettings, create_app

PG_URL = os.environ.get("NESTEGG_TEST_PG_URL") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("NESTEGG_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
T0 = 1_700_000_000.0
CONCURRENCY = 32
"""Writers filling the store at once (below the Redis store's connection pool)."""


@asynccontextmanager
async def opened(kind: str) -> AsyncIterator[CheckpointStorage]:
    """An empty store of ``kind``, dropped afterwards."""
    store: Any
    with tempfile.TemporaryDirectory() as tmp:
        if kind == "sqlite":
            from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

            store = SQLiteCheckpointStorage(Path(tmp) / "ui.db")
        elif kind == "postgres":
            from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

            store = PostgresCheckpointStorage(PG_URL, table_prefix=f"b{uuid.uuid4().hex[:8]}_")
        else:
            from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

            store = RedisCheckpointStorage(REDIS_URL, prefix=f"bench-ui:{uuid.uuid4().hex[:8]}:")
        await store.setup()
        try:
            yield store
        finally:
            if hasattr(store, "drop"):
                await store.drop()
            await store.close()


async def fill(store: CheckpointStorage, runs: int, steps: int) -> None:
    """``runs`` runs (1 % failed) and one run of ``steps`` steps, ``long``."""
    sealed = seal(encode_value({"ticket": 1}))
    queue = iter(range(runs))

    async def worker() -> None:
        for i in queue:
            status = "failed" if i % 100 == 0 else "completed"
            run = RunRecord(f"run-{i:07d}", "bench", status, sealed, T0 + i, T0 + i)
            await store.create_run(run)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    policy = CheckpointPolicy(keep_latest=3)
    clutch = Clutch(
        "long",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=store, policy=policy),
    )

    @clutch.agent()
    async def tick(data: dict[str, Any]) -> dict[str, Any]:
        return {"n": data["n"] + 1, "text": "x" * 200}

    await clutch.run({"n": 0}, run_id="long")


async def median_ms(client: httpx2.AsyncClient, path: str, reps: int) -> tuple[float, str]:
    """The median time of ``reps`` requests (after a warm-up), and the page."""
    page = await client.get(path)
    assert page.status_code == 200, (path, page.status_code, page.text[:300])
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        await client.get(path)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, page.text


async def deep_path(client: httpx2.AsyncClient, depth: int) -> str:
    """The runs table's page ``depth`` pages deep."""
    path = "/"
    for _ in range(depth):
        text = (await client.get(path)).text
        found = re.search(r'<a id="older" href="([^"]+)"', text)
        assert found, "ran out of pages"
        path = found.group(1).replace("&amp;", "&")
    return path


async def measure(kind: str, runs: int, steps: int, depth: int, reps: int) -> None:
    async with opened(kind) as store:
        started = time.perf_counter()
        await fill(store, runs, steps)
        print(f"{kind}: {runs} runs and a {steps}-step run written in "
              f"{time.perf_counter() - started:.1f} s")  # fmt: skip
        app = create_app(UISettings(store=store))
        transport = httpx2.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client,
        ):
            pages = {
                "runs, first page": "/",
                f"runs, page {depth + 1}": await deep_path(client, depth),
                "runs, failed only (1 %)": "/?status=failed",
                f"run of {steps} steps, newest 200": "/runs/long",
                f"run of {steps} steps, first 200": "/runs/long?before=201",
            }
            for name, path in pages.items():
                ms, _ = await median_ms(client, path, reps)
                print(f"  {name:<36} {ms:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--depth", type=int, default=100, help="pages deep (50 runs each)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--stores", nargs="+", choices=["sqlite", "postgres", "redis"], default=["sqlite"]
    )
    args = parser.parse_args()
    for kind in args.stores:
        asyncio.run(measure(kind, args.runs, args.steps, args.depth, args.reps))


if __name__ == "__main__":
    main()
