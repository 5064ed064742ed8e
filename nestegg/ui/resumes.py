"""Resuming from the page: the one rule of which runs the application's Clutch resumes
now. The resume endpoint refuses the others before anything starts (400, 409); the run
page shows their button disabled, with the reason."""

from __future__ import annotations

from typing import Any

from nestegg.checkpoint.admission import check_pipeline
from nestegg.checkpoint.ownership import is_interrupted, owner_alive
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.waiting import still_waiting
from nestegg.constants import CANCELLED, COMPLETED, FAILED, WAITING
from nestegg.errors import ConfigurationError, NestEggError, RunLockedError, RunWaiting

OFFERED = (FAILED, CANCELLED, WAITING)
"""Stored statuses whose page shows a resume button (and interrupted runs): the runs a
resume continues."""
WAIT_NOT_OVER = "not before its wait is over (its signal stored, or its deadline or timer passed)"


async def resume_refusal(
    store: CheckpointStorage, pipeline: str, run: RunRecord, now: float
) -> NestEggError | None:
    """Why a resume of ``run`` by the Clutch of ``pipeline`` would be refused now (None:
    it would start): a ConfigurationError (400) for a run of another pipeline or a
    completed one, a RunLockedError (409) for a run a live process executes, a RunWaiting
    (409) for a waiting run whose signal is not stored and whose deadline or timer has
    not passed."""
    try:
        check_pipeline(run, pipeline)
    except ConfigurationError as error:
        return error
    if run.status == COMPLETED:
        return ConfigurationError(
            f"run {run.run_id!r} is completed: there is nothing to resume (fork it from a "
            "checkpoint to run its steps again)"
        )
    if owner_alive(run, now):
        return RunLockedError(f"run {run.run_id!r} is executing; not resumed", run.run_id)
    return await still_waiting(store, run, now)


async def resume_offer(
    store: CheckpointStorage, pipeline: str, run: RunRecord, now: float
) -> dict[str, Any] | None:
    """The run page's resume button: None for none (a completed run, a run under way),
    else ``{"refused": None}`` for a button that resumes the run, or ``{"refused": why}``
    for one shown disabled."""
    if run.status not in OFFERED and not is_interrupted(run, now):
        return None
    refusal = await resume_refusal(store, pipeline, run, now)
    if refusal is None:
        return {"refused": None}
    return {"refused": WAIT_NOT_OVER if isinstance(refusal, RunWaiting) else str(refusal)}
