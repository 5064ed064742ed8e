"""Resuming from the page: the one rule of which runs the application's Clutch resumes
now, made of the checks ``Clutch.resume_latest`` makes before it claims a run. The resume
endpoint refuses the others before anything starts (400, 409; 500 for a run with no valid
state to continue from); the run page shows their button disabled, with the reason."""

from __future__ import annotations

from typing import Any

from nestegg.checkpoint.admission import check_pipeline, restored_cursor, resume_point
from nestegg.checkpoint.ownership import is_interrupted, owner_alive
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.waiting import still_waiting
from nestegg.clutch import Clutch
from nestegg.constants import CANCELLED, COMPLETED, FAILED, WAITING
from nestegg.errors import (
    CheckpointCorruptedError,
    ConfigurationError,
    IncompatibleCheckpointError,
    NestEggError,
    RunLockedError,
    RunWaiting,
)

OFFERED = (FAILED, CANCELLED, WAITING)
"""Stored statuses whose page shows a resume button (and interrupted runs): the runs a
resume continues."""
WAIT_NOT_OVER = "not before its wait is over (its signal stored, or its deadline or timer passed)"


async def resume_refusal(
    store: CheckpointStorage, clutch: Clutch, run: RunRecord, now: float
) -> NestEggError | None:
    """Why a resume of ``run`` by ``clutch`` would be refused now (None: it would start):
    a ConfigurationError (400) for a run of another pipeline, a Clutch whose definition
    does not hold (``Clutch.validate``) or a completed run; a RunLockedError (409) for a
    run a live process executes; a RunWaiting (409) for a waiting run whose signal is not
    stored and whose deadline or timer has not passed; an IncompatibleCheckpointError
    (409) for a run whose newest valid checkpoint continues with an agent the Clutch no
    longer has; a CheckpointCorruptedError (500) for a run with no valid state to
    continue from (a fork without a valid checkpoint, a damaged input)."""
    try:
        check_pipeline(run, clutch.name)
        clutch.validate()
    except ConfigurationError as error:
        return error
    if run.status == COMPLETED:
        return ConfigurationError(
            f"run {run.run_id!r} is completed: there is nothing to resume (fork it from a "
            "checkpoint to run its steps again)"
        )
    if owner_alive(run, now):
        return RunLockedError(f"run {run.run_id!r} is executing; not resumed", run.run_id)
    if (waiting := await still_waiting(store, run, now)) is not None:
        return waiting
    try:
        state, _ = await resume_point(store, run)
        restored_cursor(clutch, clutch.new_context(run.run_id, state.data), state)
    except (CheckpointCorruptedError, IncompatibleCheckpointError) as error:
        return error
    return None


async def resume_offer(
    store: CheckpointStorage, clutch: Clutch, run: RunRecord, now: float
) -> dict[str, Any] | None:
    """The run page's resume button: None for none (a completed run, a run under way),
    else ``{"refused": None}`` for a button that resumes the run, or ``{"refused": why}``
    for one shown disabled."""
    if run.status not in OFFERED and not is_interrupted(run, now):
        return None
    refusal = await resume_refusal(store, clutch, run, now)
    if refusal is None:
        return {"refused": None}
    return {"refused": WAIT_NOT_OVER if isinstance(refusal, RunWaiting) else str(refusal)}
