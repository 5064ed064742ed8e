"""A refund-like pipeline that waits for an approval, for the wait tests.

Its paid call (``charge``) appends a line to the file named by the run's input, so a
test counts how often it really ran, across processes.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import nestegg
from nestegg import Clutch, SignalTimeoutError
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.base import CheckpointStorage

KILL_ENV = "NESTEGG_TEST_KILL_AT"


class Approval(BaseModel):
    approved: bool
    by: str


@nestegg.durable
async def quote(ledger: str, amount: int) -> int:
    """The paid call before the wait: one "quote" line in the ledger file per real call."""
    with Path(ledger).open("a") as out:
        out.write(f"quote {amount}\n")
    return amount * 100


def quotes(ledger: Path) -> int:
    """How many quotes were really made (the ledger's "quote" lines)."""
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return sum(line.startswith("quote ") for line in lines)


def entered(ledger: str, agent: str) -> None:
    """Note in the ledger that ``agent`` began to run (code outside journaled calls)."""
    with Path(ledger).open("a") as out:
        out.write(f"entered {agent}\n")


def entries(ledger: Path, agent: str) -> int:
    """How often ``agent`` began to run (the ledger's "entered" lines)."""
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    return lines.count(f"entered {agent}")


def pause(ledger: str, where: str) -> None:
    """Stop here (noted in the ledger) when the test is to kill this process here."""
    if os.environ.get(KILL_ENV) == where:
        with Path(ledger).open("a") as out:
            out.write(f"paused {where}\n")
        time.sleep(60)


def build(storage: CheckpointStorage, clock: Any = None, timeout: float | None = None) -> Clutch:
    """The pipeline: quote (paid), wait for approval, then settle (after a second wait,
    for ``payout``, when the input says ``"payout": true``; ``"payout_within"``: its
    timeout in seconds)."""
    config = CheckpointConfig(storage=storage, **({"clock": clock} if clock else {}))
    clutch = Clutch("refunds", checkpoint=config)

    @clutch.agent()
    async def review(data: dict[str, Any]) -> dict[str, Any]:
        entered(data["ledger"], "review")
        cents = await quote(data["ledger"], data["amount"])
        pause(data["ledger"], "before-wait")
        try:
            approval = await nestegg.wait_for("approval", timeout=timeout, type=Approval)
        except SignalTimeoutError:
            return {**data, "cents": cents, "status": "expired"}
        pause(data["ledger"], "after-signal")
        status = "approved" if approval.approved else "rejected"
        return {**data, "cents": cents, "status": status, "by": approval.by}

    @clutch.agent()
    async def settle(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("payout"):
            await nestegg.wait_for("payout", timeout=data.get("payout_within"))
        return {**data, "settled": True}

    return clutch


def build_sleeper(storage: CheckpointStorage, clock: Any) -> Clutch:
    """A pipeline that quotes, sleeps durably for six hours, then settles."""
    clutch = Clutch("followups", checkpoint=CheckpointConfig(storage=storage, clock=clock))

    @clutch.agent()
    async def follow_up(data: dict[str, Any]) -> dict[str, Any]:
        entered(data["ledger"], "follow_up")
        cents = await quote(data["ledger"], data["amount"])
        await nestegg.sleep(timedelta(hours=6))
        return {**data, "cents": cents, "followed_up": True}

    return clutch


app = build(None)
"""The pipeline for ``--app tests.waits.pipeline:app`` (the command's store)."""
other_app = build_sleeper(None, time.time)
"""Another pipeline (``followups``), for ``--app tests.waits.pipeline:other_app``."""
