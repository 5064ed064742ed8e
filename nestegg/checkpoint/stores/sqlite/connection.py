"""The SQLite store's one connection, and which thread uses it when.

Anything that may wait runs off the event loop, so it never waits on a lock or on the
disk: opening the file, reads and a write that has to wait for another connection's
write lock run on the store's worker thread; the WAL checkpoints that copy the WAL back
into the database (the only place ``synchronous=NORMAL`` syncs a file) on a thread of
their own.

A write transaction that can take SQLite's write lock at once runs on the loop thread
instead (:meth:`SQLiteConnection.write`): in WAL mode with ``synchronous=NORMAL`` a commit
is tens of microseconds of in-memory work and writes into the OS page cache, with no
sync, while the hop to a worker thread and back costs several times that. The attempt
sets SQLite's busy timeout to zero for its ``BEGIN IMMEDIATE``: if another connection
holds the lock, it gives up at once and the write goes to the worker thread, which
waits with the usual busy timeout. The attempt is made only while the database is in
WAL mode (or in memory).

WAL checkpoints are taken off the write path for the same reason: about every
``SQLITE_WAL_CHECKPOINT_PAGES`` pages written (estimated from each write's size), at most
once per ``SQLITE_WAL_CHECKPOINT_INTERVAL``, a second thread runs one on a second
connection of its own, so writes go on while it syncs the files, on the loop thread and
on the worker alike. SQLite's own automatic checkpoint stays on as a backstop at
``SQLITE_WAL_AUTOCHECKPOINT_PAGES`` (for writers that count nothing: other processes,
short-lived stores). What may still touch the disk on the loop thread, rarely:
that backstop, and the sync of the WAL header when SQLite starts reusing the WAL after a
checkpoint.

A child process made by ``fork()`` drops the parent's connections and threads without
touching them (SQLite connections must not cross a fork) and opens its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from nestegg.checkpoint.stores.sqlite.errors import is_busy
from nestegg.constants import (
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_PAGE_SIZE,
    SQLITE_PAGES_PER_WRITE,
    SQLITE_WAL_CHECKPOINT_INTERVAL,
    SQLITE_WAL_CHECKPOINT_PAGES,
)
from nestegg.errors import StorageError

T = TypeVar("T")
Work = Callable[..., T]
log = logging.getLogger("nestegg")

_NOT_RUN: Any = object()
_WAL_BYTES_PER_CHECKPOINT = SQLITE_WAL_CHECKPOINT_PAGES * SQLITE_PAGE_SIZE
_WAL_CHECKPOINT_INTERVAL = SQLITE_WAL_CHECKPOINT_INTERVAL
_WAL_BYTES_PER_WRITE = SQLITE_PAGES_PER_WRITE * SQLITE_PAGE_SIZE
_SET_NO_WAIT = "PRAGMA busy_timeout = 0"
_INLINE_JOURNAL_MODES = frozenset({"wal", "memory"})
_open_connections: weakref.WeakSet[SQLiteConnection] = weakref.WeakSet()


def _forget_all_after_fork() -> None:
    for connection in list(_open_connections):
        connection._forget_after_fork()


os.register_at_fork(after_in_child=_forget_all_after_fork)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _hand_back(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
) -> None:
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop closed while the work ran: nobody is waiting
        pass


def use_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Put the database in WAL mode where SQLite can (a database in memory, or a file
    system whose locking rules WAL out, keeps the mode SQLite gives it).

    Converting a file needs it to itself, and SQLite gives up at once instead of waiting
    (no busy handler) when another connection writes or converts it too, as two
    processes opening a new file at the same moment do. A busy conversion is therefore
    retried, with a growing pause, for up to ``timeout_s``; a file already in WAL mode,
    as it stays once converted, needs no lock at all.

    Raises:
        sqlite3.OperationalError: the file stayed busy for ``timeout_s``.
    """
    if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


class SQLiteConnection:
    """One lazily opened connection, shared by the loop thread and one worker thread, and
    a second one for WAL checkpoints, on a thread of its own.

    Args:
        opener: opens and sets up the connection (on the worker thread).
        wal_opener: opens a plain connection to the same file for WAL checkpoints;
            None for a database without a WAL (in memory).
        wrap_error: turns a driver or file-system error into the nestegg error to raise.
        busy_timeout_ms: how long a write on the worker thread waits for the write lock
            (what ``opener`` sets; commits on the loop thread run without it, and the
            worker restores it before its own work).
    """

    def __init__(
        self,
        opener: Callable[[], sqlite3.Connection],
        wrap_error: Callable[[sqlite3.Error | OSError], StorageError],
        busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
        wal_opener: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        self._wal_opener = wal_opener
        self._wal_conn: sqlite3.Connection | None = None
        self._set_wait = f"PRAGMA busy_timeout = {int(busy_timeout_ms)}"
        self._opener = opener
        self._wrap_error = wrap_error
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._setup_lock = threading.Lock()
        self._wal_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._wal_executor: ThreadPoolExecutor | None = None
        self._wal_bytes = 0
        self._next_wal_checkpoint = 0.0
        """When the next WAL checkpoint may start (``time.monotonic()``)."""
        self._inline_ok = False
        self._waits = True
        _open_connections.add(self)

    async def call(self, work: Work[T], *args: Any) -> T:
        """Run ``work(connection, *args)`` on the worker thread and await its result.

        The worker hands the outcome straight back with ``call_soon_threadsafe``: one
        wake-up of the loop, without chaining a second future.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._worker().submit(self._in_worker, loop, future, work, args)
        return await future

    async def write(self, work: Work[T], *args: Any, size: int = 0, small: bool = True) -> T:
        """Run the write transaction ``work(connection, *args)``: on the loop thread when
        it is ``small`` and SQLite's write lock is free at once, else on the worker.

        ``size``: about how many bytes it writes (spaces the WAL checkpoints).
        """
        result = self._write_inline(work, args) if small else _NOT_RUN
        if result is _NOT_RUN:
            result = await self.call(work, *args)
        self._count_write(size)
        return result

    async def close(self) -> None:
        """Close the connections and stop the threads; a later call reopens them.

        The work already queued, and a WAL checkpoint under way, finish first; off the
        loop thread, and to the end even if the caller is cancelled.
        """
        executor, self._executor = self._executor, None
        wal_executor, self._wal_executor = self._wal_executor, None
        if executor is None and wal_executor is None:
            return

        def shut_down() -> None:
            for pool in (executor, wal_executor):
                if pool is not None:
                    pool.shutdown(wait=True)
            self._close()

        await asyncio.to_thread(shut_down)

    def _worker(self) -> ThreadPoolExecutor:
        executor = self._executor
        if executor is None:
            with self._setup_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        max_workers=1, thread_name_prefix="nestegg-sqlite"
                    )
                executor = self._executor
        return executor

    def _wal_worker(self) -> ThreadPoolExecutor:
        with self._setup_lock:
            if self._wal_executor is None:
                self._wal_executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="nestegg-sqlite-wal"
                )
            return self._wal_executor

    def _forget_after_fork(self) -> None:
        """In a forked child: drop the parent's connections and threads, untouched."""
        self._conn = self._wal_conn = None
        self._executor = self._wal_executor = None
        self._lock, self._setup_lock, self._wal_lock = (threading.Lock() for _ in range(3))
        self._wal_bytes = 0

    def _in_worker(
        self,
        loop: asyncio.AbstractEventLoop,
        future: asyncio.Future[T],
        work: Work[T],
        args: tuple[Any, ...],
    ) -> None:
        if future.cancelled():  # given up on before it started: do nothing
            return
        try:
            with self._lock:
                conn = self._ready_connection()
                result = work(conn, *args)
        except (sqlite3.Error, OSError) as exc:
            error = self._wrap_error(exc)
            error.__cause__ = exc
            _hand_back(loop, future, None, error)
        except BaseException as exc:  # handed to the awaiting task, raised there
            _hand_back(loop, future, None, exc)
        else:
            _hand_back(loop, future, result, None)

    def _ready_connection(self) -> sqlite3.Connection:
        """The open connection, out of any transaction and waiting for locks again."""
        conn = self._conn
        if conn is None:
            conn = self._conn = self._opener()
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            self._inline_ok = str(mode).lower() in _INLINE_JOURNAL_MODES
            self._waits = True
        if conn.in_transaction:  # left behind by an interrupted attempt
            conn.rollback()
        if not self._waits:
            conn.execute(self._set_wait)
            self._waits = True
        return conn

    def _close(self) -> None:
        with self._lock, self._wal_lock:
            for conn in (self._conn, self._wal_conn):
                if conn is not None:
                    conn.close()
            self._conn = self._wal_conn = None

    def _write_inline(self, work: Work[T], args: tuple[Any, ...]) -> T:
        """``work`` run here if the connection is open and idle and the write lock free."""
        conn = self._conn
        if (
            conn is None
            or not self._inline_ok
            or self._executor is None
            or not self._lock.acquire(blocking=False)
        ):
            return _NOT_RUN  # type: ignore[no-any-return]
        try:
            if self._conn is not conn:
                return _NOT_RUN  # type: ignore[no-any-return]
            try:
                if not self._begin_without_waiting(conn):
                    return _NOT_RUN  # type: ignore[no-any-return]
                return work(conn, *args)
            finally:
                if conn.in_transaction:  # failed after BEGIN: leave nothing open
                    conn.rollback()
        except (sqlite3.Error, OSError) as exc:
            raise self._wrap_error(exc) from exc
        finally:
            self._lock.release()

    def _begin_without_waiting(self, conn: sqlite3.Connection) -> bool:
        """``BEGIN IMMEDIATE`` if the write lock is free now; False if it is taken.

        The connection stays without a busy timeout afterwards, so back-to-back commits
        on the loop thread set it once; the worker sets it again before its own work.
        """
        if self._waits:
            self._waits = False
            conn.execute(_SET_NO_WAIT)
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                return False
            raise
        return True

    def _count_write(self, size: int) -> None:
        if self._wal_opener is None or self._executor is None:  # closed meanwhile
            return
        self._wal_bytes += _WAL_BYTES_PER_WRITE + 2 * size
        if self._wal_bytes >= _WAL_BYTES_PER_CHECKPOINT:
            now = time.monotonic()
            if now < self._next_wal_checkpoint:
                return
            self._wal_bytes = 0
            self._next_wal_checkpoint = now + _WAL_CHECKPOINT_INTERVAL
            self._wal_worker().submit(self._checkpoint_wal)

    def _checkpoint_wal(self) -> None:
        """Copy the WAL back into the database, beside the writers (on its own thread)."""
        try:
            with self._wal_lock:
                if self._wal_conn is None and self._wal_opener is not None:
                    self._wal_conn = self._wal_opener()
                if self._wal_conn is not None:
                    self._wal_conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # the next one retries; writers are not affected
            log.warning("WAL checkpoint of the SQLite store failed: %s", exc)


__all__ = ["SQLiteConnection", "use_wal"]
