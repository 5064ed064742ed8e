"""A worker in this process whose store is unavailable when it starts: it waits for the
store, with a warning per try, and serves once the store is back."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.errors import StorageUnavailableError
from nestegg.transport import worker as worker_module
from tests.transport.apps import make_chain
from tests.transport.conftest import Deployment
from tests.transport.test_caller import serving
from tests.transport.test_workers import uninterrupted_result

READY_WITHIN_S = 10.0


@pytest.mark.server
async def test_a_worker_whose_store_is_unavailable_at_start_serves_once_it_is_back(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(worker_module, "BROKER_RETRY_DELAY", 0.01)
    away = 2  # the store's first setups fail
    set_up = RedisCheckpointStorage.setup

    async def back_after_a_while(store: RedisCheckpointStorage) -> None:
        nonlocal away
        if away:
            away -= 1
            raise StorageUnavailableError("Redis at redis://store is unavailable: away")
        await set_up(store)

    monkeypatch.setattr(RedisCheckpointStorage, "setup", back_after_a_while)
    caller, worker = make_chain(), make_chain()
    ready = asyncio.Event()
    try:
        with caplog.at_level(logging.WARNING, logger="nestegg"):
            async with serving(worker, on_ready=ready.set):
                await asyncio.wait_for(ready.wait(), READY_WITHIN_S)
                result = await caller.run({}, run_id="after", timeout=30)
    finally:
        await caller.stop()
        await worker.stop()
    assert result == uninterrupted_result()
    assert [r.getMessage() for r in caplog.records if "store" in r.getMessage()] == [
        "setting up the store of pipeline 'chain' failed: Redis at redis://store is "
        "unavailable: away"
    ] * 2


@pytest.mark.server
async def test_a_store_outage_during_sweeps_is_told_once_and_its_end(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    failing = 3  # the sweeps that find the store unavailable
    list_runs = RedisCheckpointStorage.list_runs
    swept_after = asyncio.Event()
    calls = 0

    async def away_a_while(store: RedisCheckpointStorage, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= failing:
            raise StorageUnavailableError("Redis at redis://store is unavailable: away")
        if calls > failing + 1:  # a sweep after the first that worked
            swept_after.set()
        return await list_runs(store, *args, **kwargs)

    monkeypatch.setattr(RedisCheckpointStorage, "list_runs", away_a_while)
    worker = make_chain()
    try:
        with caplog.at_level(logging.WARNING, logger="nestegg"):
            async with serving(worker, sweep_interval=0.02):
                await asyncio.wait_for(swept_after.wait(), READY_WITHIN_S)
    finally:
        await worker.stop()
    assert [r.getMessage() for r in caplog.records if "sweep" in r.getMessage()] == [
        "sweeps of pipeline 'chain' fail: Redis at redis://store is unavailable: away",
        "sweeps of pipeline 'chain' work again",
    ]
