"""Tasks' writes kept for the checkpoint that follows them (``defer_writes=True``), and the
thread that commits them on their own once they waited ``DEFERRED_WRITES_DELAY``.

A step whose tasks all end quickly commits their writes with its checkpoint: one commit per
step. A task that ends while a sibling runs on (an LLM call) would otherwise wait for that
sibling, and a process killed meanwhile would run it again on resume; so writes that waited
``DEFERRED_WRITES_DELAY`` without their thread's next checkpoint are committed on their own.

The sync API runs the saver's event loop only inside its calls (:mod:`.loop`), so no timer
of that loop would fire while a long task runs: the timer is a daemon thread, which calls
back into the saver like any sync caller. It sleeps until the oldest writes are due (all
wait the same delay, so the oldest is the first in line), not at every step, and ends after
``DEFERRED_WRITES_LINGER`` without writes (the next one starts it again), so a saver never
closed does not keep a thread. After a failed commit (the store is down) it waits longer
each time (the delay, doubling, at most ``STORE_RETRY_MAX_DELAY``) until one succeeds, and
logs one warning when its commits begin to fail and one when they succeed again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from nestegg.checkpoint.stores.retry import backoff_delay
from nestegg.checkpoint.stores.threads import ThreadRow
from nestegg.constants import DEFERRED_WRITES_DELAY, DEFERRED_WRITES_LINGER

log = logging.getLogger("nestegg")


class DeferredWrites:
    """Write rows per LangGraph thread waiting for its next checkpoint (added from any
    thread), and the timer calling ``flush_due`` once some have waited ``delay`` seconds.

    ``flush_due`` runs on the timer's thread and is to commit (or put back) the rows of
    every thread :meth:`due` names.
    """

    def __init__(
        self,
        flush_due: Callable[[], None],
        delay: float = DEFERRED_WRITES_DELAY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flush_due = flush_due
        self._delay = delay
        self._clock = clock
        self._rows: dict[str, list[ThreadRow]] = {}
        self._since: dict[str, float] = {}  # in the order they began to wait: oldest first
        self._cond = threading.Condition(threading.Lock())
        self._timer: threading.Thread | None = None
        self._idle = False  # the timer waits for writes, not for a deadline
        self._closed = False
        self._failures = 0  # the timer's commits that failed in a row
        self._retry_at = 0.0  # the timer commits not before (set by a failed commit)
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def add(self, thread_id: str, rows: Sequence[ThreadRow]) -> None:
        """Keep ``rows`` for ``thread_id``'s next checkpoint."""
        with self._cond:
            held = self._rows.get(thread_id)
            if held is not None:
                held.extend(rows)
                return
            self._rows[thread_id] = list(rows)
            self._since[thread_id] = self._clock()
            self._wake()

    def put_back(self, thread_id: str, rows: list[ThreadRow]) -> None:
        """Rows taken for a commit that failed: they wait again (before any added since)."""
        if not rows:
            return
        with self._cond:
            self._rows[thread_id] = rows + self._rows.pop(thread_id, [])
            self._since.pop(thread_id, None)
            self._since[thread_id] = self._clock()
            self._wake()

    def take(self, thread_id: str) -> list[ThreadRow]:
        """The rows waiting for ``thread_id``, no longer waiting."""
        with self._cond:
            self._since.pop(thread_id, None)
            return self._rows.pop(thread_id, [])

    def thread_ids(self) -> list[str]:
        with self._cond:
            return list(self._rows)

    def due(self) -> list[str]:
        """The threads whose rows have waited ``delay`` seconds."""
        until = self._clock() - self._delay
        with self._cond:
            due: list[str] = []
            for thread_id, since in self._since.items():
                if since > until:
                    break
                due.append(thread_id)
            return due

    def commit_lock(self, thread_id: str) -> asyncio.Lock:
        """The lock (on the saver's loop) held while rows of ``thread_id`` are taken and
        committed: a timer's commit and a checkpoint's are not interleaved, and a read waits
        for the commit under way."""
        lock = self._locks.get(thread_id)
        if lock is None:
            lock = self._locks[thread_id] = asyncio.Lock()
        return lock

    def close(self) -> None:
        """Stop the timer, waiting for a commit of its under way (rows stay to be taken)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            timer = self._timer
        if timer is not None and timer is not threading.current_thread():
            timer.join()

    def _wake(self) -> None:
        """Start the timer, or wake it if it waits for writes (under ``_cond``)."""
        if self._closed:
            return
        if self._timer is None:
            self._timer = threading.Thread(
                target=self._run, name="nestegg-langgraph-writes", daemon=True
            )
            self._timer.start()
        elif self._idle:
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._since:
                    self._idle = True
                    self._cond.wait(DEFERRED_WRITES_LINGER)
                    self._idle = False
                    if not self._since:
                        break
                    continue
                due = next(iter(self._since.values())) + self._delay
                wait = max(due, self._retry_at) - self._clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                self._cond.release()
                try:
                    self._flush_due()
                except Exception as error:  # the rows wait on: the next checkpoint commits them
                    self._failed(error)
                else:
                    self._committed()
                finally:
                    self._cond.acquire()
            self._timer = None

    def _failed(self, error: Exception) -> None:
        """The timer's commit failed: back off, and warn if the one before succeeded."""
        level = logging.DEBUG if self._failures else logging.WARNING
        log.log(level, "deferred LangGraph writes not committed yet, retrying: %s", error)
        self._retry_at = self._clock() + backoff_delay(self._failures, self._delay)
        self._failures += 1

    def _committed(self) -> None:
        """The timer's commit succeeded: no backoff, and say so if the one before failed."""
        if self._failures:
            log.warning(
                "deferred LangGraph writes committed again after %d failed attempts",
                self._failures,
            )
        self._failures = 0
