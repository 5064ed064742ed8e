"""The ``nestegg`` command: inspect, resume, recover and clean up stored runs.

Imported only by the console script (and ``python -m nestegg``): ``import nestegg`` never
imports typer or rich. The command modules below declare the commands; what a command
uses is imported when it runs (see :mod:`nestegg.cli.app`).
"""

from __future__ import annotations

import sys

from nestegg.cli import cancel, housekeeping, operate, recover, runs, signals, threads, ui, worker
from nestegg.cli.app import app
from nestegg.cli.logs import configure_logging

_COMMAND_MODULES = (runs, operate, recover, signals, cancel, housekeeping, threads, ui, worker)


def main() -> None:
    """Run the ``nestegg`` command with ``sys.argv`` (exits with its exit code)."""
    configure_logging(sys.argv[1:])
    app(prog_name="nestegg")


__all__ = ["app", "main"]
