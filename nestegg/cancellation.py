"""A cancellation that a library lost is still a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the result of what it awaited when a
cancellation of the task arrives in the same turn of the loop as that result: the
awaiting code goes on as if nothing happened (CPython issue gh-86296, fixed in 3.12).
redis-py writes every command through ``asyncio.wait_for`` when a socket timeout is set,
its default since 8.0. A loop (a heartbeat, a consumer, a run's steps) whose task was
cancelled in that moment would run on, and whoever awaits the task would wait forever.

So nestegg cancels its tasks with :func:`cancel`, which also notes the request, and its
loops look at :func:`cancel_requested` once per turn. ``Task.cancelling()`` cannot tell
the same: it also counts cancellations that were handled and not taken back (an
``asyncio.TaskGroup`` whose child failed leaves its parent counted on Python 3.11 and
3.12), which are no request to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import Any

_requested: weakref.WeakSet[asyncio.Future[Any]] = weakref.WeakSet()
"""The tasks nestegg asked to stop (forgotten with them)."""


def cancel(task: asyncio.Future[Any]) -> bool:
    """Cancel ``task`` and note that it was asked to stop; what ``task.cancel()`` returns."""
    if task.done():
        return False
    _requested.add(task)
    return task.cancel()


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """:func:`cancel` ``task`` and wait for its end; its own error, if it raised one."""
    cancel(task)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def cancel_requested(task: asyncio.Future[Any] | None = None) -> bool:
    """Whether ``task`` (None: the current one) was cancelled with :func:`cancel`: it
    should stop, also if the ``CancelledError`` never reached it."""
    if task is None:
        task = asyncio.current_task()
    return task is not None and task in _requested


class CancelWatch:
    """Whether the task a loop of nestegg's own runs in (no user code in it: a heartbeat, a
    caller's wait) was asked to stop since the loop began: by :func:`cancel`, or by anyone's
    ``task.cancel()`` whose ``CancelledError`` a library lost (``asyncio.run`` cancels every
    task at its end, and waits for them). ``Task.cancelling()`` counts from the loop's
    start, so what it kept from before (a TaskGroup's handled failure) is left out.
    """

    __slots__ = ("_baseline", "_task")

    def __init__(self) -> None:
        self._task = asyncio.current_task()
        self._baseline = self._task.cancelling() if self._task is not None else 0

    def requested(self) -> bool:
        """Whether the loop should stop."""
        task = self._task
        return task is not None and (task in _requested or task.cancelling() > self._baseline)

    def raise_if_requested(self) -> None:
        """Raise ``CancelledError`` if :meth:`requested`."""
        if self.requested():
            raise asyncio.CancelledError


def raise_if_cancel_requested(task: asyncio.Future[Any] | None = None) -> None:
    """Raise ``CancelledError`` if ``task`` (None: the current one; a loop that runs often
    passes its task, found once) was cancelled with :func:`cancel`.

    Raises:
        asyncio.CancelledError: it was (see :func:`cancel_requested`).
    """
    if cancel_requested(task):
        raise asyncio.CancelledError


__all__ = [
    "CancelWatch",
    "cancel",
    "cancel_and_wait",
    "cancel_requested",
    "raise_if_cancel_requested",
]
