"""Fixtures of the wait tests: every kind of store, isolated per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.testing import StoreSite
from tests.registry import SERVER_KINDS, StoreTarget, clean_server, store_target

Opener = Callable[[], Awaitable[CheckpointStorage]]
PROCESS_KINDS = ("file", "sqlite", *SERVER_KINDS)
"""The stores that several processes share (not the memory store)."""


def _param(kind: str) -> object:
    return pytest.param(kind, marks=pytest.mark.server) if kind in SERVER_KINDS else kind


@pytest.fixture(params=[_param(kind) for kind in PROCESS_KINDS])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreTarget]:
    """Where a test keeps its store: file, SQLite, PostgreSQL, Redis (own prefix)."""
    site = StoreSite(tmp_path, uuid.uuid4().hex[:10], request)
    yield store_target(request.param, site)
    if request.param in SERVER_KINDS:
        await clean_server(site, request.param)


@pytest.fixture(params=["memory", *[_param(kind) for kind in PROCESS_KINDS]])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Opener]:
    """Opens set-up handles on one store of each kind (memory: the same one each time)."""
    kind = request.param
    site = StoreSite(tmp_path, uuid.uuid4().hex[:10], request)
    memory = MemoryCheckpointStorage()
    opened: list[CheckpointStorage] = []

    async def opener() -> CheckpointStorage:
        store = memory if kind == "memory" else store_target(kind, site).open()
        await store.setup()
        opened.append(store)
        return store

    yield opener
    for store in opened:
        await store.close()
    if kind in SERVER_KINDS:
        await clean_server(site, kind)
