"""Which channel a run's next step goes to: its agent's, or the pipeline's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nestegg.execution import RunExecution
from nestegg.strategies import Strategy

if TYPE_CHECKING:
    from nestegg.clutch import Clutch


def next_route(execution: RunExecution) -> str | None:
    """The agent whose channel the run's next step goes to; None: the pipeline's channel
    (a SELECTOR picks the agent in the worker that takes the step)."""
    if execution.pending_agent is not None:
        return execution.pending_agent
    upcoming = execution.cursor.upcoming()
    return upcoming if isinstance(upcoming, str) else None


def first_route(clutch: Clutch) -> str | None:
    """The agent whose channel a new run's first step goes to (None: the pipeline's)."""
    order = clutch.run_order
    if clutch.strategy is Strategy.SELECTOR or not order:
        return None
    return order[0]


__all__ = ["first_route", "next_route"]
