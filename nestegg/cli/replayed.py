"""What the commands say of a run that failed on a journaled call's failure replayed from
its journal: a call that failed for good is not made again by a resume, which replays its
failure each time; forking the run from the checkpoint before the call makes it again."""

from __future__ import annotations

import shlex

from nestegg.cli.app import CommandError, error_line
from nestegg.clutch import Clutch
from nestegg.constants import EXIT_FAILED
from nestegg.errors import JournaledCallError


async def replayed_failure_error(
    clutch: Clutch, run_id: str, error: JournaledCallError, options: str
) -> CommandError:
    """The error (exit 1) saying that run ``run_id`` failed on ``error``, a failure replayed
    from its journal, and how to make the call again: ``nestegg fork`` from its newest
    checkpoint (which precedes the step that replayed it) with ``options`` (--app,
    --store), or ``replay='rerun'``."""
    checkpoints = await clutch.list_checkpoints(run_id)
    newest = checkpoints[-1].checkpoint_id if checkpoints else None
    fork = (
        f"nestegg fork {newest} {options}"
        if newest is not None
        else f"nestegg fork CHECKPOINT {options} (nestegg checkpoints {shlex.quote(run_id)} "
        "lists them)"
    )
    message = (
        f"run {run_id!r} failed: {error_line(error)}, replayed from the run's journal: the "
        "call failed for good when it was made, and a resume replays its failure rather "
        "than calling it again; to call it again, fork the run from the checkpoint before "
        f"it: {fork} (the steps after that checkpoint run again, their journaled calls "
        "too), or give the call replay='rerun'"
    )
    details = {"run_id": run_id, "replayed": error.function, "fork_from": newest}
    return CommandError(message, EXIT_FAILED, details)
