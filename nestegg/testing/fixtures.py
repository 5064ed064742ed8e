"""The ``store`` and ``store_factory`` fixtures, one parameter per registered store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

from nestegg.checkpoint.stores.base import CheckpointStorage, DroppableStore
from nestegg.testing.registry import StoreSite, registered_store, registered_stores

StoreFactory = Callable[[], Awaitable[CheckpointStorage]]
"""Opens (and sets up) a further handle on the test's store location."""

STORE_FIXTURE = "store_name"


def parametrize_stores(metafunc: pytest.Metafunc) -> None:
    """Run a test that uses the ``store_name`` fixture once per registered store."""
    if STORE_FIXTURE not in metafunc.fixturenames:
        return
    params = [
        pytest.param(spec.name, id=spec.name, marks=[pytest.mark.server] if spec.server else [])
        for spec in registered_stores()
    ]
    metafunc.parametrize(STORE_FIXTURE, params, indirect=True)


@pytest.fixture
def store_name(request: pytest.FixtureRequest) -> str:
    """The name of the registered store under test."""
    name: str = request.param
    return name


@pytest_asyncio.fixture
async def store_factory(
    store_name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    """Opens (and sets up) handles on one isolated location of the store under test.

    Every handle sees the same data. All are closed, the location dropped (a store that
    can drop itself) and cleaned up (the registration's ``cleanup``) when the test ends.
    """
    spec = registered_store(store_name)
    site = StoreSite(tmp_path, uuid.uuid4().hex[:12], request)
    build = spec.factory(site)
    opened: list[CheckpointStorage] = []

    async def open_handle() -> CheckpointStorage:
        handle = build()
        opened.append(handle)
        await handle.setup()
        return handle

    yield open_handle

    try:
        if opened and isinstance(opened[0], DroppableStore):
            await opened[0].drop()
    finally:
        for handle in reversed(opened):
            await handle.close()
        if spec.cleanup is not None:
            await spec.cleanup(site)


@pytest_asyncio.fixture
async def store(store_factory: StoreFactory) -> CheckpointStorage:
    """One set-up store of the kind under test, isolated from every other test."""
    return await store_factory()
