"""Forking from the page: the one rule of which checkpoints the application's Clutch forks
from. The fork endpoint refuses the others before anything starts (400, 409); the state
page shows its fork button disabled, with the reason, and no editor."""

from __future__ import annotations

from typing import Any

from nestegg.checkpoint.admission import check_fork_pipeline, restored_cursor
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.views import CheckpointState
from nestegg.clutch import Clutch
from nestegg.errors import ConfigurationError, IncompatibleCheckpointError, NestEggError


def fork_refusal(clutch: Clutch, run: RunRecord, state: CheckpointState) -> NestEggError | None:
    """Why a fork by ``clutch`` from ``state`` (a checkpoint of ``run``) would be refused
    before it starts (None: it would start), as ``Clutch.fork`` checks it: a
    ConfigurationError (400) for a checkpoint of another pipeline's run, or a Clutch whose
    definition does not hold (``Clutch.validate``); an IncompatibleCheckpointError (409)
    for a checkpoint that continues with an agent the Clutch no longer has."""
    assert state.checkpoint is not None  # loaded from a checkpoint, not a run's input
    try:
        check_fork_pipeline(run, state.checkpoint.checkpoint_id, clutch.name)
        clutch.validate()
        restored_cursor(clutch, clutch.new_context(run.run_id, state.data), state)
    except (ConfigurationError, IncompatibleCheckpointError) as error:
        return error
    return None


def fork_offer(clutch: Clutch, run: RunRecord, state: CheckpointState) -> dict[str, Any]:
    """The state page's fork form: ``{"refused": None}`` for an editor and a button that
    forks, ``{"refused": why}`` for a button shown disabled."""
    refusal = fork_refusal(clutch, run, state)
    return {"refused": None if refusal is None else str(refusal)}
