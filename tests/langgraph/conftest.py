"""Savers over every store, each on an isolated location (as tests/stores does it)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.base")

from nestegg.langgraph import NestEggSaver
from tests.stores.conftest import _OPENERS, SERVER_KINDS, STORE_KINDS

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
    sweeps: list[Callable[[], Awaitable[None]]] = []

    def build(**options: Any) -> NestEggSaver:
        directory = tmp_path / f"s{len(savers)}"
        directory.mkdir()
        open_store, sweep = _OPENERS[kind](request, directory)
        saver = NestEggSaver(open_store(), close_storage=True, **options)
        savers.append(saver)
        if sweep is not None:
            sweeps.append(sweep)
        return saver

    yield build
    for saver in savers:
        await saver.aclose()
    for sweep in sweeps:
        await sweep()
