"""The application judges leases by its clock (``UISettings.clock``), not the real one."""

from __future__ import annotations

import asyncio
import time

from nestegg.checkpoint.records import Owner
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.testing import FakeClock
from nestegg.testing.builders import create
from nestegg.ui import UISettings
from tests.ui.conftest import client_for
from tests.ui.pipelines import NAP_SECONDS, start_waiting


def test_a_run_is_interrupted_once_its_lease_has_passed_on_the_app_clock() -> None:
    store = MemoryCheckpointStorage()
    clock = FakeClock()
    elsewhere = Owner("another-host", 4242, "started")
    run = asyncio.run(create(store, owner=elsewhere, lease_until=clock() + 60.0))
    with client_for(UISettings(store=store, clock=clock)) as client:
        held = client.get("/", params={"status": "interrupted"}).text
        clock.advance(61)
        gone = client.get("/", params={"status": "interrupted"}).text
        page = client.get(f"/runs/{run.run_id}").text
    assert f'href="/runs/{run.run_id}"' not in held
    assert f'href="/runs/{run.run_id}"' in gone
    assert ">interrupted<" in page


def test_a_waiting_run_whose_timer_is_due_on_the_app_clock_says_so() -> None:
    store = MemoryCheckpointStorage()
    asyncio.run(start_waiting(store, "nap", nap=True))
    clock = FakeClock(time.time() + NAP_SECONDS + 60)
    with client_for(UISettings(store=store, clock=clock)) as client:
        row = client.get("/", params={"status": "waiting"}).text
        page = client.get("/runs/nap").text
    assert "its timer is due: resume it" in row and "waits for a timer" not in row
    assert "its timer is due: resume it" in page and "waits for a timer" not in page
