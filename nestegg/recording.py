"""What the step loop hands to whatever records a run: the shared record types.

Neutral ground between the orchestrator (``execution.py``) and checkpointing
(``checkpoint/``): both import it, neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(slots=True)
class StepResult:
    """What one executed step did, and where the run stands after it."""

    seq: int
    agent: str
    outcome: str
    output: bytes | None
    started: float
    duration: float
    target: str | None
    turn: int
    data_seq: int
    source: str
    position: dict[str, Any]
    metadata: dict[str, Any] = field(default_factory=dict)


class Timed(NamedTuple):
    """When a journaled call began (epoch seconds) and how long it took (seconds, measured
    with ``time.perf_counter()``, its retries included)."""

    started: float
    duration: float
