"""The saver's own event loop, on a thread: every store call runs there.

LangGraph calls a saver from sync code (``invoke``) and from any event loop
(``ainvoke``); a store's connections belong to one loop. So the saver keeps one loop on a
daemon thread and runs each store call on it.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running on a thread of its own until :meth:`stop`."""

    def __init__(self, name: str = "nestegg-langgraph") -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it (from a thread that is not the loop's)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and await it from another loop."""
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return await asyncio.wrap_future(future)

    @property
    def running(self) -> bool:
        return not self._loop.is_closed()

    def stop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()


_LOOPS: weakref.WeakKeyDictionary[Any, LoopThread] = weakref.WeakKeyDictionary()
_LOOPS_LOCK = threading.Lock()


def loop_of(store: Any) -> LoopThread:
    """The loop every saver over ``store`` uses (its connections belong to one loop)."""
    with _LOOPS_LOCK:
        loop = _LOOPS.get(store)
        if loop is None or not loop.running:
            loop = _LOOPS[store] = LoopThread()
        return loop
