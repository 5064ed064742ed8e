"""The transport seam: step messages on a broker's channels, delivered at least once.

A message is a pointer, never state: the run id, the step it asks for, the run's fencing
token when it was sent, and the agent whose channel it was routed to. The store holds
everything else. A channel is ``nestegg.<pipeline>.<agent>`` for the steps of one agent,
and ``nestegg.<pipeline>`` for messages any worker of the pipeline may take (the first
step of a SELECTOR pipeline, a step to route again, a run the sweeper resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import orjson

from nestegg.errors import ConfigurationError, MissingDependencyError, TransportError
from nestegg.urls import host_problem, without_password

CHANNEL_PREFIX = "nestegg"


def channel_name(pipeline: str, agent: str | None = None) -> str:
    """The channel of ``agent``'s steps, or the pipeline's own channel (``agent=None``):
    ``nestegg.<pipeline>.<agent>``, each name with its ``%`` and ``.`` written ``%25`` and
    ``%2E``, so that no two pipelines' channels are one (pipeline ``a.b``'s own channel
    and pipeline ``a``'s agent ``b``; ``a``'s agent ``b.c`` and ``a.b``'s agent ``c``)."""
    base = f"{CHANNEL_PREFIX}.{_channel_part(pipeline)}"
    return base if agent is None else f"{base}.{_channel_part(agent)}"


def _channel_part(name: str) -> str:
    return name.replace("%", "%25").replace(".", "%2E")


@dataclass(frozen=True, slots=True)
class StepMessage:
    """A pointer to one step of a run.

    Args:
        run_id: the run.
        seq: the step asked for (the run's last committed step + 1 when sent).
        fence: the run's fencing token when the message was sent.
        agent: the agent it was routed to (None: the pipeline's channel).
        trace: the caller's trace context (W3C ``traceparent`` headers), carried from
            step to step so that every step's span joins the caller's trace (empty when the
            caller does not trace; see ``nestegg.transport.tracing``).
    """

    run_id: str
    seq: int
    fence: int
    agent: str | None = None
    trace: dict[str, str] = field(default_factory=dict)

    def encode(self) -> bytes:
        """The message as JSON bytes."""
        body: dict[str, Any] = {"run_id": self.run_id, "seq": self.seq, "fence": self.fence}
        if self.agent is not None:
            body["agent"] = self.agent
        if self.trace:
            body["trace"] = self.trace
        return orjson.dumps(body)

    @classmethod
    def decode(cls, raw: bytes | str) -> StepMessage:
        """A message from :meth:`encode`'s bytes.

        Raises:
            TransportError: the bytes are not a step message.
        """
        try:
            body = orjson.loads(raw)
            agent = body.get("agent")
            trace = body.get("trace") or {}
            return cls(
                run_id=str(body["run_id"]),
                seq=int(body["seq"]),
                fence=int(body["fence"]),
                agent=str(agent) if agent is not None else None,
                trace={str(k): str(v) for k, v in trace.items()},
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as error:
            raise TransportError(f"not a nestegg step message: {raw[:200]!r} ({error})") from None


@runtime_checkable
class Delivery(Protocol):
    """One delivered message, held by this consumer until acked or requeued."""

    message: StepMessage
    channel: str
    redelivered: bool
    """Whether the broker delivered it before (to a consumer that did not ack it)."""

    async def ack(self) -> None:
        """Done with it: the broker forgets it."""

    async def keep_alive(self) -> None:
        """Say that this consumer still works on it (it is not given to another)."""

    async def requeue(self) -> None:
        """Give it back now for any consumer to take; it comes back redelivered."""

    async def forward(self, channel: str, message: StepMessage) -> Delivery | None:
        """Publish ``message`` to ``channel``, then ack this one (in one round trip where
        the broker allows). May return the next message of ``channel`` for this consumer,
        read in the same round trip, to handle in the slot this one frees."""


async def give_back(delivery: Delivery) -> None:
    """Requeue ``delivery`` to the end even if the caller is being cancelled; if the broker
    fails, the delivery is left to its redelivery."""
    with contextlib.suppress(TransportError):
        await asyncio.shield(delivery.requeue())


@runtime_checkable
class Transport(Protocol):
    """Publishes step messages to channels and delivers them to consumers at least once.

    A message stays with its consumer until acked; if the consumer dies it goes to
    another one: after ``hold`` seconds without :meth:`Delivery.keep_alive` (Redis
    Streams), or when its connection drops (RabbitMQ).
    """

    async def publish(self, channel: str, message: StepMessage) -> None:
        """Send ``message`` to ``channel``."""

    def consume(
        self, channels: Sequence[str], *, hold: float, prefetch: int = 1
    ) -> AsyncIterator[Delivery]:
        """Deliveries from ``channels`` as they are asked for; at most about ``prefetch``
        taken from each channel ahead of being asked for."""

    async def close(self) -> None:
        """Release the broker connections."""


@runtime_checkable
class WaitingProbe(Protocol):
    """A transport that can tell whether a message of some channels waits for a consumer
    (a worker whose slots are all taken hands a run it goes on with back to the broker
    only then; with a transport without this capability, whenever its slots are all
    taken)."""

    async def waiting(self, channels: Sequence[str], *, hold: float) -> bool:
        """Whether a message of ``channels`` waits: not delivered yet, or idle for ``hold``
        seconds with a consumer that is gone."""


@runtime_checkable
class ConnectionInUse(Protocol):
    """A transport whose connection runs tasks of its own (RabbitMQ: aio-pika's reader,
    heartbeats and reconnection), which must not outlive the event loop of the code that
    used it (``asyncio.run`` would end with them pending): it keeps its connection open
    while some code holds it in use, and closes it when the last use ends (the next use
    connects again)."""

    def in_use(self) -> AbstractAsyncContextManager[None]:
        """Hold the connection open for the duration of an ``async with``."""


@runtime_checkable
class OpeningProbe(Protocol):
    """A transport whose connection may take a while to open (RabbitMQ: until the AMQP
    handshake ends, at most its CONNECT_TIMEOUT), that can say why it is not open yet: a
    caller whose run's timeout ends first gets that error, as it would when the opening
    times out, rather than a TimeoutError saying no worker took the run."""

    def unanswered(self) -> TransportError | None:
        """The TransportError of the connection being opened now, or None."""


def using(transport: Transport) -> AbstractAsyncContextManager[None]:
    """``transport.in_use()``; nothing to hold for a transport whose idle connection runs
    no task (Redis Streams: redis-py's connections wait for the next command)."""
    if isinstance(transport, ConnectionInUse):
        return transport.in_use()
    return contextlib.nullcontext()


@runtime_checkable
class ConsumerSetup(Protocol):
    """A transport that can set channels up for consuming ahead of consuming them, so
    that a worker learns at start whether the broker takes its settings."""

    async def set_up(self, channels: Sequence[str]) -> None:
        """Connect and make ``channels`` ready to consume (Redis Streams: their streams and
        consumer group; RabbitMQ: their queues).

        Raises:
            BrokerRefusedError: the broker refused the settings (credentials, a vhost or
                database that does not exist, no permission).
            TransportError: the broker cannot be reached now.
        """


def bad_url(url: str, reason: object) -> ConfigurationError:
    """The ConfigurationError of a transport URL that cannot be used, naming it (without
    its password) and what is wrong with it."""
    return ConfigurationError(f"bad transport URL {without_password(url)!r}: {reason}")


def check_url(url: str, schemes: Sequence[str]) -> None:
    """Check that ``url`` is a URL of one of ``schemes`` whose host and port can be read.

    Raises:
        ConfigurationError: naming the URL (without its password) and what is wrong: an
            unclosed IPv6 bracket, a port that is not a number from 0 to 65535, another
            scheme.
    """
    problem = host_problem(url)
    if problem is not None:
        raise bad_url(url, problem)
    if urlsplit(url).scheme.lower() not in schemes:
        expected = ", ".join(f"{scheme}://" for scheme in schemes)
        raise bad_url(url, f"the scheme must be one of {expected}")


def transport_from_url(url: str) -> Transport:
    """The transport a URL names: ``redis://``, ``rediss://`` or ``amqp://`` (``amqps://``).

    Raises:
        ConfigurationError: an unknown scheme, or a URL that cannot be used (a bad host,
            port or database number).
        MissingDependencyError: the broker's client is not installed (names the extra).

    Example:
        >>> transport = transport_from_url("redis://localhost:6379/0")
    """
    scheme = url.partition("://")[0].lower()
    if scheme in ("redis", "rediss"):
        try:
            from nestegg.transport.redis_streams import RedisStreamsTransport
        except ImportError as error:
            raise MissingDependencyError(
                f"the Redis Streams transport needs redis-py: pip install 'nestegg[redis]' "
                f"({error})"
            ) from error
        transport: Transport = RedisStreamsTransport(url)
        return transport
    if scheme in ("amqp", "amqps"):
        try:
            from nestegg.transport.rabbitmq import RabbitMQTransport
        except ImportError as error:
            raise MissingDependencyError(
                f"the RabbitMQ transport needs aio-pika: pip install 'nestegg[rabbitmq]' ({error})"
            ) from error
        rabbit: Transport = RabbitMQTransport(url)
        return rabbit
    raise bad_url(url, f"unknown scheme {scheme!r} (redis://, rediss://, amqp://, amqps://)")
