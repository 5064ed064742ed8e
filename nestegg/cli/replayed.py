"""What the commands say of a run that failed on a journaled call's failure replayed from
its journal: a step that caught a call's failure and was interrupted (its process killed,
the run cancelled or waiting) replays that failure when the run resumes, and fails with
it when it no longer catches it. The run is failed then, and its next resume makes the
call again (a failed run's failed step replays its calls only up to its first failure)."""

from __future__ import annotations

import shlex

from nestegg.cli.app import CommandError, error_line
from nestegg.constants import EXIT_FAILED
from nestegg.errors import JournaledCallError


def replayed_failure_error(run_id: str, error: JournaledCallError, options: str) -> CommandError:
    """The error (exit 1) saying that run ``run_id`` failed on ``error``, a failure replayed
    from its journal, and that resuming it again (``nestegg resume`` with ``options``:
    --app, --store) makes the call again."""
    message = f"run {run_id!r} failed: {replayed_failure(run_id, error_line(error), options)}"
    return CommandError(message, EXIT_FAILED, {"run_id": run_id, "replayed": error.function})


def replayed_failure(run_id: str, error: str, options: str) -> str:
    """What is said of run ``run_id``'s failure ``error`` (its line), replayed from its
    journal, and of the resume (``nestegg resume`` with ``options``) that makes it again."""
    return (
        f"{error}, replayed from the run's journal (the call failed for good before the run "
        "was interrupted); the run is failed now, and resuming it makes the call again: "
        f"nestegg resume {shlex.quote(run_id)} {options}"
    )
