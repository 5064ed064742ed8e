"""Fixtures for ``nestegg ui``: the application on every store, filled by real runs.

``ui`` gives a Starlette test client of the application (writes allowed, token
``TOKEN``, the test pipeline as its Clutch) over memory, SQLite, file, PostgreSQL and
Redis stores holding the three runs of tests/cli/conftest.py (one completed, one failed,
one interrupted). The browser tests' fixtures are in tests/ui/browser.py.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.ui import UISettings, create_app
from tests.cli.conftest import ALL_KINDS, Filled, delete_runs, fill, store_url_for
from tests.cli.pipeline_app import POLICY, build, pipeline

TOKEN = "test-token"
UI_KINDS = ("memory", *ALL_KINDS)
BASE_URL = "http://127.0.0.1"


@dataclass
class Ui:
    """A test client of the application and the runs its store holds."""

    client: TestClient
    filled: Filled
    kind: str

    def write(self, method: str, path: str, token: str | None = TOKEN, **kwargs: object) -> object:
        """A write request, with the token header unless ``token`` is None."""
        headers = {"X-Nestegg-Token": token} if token is not None else {}
        return self.client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]


def client_for(settings: UISettings) -> TestClient:
    """A test client of the application for ``settings`` (enter it to start it)."""
    return TestClient(create_app(settings), base_url=BASE_URL)


def call_cells(html: str) -> list[tuple[str, str, str]]:
    """The journal table's calls: function, executed or replayed, duration."""
    pattern = (
        r'<td class="fn">([^<]*)</td>\s*<td class="how">(.*?)</td>\s*<td[^>]*call-dur[^>]*>([^<]*)<'
    )
    return [
        (fn, re.sub("<[^>]+>", "", how), took) for fn, how, took in re.findall(pattern, html, re.S)
    ]


@pytest.fixture(params=UI_KINDS)
def ui(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ui]:
    """The application, writes allowed, on a filled store of every kind."""
    kind = request.param
    if kind == "memory":
        store = MemoryCheckpointStorage()
        filled = asyncio.run(fill("memory://", "", store))
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
        settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
        with client_for(settings) as client:
            yield Ui(client, filled, kind)
        return
    urls = store_url_for(kind, request, tmp_path)
    url = next(urls)
    filled = asyncio.run(fill(url, f"-{uuid.uuid4().hex[:8]}"))
    settings = UISettings(store_url=url, clutch=pipeline, allow_writes=True, token=TOKEN)
    try:
        with client_for(settings) as client:
            yield Ui(client, filled, kind)
    finally:
        asyncio.run(delete_runs(url, (filled.ok, filled.bad, filled.gone)))
        urls.close()
