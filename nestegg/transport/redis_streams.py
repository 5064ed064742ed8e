"""Step messages on Redis Streams: a stream per channel, one consumer group for all workers.

A message is delivered to one consumer of the group (XREADGROUP) and stays in that
consumer's pending list until acked (XACK, then XDEL: a pointer is not kept once done).
A live consumer keeps a message it works on fresh (XCLAIM ... JUSTID on itself resets its
idle time); a message idle for longer than ``hold`` seconds belongs to a consumer that is
gone, and the next consumer that looks takes it over (XAUTOCLAIM), marked redelivered.

A refusal that retrying will not mend (a login refused, a database that does not exist,
a command the ACL user may not run) is a BrokerRefusedError naming the broker's URL
without its password; any other failure is a TransportError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    AuthorizationError,
    NoPermissionError,
    RedisError,
    ResponseError,
)

from nestegg.cancellation import raise_if_cancel_requested
from nestegg.constants import REDIS_TRANSPORT_CONNECTIONS
from nestegg.errors import BrokerRefusedError, TransportError
from nestegg.transport.base import Delivery, StepMessage, bad_url, check_url
from nestegg.urls import (
    query_problem,
    redis_database_problem,
    redis_option_problem,
    value_problem,
    without_password,
)

log = logging.getLogger("nestegg")

GROUP = "nestegg"
FIELD = "m"
REDELIVERED_FIELD = "r"
"""Set on a message given back (requeued): it counts as redelivered."""
READ_BLOCK_MS = 500
"""How long one XREADGROUP waits for a message before the consumer looks for stale ones."""


@contextlib.contextmanager
def broker_errors(where: str, what: str) -> Iterator[None]:
    """Redis failures as TransportError naming what was being done; refusals (see
    :func:`refusal`) as BrokerRefusedError naming the broker ``where``."""
    try:
        yield
    except RedisError as error:
        refused = refusal(where, what, error)
        if refused is not None:
            raise refused from error
        raise TransportError(f"Redis Streams: {what} failed: {error}") from error


def refusal(where: str, what: str, error: RedisError) -> BrokerRefusedError | None:
    """The BrokerRefusedError of a failure that says the Redis at ``where`` refuses this
    client's settings (retrying will not mend it), else None."""
    if isinstance(error, AuthenticationError | AuthenticationWrongNumberOfArgsError):
        return BrokerRefusedError(f"Redis at {where} refused the login: {error}")
    if isinstance(error, ResponseError) and "DB index" in str(error):
        # SELECT of a database the server does not have ("DB index is out of range")
        return BrokerRefusedError(f"Redis at {where} has no such database: {error}")
    if isinstance(error, AuthorizationError | NoPermissionError):
        return BrokerRefusedError(f"Redis at {where} refused {what}: {error}")
    return None


class RedisDelivery:
    """A message delivered from a stream to this transport's consumer."""

    __slots__ = ("channel", "entry_id", "message", "redelivered", "transport")

    def __init__(
        self,
        transport: RedisStreamsTransport,
        channel: str,
        entry_id: str,
        message: StepMessage,
        redelivered: bool,
    ) -> None:
        self.transport = transport
        self.channel = channel
        self.entry_id = entry_id
        self.message = message
        self.redelivered = redelivered

    async def ack(self) -> None:
        """XACK and XDEL the entry."""
        key = self.transport.key(self.channel)
        with broker_errors(self.transport.where, f"ack of {self.entry_id} on {self.channel}"):
            async with self.transport.client.pipeline(transaction=True) as pipe:
                pipe.xack(key, GROUP, self.entry_id)
                pipe.xdel(key, self.entry_id)
                await pipe.execute()

    async def keep_alive(self) -> None:
        """Reset the entry's idle time (XCLAIM to this consumer, JUSTID)."""
        with broker_errors(
            self.transport.where, f"keep-alive of {self.entry_id} on {self.channel}"
        ):
            await self.transport.client.xclaim(
                self.transport.key(self.channel),
                GROUP,
                self.transport.consumer,
                0,
                [self.entry_id],
                justid=True,
            )

    async def requeue(self) -> None:
        """Add the message again at the stream's end, marked redelivered, and drop this
        entry, atomically."""
        key = self.transport.key(self.channel)
        fields = {FIELD: self.message.encode(), REDELIVERED_FIELD: b"1"}
        with broker_errors(self.transport.where, f"requeue of {self.entry_id} on {self.channel}"):
            async with self.transport.client.pipeline(transaction=True) as pipe:
                pipe.xadd(key, fields)
                pipe.xack(key, GROUP, self.entry_id)
                pipe.xdel(key, self.entry_id)
                await pipe.execute()

    async def forward(self, channel: str, message: StepMessage) -> RedisDelivery | None:
        """XADD ``message`` to ``channel``'s stream, XACK and XDEL this entry: one
        transaction, one round trip.

        While this transport consumes ``channel``, the same transaction reads the
        channel's next message for it (the oldest not yet delivered: often the one just
        added) and returns it, for the caller to handle in the slot this one frees.
        """
        transport = self.transport
        await transport._ensure_group(channel)
        key = transport.key(self.channel)
        fields = {FIELD: message.encode()}
        read_ahead = channel in transport._consuming
        with broker_errors(
            self.transport.where, f"forwarding {self.entry_id} of {self.channel} to {channel}"
        ):
            async with transport.client.pipeline(transaction=True) as pipe:
                pipe.xadd(transport.key(channel), fields)
                pipe.xack(key, GROUP, self.entry_id)
                pipe.xdel(key, self.entry_id)
                if read_ahead:
                    pipe.xreadgroup(GROUP, transport.consumer, {transport.key(channel): ">"}, 1)
                replies = await pipe.execute()
        if not read_ahead:
            return None
        for _, entries in replies[-1] or []:
            for entry_id, read in entries:
                return await transport._delivery(channel, entry_id, read, False)
        return None


class RedisStreamsTransport:
    """The Redis Streams transport (redis-py's asyncio client, Redis 6.2+).

    Args:
        url: ``redis://host:port/db`` or ``rediss://...``.
        prefix: put before every stream key (to share a database between deployments).
        client: an open ``redis.asyncio.Redis`` to use instead of one built from ``url``.

    Raises:
        ConfigurationError: a URL that cannot be used (names it and what is wrong).

    Example:
        >>> clutch = Clutch("triage", transport=RedisStreamsTransport("redis://localhost"),
        ...                 checkpoint=CheckpointConfig(storage=store))
    """

    def __init__(
        self, url: str = "redis://localhost:6379/0", *, prefix: str = "", client: Any = None
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.client: Any = client or _client(url)
        self.owns_client = client is None
        self.where = without_password(url) if client is None else _address(client)
        """The broker, as messages name it."""
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self._groups: set[str] = set()
        self._consuming: set[str] = set()

    def key(self, channel: str) -> str:
        """The stream key of a channel."""
        return self.prefix + channel

    async def _ensure_group(self, channel: str) -> None:
        if channel in self._groups:
            return
        with broker_errors(self.where, f"creating the consumer group of {channel}"):
            try:
                await self.client.xgroup_create(self.key(channel), GROUP, id="0", mkstream=True)
            except ResponseError as error:
                if "BUSYGROUP" not in str(error):
                    raise
        self._groups.add(channel)

    async def set_up(self, channels: Sequence[str]) -> None:
        """Create the channels' streams and consumer group (what :meth:`consume` does
        first).

        Raises:
            BrokerRefusedError: the login or the database was refused, or the ACL user may
                not create them.
            TransportError: the broker cannot be reached now.
        """
        for channel in channels:
            await self._ensure_group(channel)

    async def publish(self, channel: str, message: StepMessage) -> None:
        """XADD the message to the channel's stream."""
        await self._ensure_group(channel)
        with broker_errors(self.where, f"publish to {channel}"):
            await self.client.xadd(self.key(channel), {FIELD: message.encode()})

    async def waiting(self, channels: Sequence[str], *, hold: float) -> bool:
        """Whether a message of ``channels`` waits, in one round trip: a stream holds an
        entry added after the last one delivered to the group (acked entries are deleted,
        undelivered ones never are), or an entry pending for ``hold`` seconds (its
        consumer is gone: the next XAUTOCLAIM takes it)."""
        with broker_errors(self.where, f"looking for waiting messages of {', '.join(channels)}"):
            async with self.client.pipeline(transaction=False) as pipe:
                for channel in channels:
                    key = self.key(channel)
                    pipe.xinfo_stream(key)
                    pipe.xinfo_groups(key)
                    pipe.xpending_range(key, GROUP, "-", "+", 1, idle=int(hold * 1000))
                replies = await pipe.execute(raise_on_error=False)
        for at in range(0, len(replies), 3):
            stream, groups, idle = replies[at : at + 3]
            if any(isinstance(reply, Exception) for reply in (stream, groups, idle)):
                return True  # a stream or group gone meanwhile: do not hold on to a run
            delivered = next(
                (g["last-delivered-id"] for g in groups if _text(g["name"]) == GROUP), b"0-0"
            )
            if _entry_id(stream["last-generated-id"]) > _entry_id(delivered) or idle:
                return True
        return False

    async def consume(
        self, channels: Sequence[str], *, hold: float, prefetch: int = 1
    ) -> AsyncIterator[Delivery]:
        """New messages of ``channels`` (XREADGROUP, one per stream per read: a message is
        read when it is asked for, whatever ``prefetch``) and, every ``hold / 4`` seconds
        at most, messages idle for ``hold`` seconds or more (XAUTOCLAIM), as redelivered."""
        for channel in channels:
            await self._ensure_group(channel)
        self._consuming.update(channels)
        try:
            async for delivery in self._deliveries(channels, hold):
                yield delivery
        finally:
            self._consuming.difference_update(channels)

    async def _deliveries(self, channels: Sequence[str], hold: float) -> AsyncIterator[Delivery]:
        streams = {self.key(channel): ">" for channel in channels}
        by_key = {self.key(channel): channel for channel in channels}
        reclaim_every = max(0.05, min(hold / 4, 1.0))
        next_reclaim = 0.0
        while True:
            raise_if_cancel_requested()  # stopped, also if a library lost the cancellation
            if time.monotonic() >= next_reclaim:
                next_reclaim = time.monotonic() + reclaim_every
                for channel in channels:
                    for delivery in await self._reclaim(channel, hold):
                        yield delivery
            block = max(1, min(READ_BLOCK_MS, int((next_reclaim - time.monotonic()) * 1000)))
            with broker_errors(self.where, f"reading {', '.join(channels)}"):
                replies = await self.client.xreadgroup(
                    GROUP, self.consumer, streams, count=1, block=block
                )
            for key, entries in replies or []:
                channel = by_key[_text(key)]
                for entry_id, fields in entries:
                    fresh = await self._delivery(channel, entry_id, fields, False)
                    if fresh is not None:
                        yield fresh

    async def _reclaim(self, channel: str, hold: float) -> list[RedisDelivery]:
        with broker_errors(self.where, f"reclaiming idle messages of {channel}"):
            reply = await self.client.xautoclaim(
                self.key(channel), GROUP, self.consumer, int(hold * 1000), "0-0", count=16
            )
        found = []
        for entry_id, fields in reply[1]:
            if fields is None:  # deleted meanwhile
                continue
            delivery = await self._delivery(channel, entry_id, fields, True)
            if delivery is not None:
                found.append(delivery)
        return found

    async def _delivery(
        self, channel: str, entry_id: Any, fields: dict[Any, Any], redelivered: bool
    ) -> RedisDelivery | None:
        raw = fields.get(FIELD.encode(), fields.get(FIELD))
        entry = _text(entry_id)
        try:
            message = StepMessage.decode(raw if raw is not None else b"")
        except TransportError as error:
            log.warning("dropping entry %s of %s: %s", entry, channel, error)
            dropped = RedisDelivery(self, channel, entry, StepMessage("", 0, 0), redelivered)
            await dropped.ack()
            return None
        requeued = REDELIVERED_FIELD.encode() in fields or REDELIVERED_FIELD in fields
        return RedisDelivery(self, channel, entry, message, redelivered or requeued)

    async def delete_channels(self, channels: Sequence[str]) -> None:
        """Delete the channels' streams with their groups (tests, teardown)."""
        with broker_errors(self.where, "deleting streams"):
            if channels:
                await self.client.delete(*(self.key(channel) for channel in channels))
        self._groups.difference_update(channels)

    async def close(self) -> None:
        """Close the client if this transport built it."""
        if self.owns_client:
            with contextlib.suppress(RedisError, asyncio.CancelledError):
                await self.client.aclose()


def _client(url: str) -> Any:
    """redis-py's client for ``url`` (it connects when first used), on a blocking pool: a
    publish while every connection is in use (more runs submitted at once than the pool
    holds, ``max_connections``: REDIS_TRANSPORT_CONNECTIONS unless the URL's
    ``?max_connections=`` says) waits for one, as the Redis store's pool does, where
    redis-py's plain pool raised MaxConnectionsError at once.

    Raises:
        ConfigurationError: a URL redis-py cannot use (its reason: a bad host, port,
            scheme or database number, or a database given twice).
    """
    check_url(url, ("redis", "rediss", "unix"))
    problem = None if url.startswith("unix:") else redis_database_problem(url)
    problem = problem or redis_option_problem(url)
    if problem is not None:
        raise bad_url(url, problem)
    try:
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=REDIS_TRANSPORT_CONNECTIONS
        )
    except ValueError as error:
        raise bad_url(url, error) from None
    client = aioredis.Redis.from_pool(pool)
    problem = query_problem(url, type(pool), pool.connection_class)
    if problem is not None:
        raise bad_url(url, f"{problem} (redis-py takes its connection options there)")
    problem = value_problem(url, _connection_of, (ValueError, RedisError), "redis-py")
    if problem is not None:
        raise bad_url(url, problem)
    return client


def _connection_of(url: str) -> Any:
    """A connection of ``url`` as redis-py builds it (connecting nowhere)."""
    pool = aioredis.Redis.from_url(url).connection_pool
    return pool.connection_class(**pool.connection_kwargs)


def _address(client: Any) -> str:
    """The server of a given redis-py client as a URL without a password."""
    options = client.connection_pool.connection_kwargs
    if "path" in options:
        return f"unix://{options['path']}"
    host, port, db = (
        options.get("host", "localhost"),
        options.get("port", 6379),
        options.get("db", 0),
    )
    return f"redis://{host}:{port}/{db}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry_id(value: Any) -> tuple[int, int]:
    """A stream entry id (``ms-seq``) in the order Redis gives entries."""
    ms, _, seq = _text(value).partition("-")
    return int(ms), int(seq or 0)
