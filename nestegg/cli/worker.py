"""The worker command: run a pipeline's steps from its broker until SIGTERM."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import CommandError, app, describe_store, run_async
from nestegg.cli.apps import import_app
from nestegg.cli.seconds import seconds_parser
from nestegg.constants import EXIT_USAGE
from nestegg.urls import without_password

if TYPE_CHECKING:
    from nestegg.clutch import Clutch

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
        typer.Option(
            parser=seconds_parser(0), help="Seconds steps under way get to finish after SIGTERM."
        ),
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
    started = serving_line(clutch, hosted, concurrency)

    def ready() -> None:
        sys.stderr.write(started + "\n")
        sys.stderr.flush()

    async def work() -> None:
        try:
            await clutch.serve(concurrency=concurrency, agents=hosted, grace=grace, on_ready=ready)
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


def serving_line(clutch: Clutch, agents: list[str] | None, concurrency: int) -> str:
    """The line a worker prints on stderr once it consumes: its pipeline, agents, broker
    (without a password) and store."""
    from nestegg.telemetry import store_shown

    names = ", ".join(agents if agents is not None else clutch.agent_names)
    config = clutch.checkpoint_config  # a Clutch with a transport has one
    storage = config.storage if config is not None else None
    store = describe_store(None) if storage is None else store_shown(storage)
    return (
        f"nestegg worker: serving pipeline {clutch.name!r} (agents {names}; concurrency "
        f"{concurrency}) from {_broker_shown(clutch.transport)}, store {store}; SIGTERM or "
        "Ctrl-C stops it"
    )


def _broker_shown(transport: Any) -> str:
    """The broker's URL without its password (a transport built on a client: its
    address), else the transport's class."""
    where = getattr(transport, "where", None) or getattr(transport, "url", None)
    return without_password(where) if isinstance(where, str) else type(transport).__name__
