"""A clock for tests of leases, TTL and intervals: time moves only when the test says so."""

from __future__ import annotations

import time


class FakeClock:
    """A callable giving UNIX seconds, standing still until :meth:`advance` moves it; it
    starts at ``start``, else at the current whole second.

    Pass it as ``CheckpointConfig(clock=...)``.

    Example:
        >>> clock = FakeClock()
        >>> config = CheckpointConfig(storage=store, clock=clock)
        >>> clock.advance(31)  # every lease taken so far has expired
    """

    def __init__(self, start: float | None = None) -> None:
        self.now = float(int(time.time())) if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the time forward by ``seconds``."""
        self.now += seconds
