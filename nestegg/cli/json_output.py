"""The ``--json`` of the command under way: whether it was given, and whether the command
wrote JSON on stdout (its error's JSON object then stays off stdout)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class JsonOutput:
    """Whether ``--json`` was ``requested``, and whether JSON was ``written`` on stdout."""

    requested: bool = False
    written: bool = False


state = JsonOutput()
"""The command under way's (a new one as each command starts)."""
