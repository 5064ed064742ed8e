"""The Redis store's client and how its commands go out: one owner of the connections.

A ``redis://`` URL becomes a client on a blocking pool of its own; a given client is
used as it is (and left open). Every call goes through :meth:`RedisConnection.call`,
which maps redis-py's errors to nestegg's and retries an idempotent one after a
connection failure. A script goes out as one packed EVALSHA on a pool connection kept
between scripts (:meth:`RedisConnection.evalsha`), so that a step's commit skips the pool
and redis-py's per-command work; many scripts go out packed on one pool connection, in
one round trip (:meth:`RedisConnection.scripts_many`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
import redis.asyncio as aioredis
import redis.exceptions as redis_errors
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from nestegg.checkpoint.stores.redis.errors import driver_errors
from nestegg.checkpoint.stores.redis.layout import command_bytes
from nestegg.checkpoint.stores.retry import retry_unavailable
from nestegg.errors import ConfigurationError
from nestegg.urls import (
    host_problem,
    query_problem,
    redis_database_problem,
    redis_option_problem,
    value_problem,
    without_password,
)

T = TypeVar("T")
Keys = Sequence[str | bytes]


class RedisConnection:
    """The client of a :class:`~nestegg.checkpoint.stores.redis.RedisCheckpointStorage`,
    the pool connection it keeps between scripts, and its retries.

    Raises:
        ConfigurationError: neither a URL nor a client, or a client that decodes
            responses.
    """

    def __init__(
        self, url_or_client: Any, *, max_connections: int, connect_timeout: float, retries: int
    ) -> None:
        self._retries = retries
        self._connect_timeout = connect_timeout
        self.where: str | None = None
        """The server in error messages: its URL without the password (None: a client's)."""
        if isinstance(url_or_client, str):
            _check_database(url_or_client)
            self.where = without_password(url_or_client)
            pool = _pool_of(
                url_or_client,
                max_connections=max_connections,
                timeout=connect_timeout,
                retry=Retry(NoBackoff(), 0),
                socket_connect_timeout=connect_timeout,
                socket_timeout=connect_timeout,
            )
            self.client: Any = aioredis.Redis.from_pool(pool)
            self._owns_client = True
        elif callable(getattr(url_or_client, "register_script", None)):
            self.client = url_or_client
            self._owns_client = False
        else:
            raise ConfigurationError(
                "RedisCheckpointStorage needs a redis:// URL or a redis.asyncio.Redis client, "
                f"got {type(url_or_client).__name__}"
            )
        client_pool = getattr(self.client, "connection_pool", None)
        if client_pool is not None and client_pool.connection_kwargs.get("decode_responses"):
            raise ConfigurationError(
                "RedisCheckpointStorage needs a client with decode_responses=False"
            )
        # No connection is kept between scripts for a pool of one or a client without one.
        holds = client_pool is not None and getattr(client_pool, "max_connections", 2) > 1
        self._pool: Any = client_pool if holds else None
        self._held: Any = None
        self._held_timeout: float | None = None
        self._held_busy = False

    async def close(self) -> None:
        """Give back the kept connection; close the client only if built from a URL."""
        await self._release_held()
        if self._owns_client:
            await self.client.aclose()

    async def call(self, operation: Callable[[], Awaitable[T]], *, idempotent: bool) -> T:
        """``operation`` with redis-py's errors as nestegg's, retried if ``idempotent``."""

        async def attempt() -> T:
            with driver_errors(self.where):
                return await operation()

        if not idempotent:
            return await attempt()
        return await retry_unavailable(attempt, self._retries, deadline=self._connect_timeout)

    async def script(self, script: Any, keys: Keys, args: Sequence[Any]) -> Any:
        """Run an idempotent registered script, with retries."""
        return await self.call(partial(self.evalsha, script, keys, args), idempotent=True)

    async def evalsha(self, script: Any, keys: Keys, args: Sequence[Any]) -> Any:
        """One EVALSHA of an idempotent script, packed here and sent on the kept
        connection when it is free, else on another pool connection."""
        # A bypass of redis-py's Script call. The benchmark that needs it:
        # bench/server_store_commit.py (its Redis part: 1 run x 1000 sequential commits),
        # the per-step commit under the target of bench/server_stores.py in
        # docs/benchmarks.md: nestegg Redis at most 2.7 Redis SETs a step (1.63 with it).
        # Median commit there, with the bypass vs through `script(keys, args)`, side by
        # side: 296/409/377 us vs 541/1983/1048 us (three runs), and again 358/400/752 us
        # vs 516/2087/1469 us (three alternating pairs, load average ~10 on 2 cores): the
        # Script call made the median commit 1.4x to 5.2x slower, too close to the target
        # to drop the bypass until a quiet run of that benchmark shows it within it.
        if self._pool is None:
            return await script(keys, args)
        command = command_bytes(["EVALSHA", script.sha, len(keys), *keys, *args])
        if self._held_busy:
            # Packed on another pool connection, bounded by asyncio.timeout: redis-py's own
            # send goes through asyncio.wait_for, which can lose a cancellation on Python
            # 3.11 (see nestegg/cancellation.py), and costs more CPU.
            (reply,) = await self._pipeline(command, 1)
            if isinstance(reply, redis_errors.NoScriptError):  # flushed: the client loads it
                return await script(keys, args)
            if isinstance(reply, redis_errors.ResponseError):
                raise reply
            return reply
        self._held_busy = True
        try:
            reused = self._held is not None
            try:
                return await self._send_held(command)
            except redis_errors.ConnectionError:
                if not reused:
                    raise
            # The kept connection had gone (a restart, an idle timeout): once more on a new one.
            return await self._send_held(command)
        except redis_errors.NoScriptError:  # flushed from Redis: the client loads it
            return await script(keys, args)
        finally:
            self._held_busy = False

    async def _send_held(self, command: bytes) -> Any:
        if self._held is None:
            conn = await _take_connection(self._pool)
            # One asyncio.timeout bounds each exchange below: redis-py's own socket
            # timeout would wrap every send in a task of its own (asyncio.wait_for).
            self._held, self._held_timeout = conn, conn.socket_timeout
            conn.socket_timeout = None
        conn = self._held
        try:
            async with asyncio.timeout(self._held_timeout):
                await conn.send_packed_command(command, check_health=False)
                return await conn.read_response()
        except redis_errors.ResponseError:  # an error reply: the connection is fine
            raise
        except TimeoutError as exc:
            await self._release_held(disconnect=True)
            raise redis_errors.TimeoutError(f"no reply in {self._held_timeout} s") from exc
        except BaseException:
            await self._release_held(disconnect=True)
            raise

    async def _release_held(self, *, disconnect: bool = False) -> None:
        conn, self._held = self._held, None
        if conn is not None:
            conn.socket_timeout = self._held_timeout
            if disconnect:
                await conn.disconnect()
            await self._pool.release(conn)

    async def scripts_many(
        self, script: Any, calls: Sequence[tuple[Keys, Sequence[Any]]], *, idempotent: bool
    ) -> list[Any]:
        """``script`` run once per (keys, args), in one pipeline: one round trip; each
        reply, or its error in its place."""
        if getattr(self.client, "connection_pool", None) is None:  # no pool to take one from
            return [
                await _reply_of(self.call(partial(script, k, a), idempotent=idempotent))
                for k, a in calls
            ]
        packed = b"".join(
            command_bytes(["EVALSHA", script.sha, len(keys), *keys, *args]) for keys, args in calls
        )
        send = partial(self._pipeline, packed, len(calls))
        replies = await self.call(send, idempotent=idempotent)
        if any(isinstance(r, redis_errors.NoScriptError) for r in replies):
            # Flushed from Redis: nothing ran (the first call's error stops none of the
            # others, but each found no script); load it and send them again.
            await self.client.script_load(script.script)
            replies = await self.call(send, idempotent=idempotent)
        return replies

    async def _pipeline(self, packed: bytes, count: int) -> list[Any]:
        """Send packed commands on a pool connection, and read their ``count`` replies (an
        error reply comes back as its exception, in its place)."""
        # A bypass of redis-py's Pipeline (`pipeline(transaction=False)`, `evalsha` per
        # call, `execute(raise_on_error=False)`). The benchmark that needs it:
        # bench/concurrent_runs.py, Redis, 1,000 runs x 20 steps (issue 19's target of
        # 10,000 steps/s, not met yet). Side by side, two alternating pairs at load ~3 on
        # 2 cores: 1,936 and 3,839 steps/s with the bypass, 1,665 and 3,012 through the
        # Pipeline (14% and 22% fewer).
        conn = await _take_connection(self.client.connection_pool)
        # One asyncio.timeout bounds the whole exchange: the connection's own socket timeout
        # would start a timer for every reply.
        timeout, conn.socket_timeout = conn.socket_timeout, None
        try:
            async with asyncio.timeout(self._connect_timeout):
                await conn.send_packed_command(packed, check_health=False)
                replies = []
                for _ in range(count):
                    try:
                        replies.append(await conn.read_response())
                    except redis_errors.ResponseError as error:
                        replies.append(error)
        except TimeoutError as exc:
            await conn.disconnect()
            raise redis_errors.TimeoutError(f"no reply in {self._connect_timeout} s") from exc
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            conn.socket_timeout = timeout
            await self.client.connection_pool.release(conn)
        return replies


def _check_database(url: str) -> None:
    """Raises ConfigurationError for a store URL whose host or port cannot be read, whose
    database is not a number or is given twice (``/0?db=3``), or whose wait or pool size
    redis-py would take and never use as meant (``?socket_timeout=0``)."""
    problem = host_problem(url) or redis_database_problem(url) or redis_option_problem(url)
    if problem is not None:
        raise ConfigurationError(f"Redis store URL {without_password(url)!r}: {problem}")


def _pool_of(url: str, **options: Any) -> Any:
    """The pool of ``url`` (with the store's ``options``), its query checked: an option
    redis-py does not take, or a value it does not (``?ssl_cert_reqs=bogus``,
    ``?protocol=5``), is a ConfigurationError naming it, where redis-py would refuse the value
    only at the first command (or raise a bare ``ValueError`` here). Builds one connection
    to check the values with; it connects nowhere."""

    def build(checked: str) -> Any:
        pool = aioredis.BlockingConnectionPool.from_url(checked, **options)
        pool.connection_class(**pool.connection_kwargs)
        return pool

    try:
        parsed = aioredis.BlockingConnectionPool.from_url(url, **options)
    except ValueError:  # a value its URL parser cannot convert: told below
        parsed = None
    if parsed is not None:
        _check_query(url, parsed)
    problem = value_problem(url, build, REDIS_VALUE_REFUSALS, "redis-py")
    if problem is not None:
        raise ConfigurationError(f"Redis store URL {without_password(url)!r}: {problem}")
    return aioredis.BlockingConnectionPool.from_url(url, **options)


REDIS_VALUE_REFUSALS = (ValueError, redis_errors.RedisError)
"""What redis-py raises for a URL option's value it does not take (building a pool or a
connection, which connects nowhere)."""


def _check_query(url: str, pool: Any) -> None:
    """Raises ConfigurationError for a store URL whose query holds an option redis-py's
    pool and connection do not take (redis-py would raise ``TypeError`` at the first
    command)."""
    problem = query_problem(url, type(pool), pool.connection_class)
    if problem is not None:
        raise ConfigurationError(
            f"Redis store URL {without_password(url)!r}: {problem} (redis-py takes its "
            "connection options there, such as ?socket_timeout=5)"
        )


async def _reply_of(call: Awaitable[Any]) -> Any:
    try:
        return await call
    except Exception as error:
        return error


async def _take_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py before 5.3 wants a command name
        return await pool.get_connection("EVALSHA")
