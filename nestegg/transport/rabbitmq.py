"""Step messages on RabbitMQ (aio-pika): a durable queue per channel.

A message is delivered to one consumer and stays unacked with it until acked; when the
consumer's connection drops (its process died, or the network failed long enough for the
heartbeat to notice), RabbitMQ requeues it and delivers it again, marked redelivered.
Messages are persistent and published with confirms. A live consumer needs no keep-alive
(RabbitMQ's ``consumer_timeout``, 30 minutes by default, bounds a step's length).

aio-pika's connection runs tasks of its own (reader, heartbeats, reconnection): the
connection is kept while it is in use (:meth:`RabbitMQTransport.in_use`: a caller's run, a
worker, a consumer, a Clutch's ``async with``) and closed when the last use ends, so that
none of its tasks is left pending when the event loop that ran them closes.

Opening a connection may take CONNECT_TIMEOUT seconds: a port that takes the connection and
never answers the AMQP handshake (another server's) is as unreachable as a refused one.

A refusal that retrying will not mend (a login refused, a vhost that does not exist or
that the user may not open, an operation the user has no permission for) is a
BrokerRefusedError naming the broker's URL without its password; any other failure is a
TransportError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from aio_pika.exceptions import (
    AMQPError,
    AuthenticationError,
    InvalidFrameError,
    ProbableAuthenticationError,
)
from aiormq.exceptions import ChannelAccessRefused
from yarl import URL

from nestegg.client_logs import quiet_unless_configured
from nestegg.errors import BrokerRefusedError, ConfigurationError, TransportError
from nestegg.transport.base import Delivery, StepMessage, bad_url, check_url
from nestegg.urls import unknown_options, without_password

MAX_QUEUE_NAME_BYTES = 255
"""The longest queue name RabbitMQ takes (AMQP 0-9-1's short string), in UTF-8 bytes."""

log = logging.getLogger("nestegg")
quiet_unless_configured("aio_pika", "aiormq")

CLOSE_TIMEOUT = 5.0
"""Seconds a consumer's cancellation or the connection's close may take (a broker that does
not answer does not hold a stopping worker)."""
CONNECT_TIMEOUT = 5.0
"""Seconds the opening of a connection (TCP and AMQP handshake, also each reconnection) may
take: a port that accepts and does not speak AMQP (another server's) fails as a refused
port does, a TransportError, instead of holding the caller or worker forever."""


@contextlib.contextmanager
def broker_errors(url: str, what: str) -> Iterator[None]:
    """aio-pika and connection failures as TransportError naming what was being done;
    refusals (see :func:`refusal`) as BrokerRefusedError."""
    try:
        yield
    except (AMQPError, ConnectionError, OSError) as error:
        refused = refusal(url, what, error)
        if refused is not None:
            raise refused from error
        raise TransportError(f"RabbitMQ: {what} failed: {error}") from error


def refusal(url: str, what: str, error: BaseException) -> BrokerRefusedError | None:
    """The BrokerRefusedError of a failure that says the broker refuses the settings of
    ``url`` (retrying will not mend it), else None."""
    parts = urlsplit(url)
    where = f"RabbitMQ at {without_password(url)}"
    user = unquote(parts.username or "guest")  # aio-pika's default user
    if isinstance(error, ProbableAuthenticationError | AuthenticationError):
        return BrokerRefusedError(f"{where} refused to log user {user!r} in: {error}")
    if isinstance(error, InvalidFrameError) and "Connection.Close" in str(error):
        # the broker answered Connection.Open with Connection.Close (aiormq keeps only
        # the frame's name): the vhost does not exist, or the user may not open it
        vhost = unquote(parts.path[1:]) or "/"
        return BrokerRefusedError(
            f"{where} refused to open vhost {vhost!r}: it does not exist, user {user!r} "
            "may not access it, or a connection limit is reached"
        )
    if isinstance(error, ChannelAccessRefused):
        return BrokerRefusedError(f"{where} refused {what} to user {user!r}: {error}")
    tls = _tls_error(error)
    if parts.scheme == "amqps" and tls is not None and tls.reason == "WRONG_VERSION_NUMBER":
        return BrokerRefusedError(
            f"{where} answered no TLS handshake ({tls.reason}): amqps:// needs the broker's "
            "TLS listener (port 5671 by default); a plain AMQP port takes amqp://"
        )
    return None


def _tls_error(error: BaseException) -> ssl.SSLError | None:
    """The TLS error that caused ``error`` (aiormq wraps it), if one did."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, ssl.SSLError):
        seen = seen.__cause__ or seen.__context__
    return seen


class RabbitDelivery:
    """A message delivered from a queue to this transport's consumer."""

    __slots__ = ("channel", "incoming", "message", "redelivered", "transport")

    def __init__(
        self,
        transport: RabbitMQTransport,
        channel: str,
        incoming: AbstractIncomingMessage,
        message: StepMessage,
    ) -> None:
        self.transport = transport
        self.channel = channel
        self.incoming = incoming
        self.message = message
        self.redelivered = bool(incoming.redelivered)

    async def ack(self) -> None:
        """basic.ack."""
        with broker_errors(self.transport.url, f"ack on {self.channel}"):
            await self.incoming.ack()

    async def keep_alive(self) -> None:
        """Nothing to do: an unacked message stays with its live consumer."""

    async def requeue(self) -> None:
        """basic.nack with requeue."""
        with broker_errors(self.transport.url, f"requeue on {self.channel}"):
            await self.incoming.nack(requeue=True)

    async def forward(self, channel: str, message: StepMessage) -> None:
        """Publish ``message`` (confirmed), then ack this one; nothing is read ahead (the
        broker pushes the next message)."""
        await self.transport.publish(channel, message)
        await self.ack()


AMQP_OPTIONS = frozenset(
    {"auth", "cafile", "cadata", "capath", "certfile", "keyfile", "no_verify_ssl", "name"}
    | {"heartbeat", "timeout", "interleave", "happy_eyeballs_delay"}
    | {"reconnect_interval", "fail_fast"}
)
"""The query options of an AMQP URL that aiormq and aio-pika's robust connection read."""


def amqp_query_problem(url: str) -> str | None:
    """What is wrong with an AMQP URL's query (None: nothing): an option the clients do not
    read (a typo they would ignore), or a number they would read as another: aiormq takes
    a ``?heartbeat=`` or ``?timeout=`` it cannot read as 0 (heartbeats off; no time to
    connect), a heartbeat out of range as 0 too."""
    problem = unknown_options(url, AMQP_OPTIONS)
    if problem is not None:
        return problem
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        whole = value.isascii() and value.isdigit()
        if name == "heartbeat" and not (whole and int(value) < 65535):
            return f"?heartbeat= is a whole number of seconds from 0 (off) to 65534, got {value!r}"
        if name == "timeout" and not (whole and int(value) > 0):
            return f"?timeout= is a whole number of seconds from 1, got {value!r}"
        if name == "reconnect_interval" and not _positive(value):
            return f"?reconnect_interval= is a number of seconds above 0, got {value!r}"
    return None


def _positive(text: str) -> bool:
    try:
        return text.isascii() and float(text) > 0  # NaN is not above 0
    except ValueError:
        return False


class RabbitMQTransport:
    """The RabbitMQ transport (``pip install 'nestegg[rabbitmq]'``).

    Args:
        url: ``amqp://user:password@host:5672/vhost`` (or ``amqps://``).
        prefix: put before every queue name.

    Raises:
        ConfigurationError: a URL that cannot be used (names it and what is wrong).

    Example:
        >>> clutch = Clutch("triage", transport=RabbitMQTransport("amqp://guest:guest@localhost/"),
        ...                 checkpoint=CheckpointConfig(storage=store))
    """

    def __init__(self, url: str = "amqp://guest:guest@localhost/", *, prefix: str = "") -> None:
        check_url(url, ("amqp", "amqps"))
        problem = amqp_query_problem(url)
        if problem is not None:
            raise bad_url(url, problem)
        self.url = url
        self.prefix = prefix
        self._connection: AbstractRobustConnection | None = None
        self._publisher: AbstractChannel | None = None
        self._consumers: list[AbstractChannel] = []
        self._arrivals: list[asyncio.Queue[tuple[str, AbstractIncomingMessage]]] = []
        self._declared: set[str] = set()
        self._lock = asyncio.Lock()
        self._uses = 0
        self._opening_since: float | None = None

    @contextlib.asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """Keep the connection open for the duration (it opens when first needed); when
        the last use ends, close it (the next use connects again)."""
        self._uses += 1
        try:
            yield
        finally:
            self._uses -= 1
            if self._uses == 0:
                await self.close()

    def queue(self, channel: str) -> str:
        """The queue name of a channel.

        Raises:
            ConfigurationError: the name is longer than RabbitMQ takes (255 bytes).
        """
        name = self.prefix + channel
        size = len(name.encode())
        if size > MAX_QUEUE_NAME_BYTES:
            raise ConfigurationError(
                f"RabbitMQ queue name {name[:60]!r}... is {size} bytes; RabbitMQ takes at "
                f"most {MAX_QUEUE_NAME_BYTES}: give the pipeline or its agent a shorter "
                "name, or the transport a shorter prefix"
            )
        return name

    async def _connect(self) -> AbstractRobustConnection:
        async with self._lock:
            if self._connection is None or self._connection.is_closed:
                self._connection = await self._open()
            return self._connection

    async def _open(self) -> AbstractRobustConnection:
        """A new robust connection (what ``aio_pika.connect_robust`` does), closed again if
        its first attempt fails, times out or is cancelled: its reconnection task would
        otherwise go on retrying, and hold the event loop's end."""
        connection = aio_pika.RobustConnection(URL(self.url))
        self._opening_since = asyncio.get_running_loop().time()
        try:
            with broker_errors(self.url, f"connecting to {self._where}"):
                try:
                    await connection.connect(timeout=CONNECT_TIMEOUT)
                except TimeoutError:
                    raise self._no_handshake(CONNECT_TIMEOUT) from None
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(asyncio.wait_for(connection.close(), CLOSE_TIMEOUT))
            raise
        finally:
            self._opening_since = None
        return connection

    @property
    def _where(self) -> str:
        return self.url.rpartition("@")[2]

    def _no_handshake(self, seconds: float) -> TransportError:
        return TransportError(
            f"RabbitMQ: connecting to {self._where} failed: no AMQP handshake within "
            f"{round(seconds, 2):g} s (is it a RabbitMQ port?)"
        )

    def unanswered(self) -> TransportError | None:
        """The TransportError of the connection being opened now, whose AMQP handshake has
        not ended yet (None: none is being opened): what a caller whose run's timeout
        ends while its first step waits for the connection gets, as it would after
        CONNECT_TIMEOUT."""
        if self._opening_since is None:
            return None
        return self._no_handshake(asyncio.get_running_loop().time() - self._opening_since)

    async def _publishing_channel(self) -> AbstractChannel:
        if self._publisher is None or self._publisher.is_closed:
            connection = await self._connect()
            with broker_errors(self.url, "opening a channel"):
                self._publisher = await connection.channel(publisher_confirms=True)
        return self._publisher

    async def _declare(self, amqp: AbstractChannel, channel: str) -> Any:
        with broker_errors(self.url, f"declaring queue {self.queue(channel)}"):
            return await amqp.declare_queue(self.queue(channel), durable=True)

    async def publish(self, channel: str, message: StepMessage) -> None:
        """Publish the message persistently to the channel's queue, with a confirm."""
        amqp = await self._publishing_channel()
        if channel not in self._declared:
            await self._declare(amqp, channel)
            self._declared.add(channel)
        body = aio_pika.Message(
            message.encode(),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            content_type="application/json",
        )
        with broker_errors(self.url, f"publish to {channel}"):
            await amqp.default_exchange.publish(body, routing_key=self.queue(channel))

    async def set_up(self, channels: Sequence[str]) -> None:
        """Connect and declare the channels' queues (what :meth:`consume` does first).

        Raises:
            BrokerRefusedError: the login or the vhost was refused, or the queues may not
                be declared by this user.
            TransportError: the broker cannot be reached now.
        """
        amqp = await self._publishing_channel()
        for channel in channels:
            await self._declare(amqp, channel)
            self._declared.add(channel)

    async def consume(
        self, channels: Sequence[str], *, hold: float, prefetch: int = 1
    ) -> AsyncIterator[Delivery]:
        """Messages of ``channels``, at most ``prefetch`` unacked per queue (basic.qos);
        ``hold`` plays no part (a dead consumer's messages come back when its connection
        drops). The connection is in use while this consumes."""
        async with (
            self.in_use(),
            contextlib.aclosing(self._deliveries(channels, prefetch)) as deliveries,
        ):
            async for delivery in deliveries:
                yield delivery

    async def _deliveries(
        self, channels: Sequence[str], prefetch: int
    ) -> AsyncGenerator[Delivery, None]:
        """What :meth:`consume` yields, on a channel of its own."""
        connection = await self._connect()
        with broker_errors(self.url, "opening a consumer channel"):
            amqp = await connection.channel()
            await amqp.set_qos(prefetch_count=prefetch)
        self._consumers.append(amqp)
        arrived: asyncio.Queue[tuple[str, AbstractIncomingMessage]] = asyncio.Queue()
        tags: list[tuple[Any, str]] = []
        self._arrivals.append(arrived)
        try:
            for channel in channels:
                queue = await self._declare(amqp, channel)

                async def on_message(incoming: AbstractIncomingMessage, at: str = channel) -> None:
                    arrived.put_nowait((at, incoming))

                with broker_errors(self.url, f"consuming {channel}"):
                    tags.append((queue, await queue.consume(on_message)))
            while True:
                channel, incoming = await arrived.get()
                try:
                    message = StepMessage.decode(incoming.body)
                except TransportError as error:
                    log.warning("dropping a message of %s: %s", channel, error)
                    await incoming.ack()
                    continue
                yield RabbitDelivery(self, channel, incoming, message)
        finally:
            self._arrivals.remove(arrived)
            await self._stop_consuming(tags, arrived)

    async def waiting(self, channels: Sequence[str], *, hold: float) -> bool:
        """Whether a message of ``channels`` waits: pushed to this consumer and not taken
        yet, or ready in its queue (a gone consumer's messages are ready again); ``hold``
        plays no part."""
        if any(not arrived.empty() for arrived in self._arrivals):
            return True
        amqp = await self._publishing_channel()
        for channel in channels:
            with broker_errors(self.url, f"looking for waiting messages of {channel}"):
                # aio-pika's declare_queue(passive=True) answers a queue this channel
                # declared before from its cache, with the counts of that declaration:
                # ask the broker through the channel underneath
                underlay = await amqp.get_underlay_channel()
                declared = await underlay.queue_declare(self.queue(channel), passive=True)
            if declared.message_count:
                return True
        return False

    async def _stop_consuming(
        self, tags: list[tuple[Any, str]], arrived: asyncio.Queue[tuple[str, Any]]
    ) -> None:
        """Cancel the consumers (deliveries already taken can still be acked) and give
        back what arrived but was not taken."""

        async def stop() -> None:
            for queue, tag in tags:
                await queue.cancel(tag)
            while not arrived.empty():
                _, incoming = arrived.get_nowait()
                await incoming.nack(requeue=True)

        with contextlib.suppress(
            AMQPError, ConnectionError, OSError, asyncio.CancelledError, TimeoutError
        ):
            await asyncio.wait_for(stop(), CLOSE_TIMEOUT)

    async def delete_channels(self, channels: Sequence[str]) -> None:
        """Delete the channels' queues (tests, teardown)."""
        amqp = await self._publishing_channel()
        with broker_errors(self.url, "deleting queues"):
            for channel in channels:
                await amqp.queue_delete(self.queue(channel))
        self._declared.difference_update(channels)

    async def close(self) -> None:
        """Close the connection (unacked messages go back to their queues); the next use
        connects again. A connection being opened meanwhile is waited for and closed too:
        left open, its reconnection task would outlive this close, and could hold the end
        of the event loop (aio-pika's reconnection goes on when a cancel meets it in a
        connection attempt)."""
        async with self._lock:  # an opening under way ends first (its CONNECT_TIMEOUT)
            connection, self._connection, self._publisher = self._connection, None, None
        self._consumers.clear()
        if connection is not None:
            with contextlib.suppress(AMQPError, ConnectionError, OSError, TimeoutError):
                await asyncio.wait_for(connection.close(), CLOSE_TIMEOUT)
