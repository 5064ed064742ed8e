"""The pipeline ``cli-test`` on its own store (the URL in RACE_STORE) whose first read of a
run pauses: it writes the mark ``read`` in the directory RACE_MARKS, then waits for the
mark ``go`` there. A test acts from another process in that pause (after ``nestegg
resume`` read the run, before it resumes it)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores import open_store
from tests.cli.pipeline_app import PIPELINE, POLICY, build

STORE_ENV = "RACE_STORE"
MARKS_ENV = "RACE_MARKS"
PAUSE_LIMIT = 600  # polls of 0.05 s: the test times out first


def _pausing() -> Clutch:
    store = open_store(os.environ[STORE_ENV])
    marks = Path(os.environ[MARKS_ENV])
    read = store.get_run
    paused: list[str] = []

    async def get_run(run_id: str) -> RunRecord | None:
        run = await read(run_id)
        if not paused:
            paused.append(run_id)
            (marks / "read").touch()
            for _ in range(PAUSE_LIMIT):
                if (marks / "go").exists():
                    break
                await asyncio.sleep(0.05)
        return run

    store.get_run = get_run  # type: ignore[method-assign]
    return build(PIPELINE, CheckpointConfig(storage=store, policy=POLICY))


def __getattr__(name: str) -> Clutch:
    if name == "pipeline":
        return _pausing()
    raise AttributeError(name)
