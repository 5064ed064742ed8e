"""A cancellation that a library lost is still a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the result of what it awaited when a
cancellation of the task arrives in the same turn of the loop as that result: the
awaiting code goes on as if nothing happened (CPython issue gh-86296, fixed in 3.12).
redis-py sends every command through ``asyncio.wait_for`` when a socket timeout is set,
its default since 8.0. A loop (a heartbeat, a consumer, a run's steps) whose task was
cancelled in that moment would run on, and whoever awaits the task would wait forever.

The task still says it was asked to stop: ``Task.cancelling()`` counts the cancellations
asked for and not taken back (``asyncio.timeout`` takes back its own). The loops of
nestegg look at it once per turn, where they would otherwise have waited again.
"""

from __future__ import annotations

import asyncio
from typing import Any


def cancel_requested(task: asyncio.Task[Any] | None = None) -> bool:
    """Whether ``task`` (None: the current one) was cancelled and the cancellation did not
    reach it as ``CancelledError`` (a library lost it), so that it should stop now."""
    if task is None:
        task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def raise_if_cancel_requested(task: asyncio.Task[Any] | None = None) -> None:
    """Raise ``CancelledError`` if the cancellation of ``task`` (None: the current one; a
    loop that runs often passes its task, found once) was lost on the way.

    Raises:
        asyncio.CancelledError: the task was cancelled (see :func:`cancel_requested`).
    """
    if cancel_requested(task):
        raise asyncio.CancelledError


__all__ = ["cancel_requested", "raise_if_cancel_requested"]
