"""Savers over every store, each on an isolated location (as tests/stores does it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.base")

import uuid

from nestegg.langgraph import NestEggSaver
from nestegg.testing.registry import StoreSite, registered_store
from tests.registry import EMBEDDED_KINDS, SERVER_KINDS

STORE_KINDS = EMBEDDED_KINDS + SERVER_KINDS

SaverFactory = Callable[..., NestEggSaver]


def kinds(*wanted: str) -> list[Any]:
    """pytest params for those store kinds (the server ones marked)."""
    return [
        pytest.param(kind, marks=[pytest.mark.server] if kind in SERVER_KINDS else [])
        for kind in wanted or STORE_KINDS
    ]


@pytest.fixture
async def saver_factory(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SaverFactory]:
    """Builds savers, each over a fresh isolated location of the store kind in
    ``request.param``; all closed and their locations removed at the end."""
    kind = request.param
    savers: list[NestEggSaver] = []
    spec = registered_store(kind)
    sites: list[StoreSite] = []

    def build(**options: Any) -> NestEggSaver:
        directory = tmp_path / f"s{len(savers)}"
        directory.mkdir()
        site = StoreSite(directory, uuid.uuid4().hex[:12], request)
        saver = NestEggSaver(spec.factory(site)(), close_storage=True, **options)
        savers.append(saver)
        sites.append(site)
        return saver

    yield build
    for saver in savers:
        await saver.aclose()
    if spec.cleanup is not None:
        for site in sites:
            await spec.cleanup(site)
