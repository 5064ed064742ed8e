"""Pipelines the ui tests run: a long one, one with hostile names, a slow live one, and one
that waits."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import RunWaiting

HOSTILE_RUN_ID = "<img src=x onerror=alert(1)>"
HOSTILE_AGENT = "<script>alert(1)<x>"
HOSTILE_DATA = "</script><script>alert(2)</script>"
GATE_ENV = "UI_TEST_GATE"
"""A directory: the live pipeline's second step waits until a file ``go`` appears in it."""


def long_pipeline(store: CheckpointStorage, steps: int) -> Clutch:
    """One agent looping ``steps`` times, each step appending to a short list."""
    clutch = Clutch(
        "long",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=store, policy=CheckpointPolicy(keep_latest=3)),
    )

    @clutch.agent()
    async def tick(data: dict[str, Any]) -> dict[str, Any]:
        return {"n": data["n"] + 1, "last": [data["n"]] * 3}

    return clutch


def hostile_pipeline(store: CheckpointStorage) -> Clutch:
    """A pipeline whose agent name and data are markup."""
    config = CheckpointConfig(storage=store)
    clutch = Clutch("hostile", strategy=Strategy.SEQUENTIAL, checkpoint=config)

    async def agent(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "note": HOSTILE_DATA}

    agent.__name__ = HOSTILE_AGENT
    clutch.agent()(agent)
    return clutch


def _gate() -> Path:
    return Path(os.environ[GATE_ENV]) / "go"


def live_pipeline(config: CheckpointConfig) -> Clutch:
    """``first`` at once; ``second`` only once the gate file exists."""
    clutch = Clutch("live", strategy=Strategy.SEQUENTIAL, checkpoint=config)

    @clutch.agent()
    async def first(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "first": True}

    @clutch.agent()
    async def second(data: dict[str, Any]) -> dict[str, Any]:
        while not _gate().exists():
            await asyncio.sleep(0.02)
        return {**data, "second": True}

    return clutch


SIGNAL = "approval"
NAP_SECONDS = 3600.0


def waiting_pipeline(store: CheckpointStorage) -> Clutch:
    """One agent that waits for the signal ``approval`` (input ``{"nap": false}``, no
    deadline) or sleeps an hour on a durable timer (``{"nap": true}``)."""
    clutch = Clutch(
        "waiting", strategy=Strategy.SEQUENTIAL, checkpoint=CheckpointConfig(storage=store)
    )

    @clutch.agent()
    async def approve(data: dict[str, Any]) -> dict[str, Any]:
        if data["nap"]:
            await nestegg.sleep(NAP_SECONDS)
            return {**data, "approved": "after a nap"}
        return {**data, "approved": await nestegg.wait_for(SIGNAL)}

    return clutch


waiting_app = waiting_pipeline(None)
"""The waiting pipeline for ``--app tests.ui.pipelines:waiting_app`` (the command's store)."""


async def start_waiting(store: CheckpointStorage, run_id: str, *, nap: bool) -> None:
    """Start a run of :func:`waiting_pipeline` that is left waiting."""
    try:
        await waiting_pipeline(store).run({"nap": nap}, run_id=run_id)
    except RunWaiting:
        return
    raise AssertionError(f"run {run_id!r} did not wait")
