"""Forking from the page: the one rule of which checkpoints the application's Clutch forks
from is :func:`~nestegg.checkpoint.admission.check_fork`, the checks ``Clutch.fork``
makes before it stores a run. The fork endpoint refuses the others before anything
starts (400, 409) through :func:`~nestegg.checkpoint.admission.fork_start`, which checks
the pipeline before it reads the checkpoint's state; the state page shows its fork button
disabled, with the reason, and no editor (:func:`fork_offer`)."""

from __future__ import annotations

from typing import Any

from nestegg.checkpoint.admission import fork_refusal
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.views import CheckpointState
from nestegg.clutch import Clutch


def fork_offer(clutch: Clutch, run: RunRecord, state: CheckpointState) -> dict[str, Any]:
    """The state page's fork form: ``{"refused": None}`` for an editor and a button that
    forks, ``{"refused": why}`` for a button shown disabled."""
    assert state.checkpoint is not None  # loaded from a checkpoint, not a run's input
    refusal = fork_refusal(clutch, run, state.checkpoint.checkpoint_id, state)
    return {"refused": None if refusal is None else str(refusal)}
