"""A worker whose slots are all taken goes on with a run past CONTINUE_FOR while no message
waits for a slot, and hands it back to the broker once one does: counted by the run's
claims (each hand-back is a claim more) and, on Redis Streams, by the messages the
streams took (their entries-added)."""

from __future__ import annotations

import asyncio

import pytest

from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.transport import steps
from tests.transport.apps import make_chain
from tests.transport.conftest import Deployment
from tests.transport.test_caller import serving
from tests.transport.test_workers import uninterrupted_result


async def messages_sent(deployment: Deployment) -> int | None:
    """Messages ever added to the chain pipeline's streams (None: not on Redis Streams)."""
    if deployment.broker != "redis":
        return None
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(deployment.redis_url)
    try:
        total = 0
        for suffix in ("", ".ping", ".pong"):
            key = f"{deployment.prefix}nestegg.chain{suffix}"
            if await client.exists(key):
                total += int((await client.xinfo_stream(key))["entries-added"])
        return total
    finally:
        await client.aclose()


async def claims(store: RedisCheckpointStorage, run_id: str) -> int:
    """How often the run was claimed (its fence starts at 1)."""
    run = await store.get_run(run_id)
    assert run is not None
    return run.fence - 1


@pytest.mark.server
async def test_a_run_past_its_time_stays_with_a_full_worker_while_nothing_waits(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "CONTINUE_FOR", 0.0)  # every step past its time here
    caller, worker = make_chain(), make_chain()
    try:
        async with serving(worker, concurrency=1):  # its one slot is always taken
            result = await caller.run({}, run_id="alone", timeout=30)
    finally:
        await caller.stop()
        await worker.stop()
    assert result == uninterrupted_result()
    assert await claims(store, "alone") == 1  # no step went back to the broker
    assert await messages_sent(deployment) in (1, None)  # the caller's only


@pytest.mark.server
async def test_a_run_past_its_time_goes_back_to_the_broker_when_a_message_waits(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(steps, "CONTINUE_FOR", 0.0)
    caller, worker = make_chain(), make_chain()
    try:
        async with serving(worker, concurrency=1):
            results = await asyncio.gather(
                caller.run({}, run_id="first", timeout=30),
                caller.run({}, run_id="second", timeout=30),
            )
    finally:
        await caller.stop()
        await worker.stop()
    assert results == [uninterrupted_result()] * 2
    # the runs took turns through the broker
    assert await claims(store, "first") + await claims(store, "second") > 2
    assert await messages_sent(deployment) in (None, *range(3, 100))
