"""What every store says the same way: the errors of the store contract, written once.

Each store raises these (``raise run_not_found(run_id)``) instead of writing the text out.
"""

from __future__ import annotations

from nestegg.errors import RunExistsError, RunLockedError, RunNotFoundError, StaleOwnerError


def run_not_found(run_id: str) -> RunNotFoundError:
    """A writer named a run the store does not have."""
    return RunNotFoundError(f"no run {run_id!r}", run_id)


def run_exists(run_id: str) -> RunExistsError:
    """``create_run`` with an id that is taken."""
    return RunExistsError(f"run {run_id!r} exists", run_id)


def run_claimed(run_id: str) -> RunLockedError:
    """``claim_run`` lost: the fence moved on."""
    return RunLockedError(f"run {run_id!r} was claimed by another owner", run_id)


def stale_fence(run_id: str, stored: int, carried: int) -> StaleOwnerError:
    """``commit`` carries fence ``carried`` but the run is at ``stored``."""
    return StaleOwnerError(
        f"run {run_id!r} is owned by a newer owner (fence {stored}, this write carries {carried})",
        run_id,
    )


__all__ = ["run_claimed", "run_exists", "run_not_found", "stale_fence"]
