"""Pipelines the transport tests run in worker processes (``nestegg worker``).

Configured from the environment so that every test has its own keys:
``NESTEGG_TEST_REDIS_URL`` (store and Redis broker), ``NESTEGG_TEST_PREFIX`` (key prefix
of the store and of the streams), ``NESTEGG_TEST_TRANSPORT`` (broker URL, default the
Redis one), ``NESTEGG_TEST_LEASE`` (seconds) and ``NESTEGG_TEST_SLOW`` (seconds a slow
step takes).
"""

from __future__ import annotations

import asyncio
import os
import random
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis

import nestegg
from nestegg import Clutch, Strategy, get_context
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.transport.redis_streams import RedisStreamsTransport

REDIS_URL = os.environ.get("NESTEGG_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("NESTEGG_TEST_PREFIX", "nestegg-test:")
LEASE = float(os.environ.get("NESTEGG_TEST_LEASE", "2"))
SLOW = float(os.environ.get("NESTEGG_TEST_SLOW", "0"))
STEPS = 10


def transport() -> Any:
    """The broker of the tests: Redis Streams under the prefix, or the URL given."""
    url = os.environ.get("NESTEGG_TEST_TRANSPORT")
    if url is None or url.startswith("redis"):
        return RedisStreamsTransport(url or REDIS_URL, prefix=PREFIX)
    from nestegg.transport.rabbitmq import RabbitMQTransport

    return RabbitMQTransport(url, prefix=PREFIX)


def config() -> CheckpointConfig:
    """The Redis store under the prefix, with a short lease."""
    storage = RedisCheckpointStorage(REDIS_URL, prefix=PREFIX)
    return CheckpointConfig(storage=storage, lease=timedelta(seconds=LEASE))


_counter: list[Any] = []


def counter() -> Any:
    """A Redis client for the side-effect counters (one per process and loop)."""
    if not _counter:
        _counter.append(aioredis.Redis.from_url(REDIS_URL))
    return _counter[0]


@nestegg.durable
async def side_effect(run_id: str, step: int) -> int:
    """Counts its executions per run and step in Redis; returns the count."""
    return int(await counter().hincrby(f"{PREFIX}effects", f"{run_id}:{step}", 1))


async def _chain_step(data: dict[str, Any], name: str) -> dict[str, Any]:
    ctx = get_context()
    step = ctx.state.turn + 1
    await side_effect(ctx.state.clutch_id, step)
    await asyncio.sleep(random.uniform(0.0, 0.05))
    return {"trail": [*data.get("trail", []), f"{name}{step}"], "n": data.get("n", 0) + 1}


chain = Clutch(
    "chain",
    strategy=Strategy.ROUND_ROBIN,
    max_turns=STEPS,
    transport=transport(),
    checkpoint=config(),
)


@chain.agent()
async def ping(data: dict[str, Any]) -> dict[str, Any]:
    return await _chain_step(data, "ping")


@chain.agent()
async def pong(data: dict[str, Any]) -> dict[str, Any]:
    return await _chain_step(data, "pong")


slow = Clutch("slow", transport=transport(), checkpoint=config())


@slow.agent()
async def crawl(data: dict[str, Any]) -> dict[str, Any]:
    await side_effect(get_context().state.clutch_id, 1)
    await asyncio.sleep(SLOW)
    return {**data, "crawled": True}


@slow.agent()
async def after(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "after": os.getpid()}


split = Clutch("split", transport=transport(), checkpoint=config())


@split.agent()
async def first(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "first": os.getpid()}


@split.agent()
async def second(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "second": os.getpid()}


@split.agent()
async def third(data: dict[str, Any]) -> dict[str, Any]:
    if data.get("fail"):
        raise ValueError(f"bad input {data['fail']}")
    return {**data, "third": os.getpid()}
