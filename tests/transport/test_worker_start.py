"""A worker in this process whose store is unavailable when it starts: it waits for the
store, with a warning per try, and serves once the store is back."""

from __future__ import annotations

import asyncio
import logging

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
