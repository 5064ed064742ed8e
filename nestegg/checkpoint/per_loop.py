"""One object per event loop, made on its first use there and dropped once its loop is
closed and another needs its own (the object holds its loop, so the weak key alone would
never let go of it): the
timers that serve all the runs of a loop (:mod:`~nestegg.checkpoint.live_starts`,
:mod:`~nestegg.checkpoint.heartbeat`)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerLoop(Generic[T]):
    """Calling it gives the running loop's object, made by ``make(loop)`` the first time."""

    def __init__(self, make: Callable[[asyncio.AbstractEventLoop], T]) -> None:
        self._make = make
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = (
            weakref.WeakKeyDictionary()
        )

    def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        found = self._by_loop.get(loop)
        if found is None:
            for closed in [old for old in self._by_loop if old.is_closed()]:
                del self._by_loop[closed]  # its object holds it: it never goes by itself
            found = self._by_loop[loop] = self._make(loop)
        return found


__all__ = ["PerLoop"]
