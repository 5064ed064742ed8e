"""What could make a page slow or unsafe: 10,000 steps, many runs, markup in names and data."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.testing.builders import create
from nestegg.ui import UISettings
from nestegg.ui.queries import RUNS_PAGE, STEP_WINDOW
from tests.ui.conftest import client_for
from tests.ui.pipelines import (
    HOSTILE_AGENT,
    HOSTILE_DATA,
    HOSTILE_RUN_ID,
    hostile_pipeline,
    long_pipeline,
)

LONG_STEPS = 10_000


@pytest.fixture(scope="module")
def long_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A SQLite store holding one run of 10,000 steps (``long``)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('long') / 'long.db'}"

    async def run() -> None:
        store = open_store(url)
        try:
            await long_pipeline(store, LONG_STEPS).run({"n": 0, "last": []}, run_id="long")
        finally:
            await store.close()

    asyncio.run(run())
    yield url


def test_a_run_of_10000_steps_opens_on_a_window_of_its_steps(long_run: str) -> None:
    """The page holds the newest steps and links to earlier ones (bench/ui_pages.py times it)."""
    with client_for(UISettings(store_url=long_run)) as client:
        page = client.get("/runs/long")
        assert page.status_code == 200
        seqs = [int(s) for s in re.findall(r'<tr class="step [^"]*" data-seq="(\d+)"', page.text)]
        assert seqs == list(range(LONG_STEPS - STEP_WINDOW + 1, LONG_STEPS + 1))
        earlier = client.get("/runs/long", params={"before": 201})
        seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', earlier.text)]
        assert seqs == list(range(1, 201))
        assert 'href="/runs/long?before=' in page.text  # the way to earlier steps
        detail = client.get(f"/runs/long/steps/{LONG_STEPS - 1}")
        assert detail.status_code == 200


def test_the_runs_table_pages_through_many_runs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'many.db'}"
    total = 2 * RUNS_PAGE + 7

    async def make() -> None:
        store = open_store(url)
        try:
            await store.setup()
            for i in range(total):
                await create(store, run_id=f"run-{i:04d}", created_at=1_000_000.0 + i)
        finally:
            await store.close()

    asyncio.run(make())
    seen: list[str] = []
    with client_for(UISettings(store_url=url)) as client:
        path: str | None = "/"
        while path:
            page = client.get(path.replace("&amp;", "&")).text
            seen += re.findall(r'<td><a href="/runs/([^"]+)">', page)
            older = re.search(r'<a id="older" href="([^"]+)"', page)
            path = older.group(1) if older else None
    assert seen == [f"run-{i:04d}" for i in reversed(range(total))]


def test_markup_in_run_ids_agent_names_and_data_is_shown_as_text(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'hostile.db'}"

    async def run() -> None:
        store = open_store(url)
        try:
            await hostile_pipeline(store).run({"name": "<b>x</b>"}, run_id=HOSTILE_RUN_ID)
        finally:
            await store.close()

    asyncio.run(run())
    with client_for(UISettings(store_url=url)) as client:
        listing = client.get("/").text
        quoted = "%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E"
        run_page = client.get(f"/runs/{quoted}").text
        checkpoint = re.findall(r'class="cp" href="/checkpoints/([^"]+)"', run_page)[-1]
        pages = [listing, run_page, client.get(f"/checkpoints/{checkpoint}").text]
        pages.append(client.get(f"/runs/{quoted}/steps/1").text)
    for html in pages:
        assert "<img src=x" not in html and "<script>alert" not in html and "<b>x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in listing
    assert f'href="/runs/{quoted}"' in listing
    assert "&lt;script&gt;alert(1)&lt;x&gt;" in run_page
    assert "&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in pages[2]
    assert HOSTILE_AGENT not in run_page and HOSTILE_DATA not in pages[2]


BIDI = "\u202e"
"""RIGHT-TO-LEFT OVERRIDE: shows the text after it reversed (``evil`` as ``live``)."""


def test_control_and_bidi_characters_are_shown_as_their_escapes_as_the_command_does() -> None:
    # They were written raw into the pages, where the command prints \u202e, \x1b.
    store = MemoryCheckpointStorage()
    clutch = Clutch(f"p{BIDI}q\x1b[31m", checkpoint=CheckpointConfig(storage=store))

    async def agent(data: Any) -> Any:
        raise RuntimeError(f"model said {BIDI}gnp.exe")

    agent.__name__ = f"ask{BIDI}"
    clutch.agent(agent)
    run_id = f"r{BIDI}evil"
    with pytest.raises(RuntimeError):
        asyncio.run(clutch.run({"note": BIDI}, run_id=run_id))
    with client_for(UISettings(store=store)) as client:
        listing = client.get("/")
        address = f"/runs/{quote(run_id)}"
        run_page = client.get(address)
        pages = [listing, run_page, client.get(f"{address}/steps/1")]
        live = client.get(f"{address}/live").json()
    for page in pages:
        assert page.status_code == 200
        assert BIDI not in page.text and "\x1b" not in page.text
    assert "r\\u202eevil" in listing.text and "p\\u202eq\\x1b[31m" in listing.text
    assert f'href="{address}"' in listing.text  # the link is the run's own id
    assert "model said \\u202egnp.exe" in run_page.text and "ask\\u202e" in run_page.text
    assert f'data-run="{quote(run_id, safe="")}"' in run_page.text  # what the page follows
    assert BIDI not in live["summary"] + live["rows"] and "\\u202e" in live["summary"]
