"""Holding steps back while a store's commits pile up: the latency of a commit stays short.

With many runs at once whose steps do not wait (or whose waits end together), every run
soon waits on its step's commit, and a commit's latency grows with the commits ahead of it:
about N runs / (steps a second), 100 ms and more for 1,000 runs, however fast the store
writes (Little's law). A lease renewal, a cancel's commit or a run's end then waits as long.

A :class:`StepGate` keeps the commits waiting to be written, or being written, to about
``max_pending``: a run that would start its next step while that many are pending waits
first, oldest first, until the store has written some. The runs wait before their steps
instead of inside their commits: the aggregate stays the same (the store still writes
batches of many runs' commits, and the process works on the next batch while one is
written) and a commit is written in a few milliseconds. A run whose step waits on a model
is not held back unless that many commits are pending at the moment it starts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from nestegg.options import check_count


class StepGate:
    """Lets a run start its next step while fewer than ``max_pending`` commits are pending.

    Args:
        pending: the commits waiting to be written or being written.
        max_pending: the commits pending at most before the next steps wait.
    """

    def __init__(self, pending: Callable[[], int], max_pending: int) -> None:
        self._pending = pending
        self.max_pending = max_pending
        self._held: deque[asyncio.Future[None]] = deque()  # steps held back, oldest first
        self._let_go = 0  # steps let go and not started yet: their commits are to come
        self._loop: asyncio.AbstractEventLoop | None = None

    def _this_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop. A store used again by a new loop forgets the steps the old one
        held or let go (its tasks are gone, or never go on, when it ended without
        cancelling them): they would hold the new loop's steps back, and their futures,
        told on a closed loop, would fail the commit whose end made room."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop, self._held, self._let_go = loop, deque(), 0
        return loop

    def admission(self) -> Awaitable[None] | None:
        """None when a run may start its next step now; else what it awaits first."""
        loop = self._this_loop()
        if not self._held and self._pending() + self._let_go < self.max_pending:
            return None
        turn: asyncio.Future[None] = loop.create_future()
        self._held.append(turn)
        return turn

    def room_made(self) -> None:
        """Commits were written (or steps let go started): let the oldest steps held back
        go while fewer than ``max_pending`` commits are pending or to come."""
        try:
            loop = self._this_loop()
        except RuntimeError:  # a commit of a loop that ended, its coroutine closed
            return
        held = self._held
        let_go = 0
        while held and self._pending() + self._let_go < self.max_pending:
            turn = held.popleft()
            if not turn.done():  # not cancelled meanwhile
                turn.set_result(None)
                self._let_go += 1
                let_go += 1
        if let_go:
            # Once the steps let go have run up to their commits (their tasks go on first,
            # in the order they were let go): a step that does not wait is then pending as
            # its commit, a step that waits frees its place.
            loop.call_soon(self._started, let_go)

    def _started(self, let_go: int) -> None:
        self._let_go = max(0, self._let_go - let_go)
        self.room_made()


def pending_limit(given: object, store: str) -> int | None:
    """A store's ``max_pending_commits``: None (no limit) or a positive int.

    Raises:
        ConfigurationError: anything else, naming the store and the value.
    """
    if given is None:
        return None
    return check_count(given, "max_pending_commits", store, or_none=True)


__all__ = ["StepGate", "pending_limit"]
