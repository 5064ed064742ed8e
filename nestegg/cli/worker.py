"""The worker command: run a pipeline's steps from its broker until SIGTERM."""

from __future__ import annotations

from typing import Annotated

import typer

from nestegg.cli.app import CommandError, app, run_async
from nestegg.cli.apps import import_app
from nestegg.constants import EXIT_USAGE

WORKER_APP_HELP = (
    "The Clutch to serve, as module:attribute (e.g. myproject.pipelines:triage); the "
    "current directory is importable. It needs a transport= and a CheckpointConfig naming "
    "a store every worker reaches."
)


@app.command("worker")
def worker_command(
    app_spec: Annotated[str, typer.Argument(help=WORKER_APP_HELP, show_default=False)],
    concurrency: Annotated[int, typer.Option(min=1, help="Steps run at the same time.")] = 1,
    agents: Annotated[
        str | None,
        typer.Option(help="Comma-separated agents this worker hosts (default: all)."),
    ] = None,
    grace: Annotated[
        float,
        typer.Option(min=0, help="Seconds steps under way get to finish after SIGTERM."),
    ] = 30.0,
) -> None:
    """Run the steps of a pipeline's runs from its transport until SIGTERM or Ctrl-C.

    Each message runs one step of a run; a stopped worker releases what it cannot finish
    within the grace period so that another worker takes it at once.
    """
    clutch = import_app(app_spec, named="APP_SPEC")
    if clutch.transport is None:
        raise CommandError(
            f"the Clutch at {app_spec} has no transport= (e.g. transport='redis://...')",
            EXIT_USAGE,
        )
    hosted = None if agents is None else _agent_names(agents)

    async def work() -> None:
        try:
            await clutch.serve(concurrency=concurrency, agents=hosted, grace=grace)
        finally:
            await clutch.stop()

    run_async(work)


def _agent_names(agents: str) -> list[str]:
    """The names of ``--agents a,b``.

    Raises:
        CommandError: an empty list or an empty name in it (``''``, ``a,,b``): hosting no
            agent is not what a worker is for, and an empty name is a slip.
    """
    names = [name.strip() for name in agents.split(",")]
    if not all(names):
        raise CommandError(
            f"--agents must name agents, separated by commas (a,b), got {agents!r}", EXIT_USAGE
        )
    return names
