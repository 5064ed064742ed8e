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


def raise_if_cancel_requested(task: asyncio.Future[Any] | None = None) -> None:
    """Raise ``CancelledError`` if ``task`` (None: the current one; a loop that runs often
    passes its task, found once) was cancelled with :func:`cancel`.

    Raises:
        asyncio.CancelledError: it was (see :func:`cancel_requested`).
    """
    if cancel_requested(task):
        raise asyncio.CancelledError


__all__ = ["cancel", "cancel_and_wait", "cancel_requested", "raise_if_cancel_requested"]
