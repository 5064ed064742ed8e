"""A refund pipeline that waits for a person's approval without holding a process.

Run it with ``python examples/refund_approval.py [STORE_URL]`` (default: a SQLite file in
a temp dir). Three processes play the day of a refund:

1. ``start``: a process assesses the refund (a paid, journaled model call), then waits for
   the signal ``approval``; the run is stored as ``waiting`` and the process exits. Each
   time the script runs, the refund is a new run (``refund-1042-`` and a random suffix), so
   it runs again on the same store; the stages are given its id.
2. ``approve``: another process, later, sends the approval; the run resumes there: the
   assessment is replayed from the journal (not paid again), the refund is paid out.
3. Before that, ``nestegg runs --status waiting`` lists the run with the signal it waits
   for, and ``nestegg signal RUN approval '{"approved": true, "by": "ann"}'`` does what
   step 2 does from the shell.

The script prints one line per stage and ends with the result.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import nestegg
from nestegg import Clutch, RunWaiting, SignalTimeoutError
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store

PAID_LOG = Path(
    os.environ.get("REFUND_PAID_LOG", Path(tempfile.gettempdir()) / "refund-approval-paid.log")
)


class Approval(BaseModel):
    """What the person who approves sends."""

    approved: bool
    by: str


@nestegg.durable
async def assess(order: str, amount: float) -> str:
    """Stands in for a paid model call: each real call is a line in PAID_LOG."""
    with PAID_LOG.open("a") as paid:
        paid.write(f"assess {order}\n")
    return "low risk" if amount < 500 else "review"


@nestegg.durable
async def pay_out(order: str, amount: float) -> str:
    """Stands in for the payment provider: journaled, so it is made once."""
    return f"refund of {amount:.2f} for {order} sent"


def pipeline(store_url: str) -> Clutch:
    """The refund pipeline on the store at ``store_url``."""
    clutch = Clutch("refunds", checkpoint=CheckpointConfig(storage=open_store(store_url)))

    @clutch.agent()
    async def review(refund: dict[str, Any]) -> dict[str, Any]:
        # Paid work goes in journaled calls: this step runs again from its start when the
        # approval comes, and the assessment is then replayed, not paid again.
        risk = await assess(refund["order"], refund["amount"])
        try:
            approval = await nestegg.wait_for("approval", timeout=timedelta(days=2), type=Approval)
        except SignalTimeoutError:
            return {**refund, "risk": risk, "status": "expired"}
        status = "approved" if approval.approved else "rejected"
        return {**refund, "risk": risk, "status": status, "by": approval.by}

    @clutch.agent()
    async def pay(refund: dict[str, Any]) -> dict[str, Any]:
        if refund["status"] != "approved":
            return refund
        return {**refund, "receipt": await pay_out(refund["order"], refund["amount"])}

    return clutch


async def start(store_url: str, run_id: str) -> None:
    """Stage 1: assess the refund and wait for the approval (this process then exits)."""
    clutch = pipeline(store_url)
    try:
        await clutch.run({"order": "A-1042", "amount": 129.0}, run_id=run_id)
    except RunWaiting as waiting:
        print(f"start: run {waiting.run_id} waits for {waiting.signal!r}; process exits")


async def approve(store_url: str, run_id: str) -> None:
    """Stage 2: another process sends the approval and gets the result."""
    clutch = pipeline(store_url)
    result = await clutch.signal(run_id, "approval", {"approved": True, "by": "ann"})
    print(f"approve: run {run_id} resumed: {result['status']} by {result['by']}")
    print(f"approve: {result['receipt']}")


def main() -> None:
    """Play the stages in separate processes on one store."""
    if len(sys.argv) > 3 and sys.argv[1] in ("start", "approve"):
        stage = start if sys.argv[1] == "start" else approve
        asyncio.run(stage(sys.argv[2], sys.argv[3]))
        return
    default = f"sqlite:///{Path(tempfile.mkdtemp()) / 'refunds.db'}"
    store_url = sys.argv[1] if len(sys.argv) > 1 else default
    run_id = f"refund-1042-{uuid.uuid4().hex[:8]}"  # a new run each time the script runs
    PAID_LOG.unlink(missing_ok=True)
    for stage in ("start", "approve"):
        ended = subprocess.run([sys.executable, __file__, stage, store_url, run_id], check=False)
        if ended.returncode:  # the stage printed its error: no second traceback here
            sys.exit(ended.returncode)
    paid = PAID_LOG.read_text().count("assess")
    print(f"assessments paid for: {paid}")


if __name__ == "__main__":
    main()
