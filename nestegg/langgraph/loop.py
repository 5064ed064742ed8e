"""The saver's own event loop: every store call runs there.

LangGraph calls a saver from sync code (``invoke``, from its worker threads) and from any
event loop (``ainvoke``); a store's connections belong to one loop. So each store gets one
loop. While only sync code calls it, the calling thread runs the loop for the length of
its call (one at a time, under a lock): no hop to another thread and back, which costs
two thread wake-ups a call. From the first call made from an event loop (or from sync
code on a thread whose own loop is running) the loop runs on a daemon thread of its own
instead, and every call is handed to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

from nestegg.errors import StorageUnavailableError

T = TypeVar("T")
STOPPED = "the saver's store was closed before this call ended (close() ran meanwhile)"


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class LoopThread:
    """An event loop run by its sync callers, or on a thread of its own once an async
    caller came, until :meth:`stop`."""

    def __init__(self, name: str = "nestegg-langgraph") -> None:
        self._loop = asyncio.new_event_loop()
        self._name = name
        self._inline = threading.Lock()  # held while a caller runs the loop itself
        self._thread: threading.Thread | None = None
        self._runner: int | None = None  # the thread running the loop itself, if one is
        self._handing = threading.Lock()  # held while a call is handed to the loop's thread
        self._stopping = False

    def _start_thread(self) -> threading.Thread:
        with self._inline:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._loop.run_forever, name=self._name, daemon=True
                )
                thread.start()
                self._thread = thread
            return self._thread

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it (from a thread that is not the loop's)."""
        if threading.current_thread() is self._thread or threading.get_ident() == self._runner:
            coro.close()
            raise RuntimeError("LoopThread.run called from its own loop")
        if self._thread is None and not _in_event_loop():
            with self._inline:
                if self._stopping or self._loop.is_closed():
                    coro.close()
                    raise StorageUnavailableError(STOPPED)
                if self._thread is None:
                    self._runner = threading.get_ident()
                    try:
                        return self._loop.run_until_complete(coro)
                    finally:
                        self._runner = None
        self._start_thread()
        future = self._hand_over(coro)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._stopping:
                raise StorageUnavailableError(STOPPED) from None
            raise

    async def arun(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and await it from another loop."""
        if self._thread is None:
            await asyncio.to_thread(self._start_thread)  # waits out a sync caller's run
        future = self._hand_over(coro)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancelled() and self._stopping:
                raise StorageUnavailableError(STOPPED) from None
            raise

    def _hand_over(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """``coro`` handed to the loop's thread; refused once :meth:`stop` began, so that
        no call waits for a loop that no longer runs."""
        with self._handing:
            if self._stopping or self._loop.is_closed():
                coro.close()
                raise StorageUnavailableError(STOPPED)
            return asyncio.run_coroutine_threadsafe(coro, self._loop)

    @property
    def running(self) -> bool:
        return not self._loop.is_closed()

    def stop(self) -> None:
        """Stop and close the loop. Calls still under way on its thread (other threads'
        calls, while one closes the saver) are cancelled and raise
        StorageUnavailableError, as do calls made from now on, instead of waiting for a
        loop that no longer runs."""
        with self._handing:
            if self._stopping or self._loop.is_closed():
                return
            self._stopping = True
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.create_task, _cancel_all_then_stop())
            self._thread.join()
            self._loop.close()
            return
        with self._inline:
            self._loop.close()


async def _cancel_all_then_stop() -> None:
    """Cancel every other task of the running loop, wait for them, then stop the loop."""
    loop = asyncio.get_running_loop()
    others = [task for task in asyncio.all_tasks(loop) if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    loop.stop()


_LOOPS: weakref.WeakKeyDictionary[Any, LoopThread] = weakref.WeakKeyDictionary()
_LOOPS_LOCK = threading.Lock()


def loop_of(store: Any) -> LoopThread:
    """The loop every saver over ``store`` uses (its connections belong to one loop)."""
    with _LOOPS_LOCK:
        loop = _LOOPS.get(store)
        if loop is None or not loop.running:
            loop = _LOOPS[store] = LoopThread()
        return loop
