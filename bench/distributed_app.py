"""The pipelines bench/distributed.py runs in worker processes (``nestegg worker``).

Configured from the environment when built: ``BENCH_REDIS_URL`` (the Redis store and the
Redis broker), ``BENCH_TRANSPORT`` (a broker URL; default Redis Streams on that Redis),
``BENCH_PREFIX`` (keys, streams and queues), ``BENCH_STEPS``, ``BENCH_LEASE`` (seconds)
``BENCH_SLOW`` (seconds each step waits, as on a model) and ``BENCH_WORK`` (CPU
milliseconds each step spends, as an agent that parses and checks a model's answer).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import orjson
from harness import next_message

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.transport.redis_streams import RedisStreamsTransport

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def make(name: str = "bench", *, transport: bool = True) -> Clutch:
    """Two agents in turn for BENCH_STEPS steps, each returning the next ~1 KB message
    (after BENCH_SLOW seconds)."""
    prefix = os.environ.get("BENCH_PREFIX", "nestegg-bench:")
    lease = timedelta(seconds=float(os.environ.get("BENCH_LEASE", "30")))
    slow = float(os.environ.get("BENCH_SLOW", "0"))
    work = float(os.environ.get("BENCH_WORK", "0")) / 1000
    storage = RedisCheckpointStorage(REDIS_URL, prefix=prefix)
    url = os.environ.get("BENCH_TRANSPORT", REDIS_URL)
    broker: Any = None
    if transport and url.startswith("redis"):
        broker = RedisStreamsTransport(url, prefix=prefix)
    elif transport:
        from nestegg.transport.rabbitmq import RabbitMQTransport

        broker = RabbitMQTransport(url, prefix=prefix)
    clutch = Clutch(
        name,
        strategy=Strategy.ROUND_ROBIN,
        max_turns=int(os.environ.get("BENCH_STEPS", "100")),
        transport=broker,
        checkpoint=CheckpointConfig(storage=storage, lease=lease),
    )

    async def step(data: dict[str, Any]) -> dict[str, Any]:
        if slow:
            await asyncio.sleep(slow)
        if work:
            busy(data, work)
        return next_message(data)

    for agent in ("left", "right"):
        step.__name__ = agent
        clutch.agent()(_named(step, agent))
    return clutch


def busy(data: dict[str, Any], seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU encoding and decoding ``data``."""
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        orjson.loads(orjson.dumps(data))


def _named(fn: Any, name: str) -> Any:
    async def agent(data: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await fn(data)
        return result

    agent.__name__ = agent.__qualname__ = name
    return agent


def __getattr__(name: str) -> Clutch:
    """``distributed_app:bench``: the pipeline, built from the environment on use."""
    if name == "bench":
        return make()
    raise AttributeError(name)
