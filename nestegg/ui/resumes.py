"""Resuming from the page: the one rule of which runs the application's Clutch resumes
now is :func:`~nestegg.checkpoint.admission.resume_refusal`, the checks
``Clutch.resume_latest`` makes before it claims a run. The resume endpoint refuses the
others before anything starts (400, 409, also for a run whose event log is torn when the
resume has to read it; 500 for a run with no valid state to continue from); the run page
shows their button disabled, with the reason."""

from __future__ import annotations

from typing import Any

from nestegg.checkpoint.admission import resume_refusal
from nestegg.checkpoint.ownership import run_state
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.clutch import Clutch
from nestegg.constants import CANCELLED, FAILED, INTERRUPTED, WAITING
from nestegg.errors import RunWaiting

OFFERED = (FAILED, CANCELLED, WAITING, INTERRUPTED)
"""What a run is shown as (:func:`~nestegg.checkpoint.ownership.run_state`) when its page
shows a resume button: the runs a resume continues; not a queued one, which a worker
takes."""
WAIT_NOT_OVER = "not before its wait is over (its signal stored, or its deadline or timer passed)"


async def resume_offer(
    store: CheckpointStorage, clutch: Clutch, run: RunRecord, now: float
) -> dict[str, Any] | None:
    """The run page's resume button: None for none (a completed run, a run under way or
    queued for workers), else ``{"refused": None}`` for a button that resumes the run, or
    ``{"refused": why}`` for one shown disabled."""
    if run_state(run, now) not in OFFERED:
        return None
    refusal = await resume_refusal(store, clutch, run, now)
    if refusal is None:
        return {"refused": None}
    return {"refused": WAIT_NOT_OVER if isinstance(refusal, RunWaiting) else str(refusal)}
