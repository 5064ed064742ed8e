"""When a step in flight has run ``LIVE_STEP_DELAY``: one timer for all the runs of a loop.

A checkpointer commits the start of a step on its own once the step has run that long
(for the live views). A timer per step would cost the event loop a push and a pop on its
heap of timers for every step, and that heap holds one timer per run: with thousands of
runs at once, their steps' timers alone were a noticeable share of a step's CPU
(``bench/concurrent_runs.py``). Here the steps' deadlines wait in one queue in the order
they started (all have the same delay), and one timer wakes up for the oldest, at most
every ``LIVE_STEP_DELAY / 5``: a start is published between ``LIVE_STEP_DELAY`` and
``1.2 * LIVE_STEP_DELAY`` after it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import Protocol

from nestegg.checkpoint.per_loop import PerLoop
from nestegg.constants import LIVE_STEP_DELAY

_GRAIN = LIVE_STEP_DELAY / 5


class StartPublisher(Protocol):
    """What publishes the start of its step ``seq`` if that step is still in flight."""

    def publish_start(self, seq: int) -> None: ...


class LiveStarts:
    """The steps of one event loop's runs waiting for their start to be due. The timer
    runs in an empty context of its own: one copied from the run that set it would keep
    that run's context alive and publish the others' starts in it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # Three queues side by side, not one of tuples: no container per step for the
        # garbage collector (the steps' entries outlive its young generation).
        self._at: deque[float] = deque()
        self._publishers: deque[StartPublisher] = deque()
        self._seqs: deque[int] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, publisher: StartPublisher, seq: int) -> None:
        """Call ``publisher.publish_start(seq)`` ``LIVE_STEP_DELAY`` from now."""
        at = self._loop.time() + LIVE_STEP_DELAY
        self._at.append(at)
        self._publishers.append(publisher)
        self._seqs.append(seq)
        if self._timer is None:
            self._timer = self._loop.call_at(at, self._fire, context=contextvars.Context())

    def _fire(self) -> None:
        now = self._loop.time()
        due, publishers, seqs = self._at, self._publishers, self._seqs
        while due and due[0] <= now:
            due.popleft()
            publishers.popleft().publish_start(seqs.popleft())
        self._timer = (
            self._loop.call_at(max(due[0], now + _GRAIN), self._fire, context=contextvars.Context())
            if due
            else None
        )


live_starts = PerLoop(LiveStarts)
"""The running loop's :class:`LiveStarts`."""


__all__ = ["LiveStarts", "StartPublisher", "live_starts"]
