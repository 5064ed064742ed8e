"""The PostgreSQL store's connections: building its pool, and holding each query to the
store's deadline.

:func:`open_pool` first connects once outside the pool (:func:`probe`), so that a server
that cannot be reached is named with psycopg's own cause, then opens a
``psycopg_pool.AsyncConnectionPool``. :func:`on_cursor` runs an operation on a cursor of
a pooled connection, cut off (:func:`answer_by`) when the server has not answered by the
deadline. :func:`close_with_loop` closes the pool when the store is closed or its event
loop ends, :func:`closed_at_shutdown` one opened while ``asyncio.run`` ends its loop, and
:func:`close_at_exit` that of a store nobody closed on a loop nobody ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

from nestegg.cancellation import cancel_and_wait
from nestegg.checkpoint.stores.postgres.errors import (
    driver_errors,
    is_final,
    nestegg_error,
    one_line,
)
from nestegg.checkpoint.stores.retry import backoff_delay
from nestegg.client_logs import quiet_unless_configured
from nestegg.errors import ConfigurationError, StorageUnavailableError
from nestegg.urls import host_problem, without_password

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.postgres.store import PostgresCheckpointStorage

T = TypeVar("T")
Connection = Any  # psycopg.AsyncConnection[Any]
Cursor = Any  # psycopg.AsyncCursor[Any]


@contextmanager
def answer_by(conn: Connection, deadline: float) -> Iterator[None]:
    """Cut ``conn`` off (shut its socket down, so that the query waiting on it fails at once
    with psycopg's OperationalError) if the server has not answered by ``deadline``
    (``time.monotonic()``); a stopped or unreachable server would keep it waiting forever."""

    def cut() -> None:
        try:
            with socket.socket(fileno=socket.dup(conn.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, psycopg.Error):  # already closed: the query has failed already
            pass

    loop = asyncio.get_running_loop()
    handle = loop.call_later(max(0.0, deadline - time.monotonic()), cut)
    try:
        yield
    finally:
        handle.cancel()


async def close_with_loop(store_ref: weakref.ref[PostgresCheckpointStorage], pool: Any) -> None:
    """Wait until cancelled, then take ``pool`` from its store and close it: run as a task
    beside the pool's own, cancelled by the store's ``close()`` and by the end of the loop.
    ``asyncio.run`` cancels every task left, the pool's with them, and a worker of the
    pool cancelled while it connects takes that for a failed attempt (psycopg_pool logs
    ``error connecting in ...``, no reason given) and waits for its next task, where
    ``asyncio.run`` would wait for it forever; closing the pool hands it the task that
    ends it. The store opens another pool if it is used again (on another loop)."""
    try:
        await asyncio.get_running_loop().create_future()
    finally:
        store = store_ref()
        if store is not None:
            store._let_go(pool)
        await pool.close()


async def closed_at_shutdown(closer: asyncio.Task[None]) -> AsyncGenerator[None, None]:
    """Started once its pool opens, closes that pool (cancels ``closer``) when the loop
    finalizes it. ``asyncio.run`` finalizes the async generators of its loop after it has
    cancelled every task and they have ended: a pool opened while they ended (a run
    cancelled as the loop ends stores its end, after the store was closed or the closer
    of its pool ran) has a closer nobody cancels, and would be left to the loop's close,
    its tasks destroyed pending. A closer already cancelled (the store's ``close()``, whose
    ``_let_go`` lets go of this generator) is closing its pool: it is waited for, not
    cancelled again, which would cut ``pool.close()`` short (idle connections left open,
    waiting clients never told)."""
    try:
        yield
    finally:
        if closer.cancelling():
            await asyncio.wait([closer])
        else:
            await cancel_and_wait(closer)


def close_at_exit(
    store_ref: weakref.ref[PostgresCheckpointStorage], loop: asyncio.AbstractEventLoop
) -> None:
    """Close the pool of a store nobody closed while its event loop can still run that:
    else the pool's tasks are destroyed pending when the interpreter exits (with
    ``asyncio.run`` the pool is closed already, by :func:`close_with_loop`; with
    ``run_until_complete`` it is not)."""
    store = store_ref()
    if store is None or store._pool is None or loop.is_closed() or loop.is_running():
        return
    with contextlib.suppress(Exception):  # best effort at exit: nothing is left to tell
        loop.run_until_complete(store.close())


def until(deadline: float) -> float:
    """Seconds left before ``deadline`` (a little at least, so that a pool asked at the
    deadline still hands over a connection it has idle)."""
    return max(0.01, deadline - time.monotonic())


def describe(conninfo: str) -> str:
    """The server of ``conninfo`` for error messages: a URL without its password, a
    ``key=value`` string as ``host:port/dbname``."""
    if "://" in conninfo:
        return without_password(conninfo)
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "the configured server"
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def check_conninfo(conninfo: object) -> int | None:
    """The ``connect_timeout`` a URL (or ``key=value`` string) gives in seconds, if it
    gives one from 1 (libpq's 0, wait for ever, is not a store's timeout).

    Raises:
        ConfigurationError: a URL libpq cannot read, as one with an option it does not know
            (``?sslmod=require``) or a bad host or port, naming it and libpq's reason
            (psycopg would raise ``ProgrammingError`` at the first connection); a
            ``connect_timeout`` that is not a whole number of seconds from 0; a value that
            is not a string.
    """
    if not isinstance(conninfo, str):
        raise ConfigurationError(
            f"PostgresCheckpointStorage needs a postgresql:// URL (a str) or a pool, got "
            f"{conninfo!r}"
        )
    if "://" in conninfo and (problem := host_problem(conninfo)) is not None:
        raise ConfigurationError(f"PostgreSQL store URL {without_password(conninfo)!r}: {problem}")
    try:
        options = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as error:
        raise ConfigurationError(
            f"PostgreSQL store URL {describe(conninfo)!r}: {one_line(error)} (libpq takes its "
            "connection options there, such as ?sslmode=require; the store's table prefix: "
            "table_prefix=)"
        ) from None
    timeout = str(options.get("connect_timeout", 0))
    if not (timeout.isascii() and timeout.isdigit()):
        raise ConfigurationError(
            f"PostgreSQL store URL {describe(conninfo)!r}: the option connect_timeout takes "
            f"a whole number of seconds from 0, got {timeout!r}"
        )
    return int(timeout) or None


async def probe(url: str, where: str, connect_timeout: float) -> None:
    """Connect once, outside the pool, retrying until ``connect_timeout`` while the
    server cannot be reached: a pool that fails only says that it timed out, where
    psycopg's own error names the cause (refused, no such database, authentication)."""
    deadline = time.monotonic() + connect_timeout
    attempt = 0
    while True:
        remaining = deadline - time.monotonic()
        try:
            async with asyncio.timeout(remaining):
                conn = await psycopg.AsyncConnection.connect(
                    url, connect_timeout=max(1, math.ceil(remaining))
                )
            await conn.close()
            return
        except TimeoutError:
            raise StorageUnavailableError(
                f"PostgreSQL at {where} is unavailable: no answer within {connect_timeout:g} s"
            ) from None
        except psycopg.OperationalError as exc:
            delay = backoff_delay(attempt)
            if is_final(exc) or time.monotonic() + delay >= deadline:
                raise nestegg_error(exc, where, connecting=True) from exc
        await asyncio.sleep(delay)
        attempt += 1


async def open_pool(
    url: str,
    where: str,
    connect_timeout: float,
    *,
    name: str,
    min_size: int,
    max_size: int,
    options: dict[str, Any],
    read_only: bool = False,
) -> Any:
    """An open pool of connections to ``url`` (each made with ``options``, and made
    read-only if ``read_only``), after :func:`probe` found the server."""
    await probe(url, where, connect_timeout)
    quiet_unless_configured("psycopg.pool")
    pool = psycopg_pool.AsyncConnectionPool(
        url,
        open=False,
        timeout=connect_timeout,
        name=name,
        min_size=min_size,
        max_size=max_size,
        kwargs=options,
        configure=_read_only_session if read_only else None,
    )
    try:
        with driver_errors(where):
            await pool.open(wait=True, timeout=connect_timeout)
    except BaseException:
        await pool.close()
        raise
    return pool


async def _read_only_session(conn: Connection) -> None:
    """Make every transaction of ``conn`` read-only: a write fails on the server."""
    await conn.execute("SET default_transaction_read_only = on")


async def on_cursor(pool: Any, operation: Callable[[Cursor], Awaitable[T]], deadline: float) -> T:
    """Run ``operation`` on a cursor of a connection from ``pool``, waiting for the
    connection and for the server's answer until ``deadline`` at most."""
    async with pool.connection(timeout=until(deadline)) as conn:
        with answer_by(conn, deadline):
            return await operation(conn.cursor())
