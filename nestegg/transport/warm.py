"""A run's state as a worker left it after a step, to go on from without reading the store."""

from __future__ import annotations

from typing import NamedTuple

from nestegg.checkpoint.formats import Snapshot
from nestegg.checkpoint.records import RunRecord
from nestegg.execution import RunExecution


class Warm(NamedTuple):
    """A run's state as this worker left it after a step (fence and sequence numbers as
    committed), to continue from without reading the store again."""

    fence: int
    step_seq: int
    event_seq: int
    execution: RunExecution
    base: Snapshot
    kept: tuple[str, ...]

    def continues(self, claimed: RunRecord) -> bool:
        """Whether ``claimed`` is the run as left, claimed again by this worker: nobody
        claimed it in between (the fence moved by one) and nothing was committed since."""
        return (
            claimed.fence == self.fence + 1
            and claimed.step_seq == self.step_seq
            and claimed.event_seq == self.event_seq
        )


__all__ = ["Warm"]
