"""The RabbitMQ transport on the real broker: its connection lasts as long as some code
uses it (a run, a consumer, ``async with clutch``) and is closed when the last use ends;
whether a message waits, as the broker counts it now."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage
from nestegg.errors import ConfigurationError
from nestegg.transport.base import StepMessage, channel_name
from tests.transport.conftest import (
    wait_until,
)

pytestmark = pytest.mark.server


@pytest.fixture
async def transport(rabbitmq_url: str) -> AsyncIterator[Any]:
    """A transport under a prefix of its own; its queues deleted afterwards."""
    from nestegg.transport.rabbitmq import RabbitMQTransport

    opened = RabbitMQTransport(rabbitmq_url, prefix=f"nestegg-rabbit-{uuid.uuid4().hex[:10]}:")
    yield opened
    try:
        await opened.delete_channels(["c", channel_name("lonely"), channel_name("lonely", "idle")])
    finally:
        await opened.close()


def connection_open(transport: Any) -> bool:
    return transport._connection is not None and not transport._connection.is_closed


async def test_the_connection_closes_when_its_last_use_ends(transport: Any) -> None:
    async with transport.in_use():
        async with transport.in_use():
            await transport.publish("c", StepMessage("r", 1, 1))
            first = transport._connection
        assert connection_open(transport)  # the outer use holds it
        await transport.publish("c", StepMessage("r", 2, 1))
        assert transport._connection is first
    assert first.is_closed and not connection_open(transport)
    async with transport.in_use():
        await transport.publish("c", StepMessage("r", 3, 1))  # connects again
        assert connection_open(transport) and transport._connection is not first


async def test_a_close_while_the_connection_opens_closes_it_too(transport: Any) -> None:
    opening = asyncio.ensure_future(transport.publish("c", StepMessage("r", 1, 1)))
    for _ in range(100):
        if transport._lock.locked():  # the connection opens
            break
        await asyncio.sleep(0)
    assert transport._lock.locked()
    await transport.close()
    await asyncio.gather(opening, return_exceptions=True)  # published, or closed under it
    left = [t for t in asyncio.all_tasks() if "connection_factory" in repr(t.get_coro())]
    assert not connection_open(transport) and not left  # no reconnection task goes on


async def test_a_consumer_keeps_the_connection_when_a_callers_use_ends(transport: Any) -> None:
    deliveries = transport.consume(["c"], hold=5.0)
    try:
        async with transport.in_use():  # a caller's run, ended while the consumer goes on
            await transport.publish("c", StepMessage("r", 1, 1))
        delivery = await asyncio.wait_for(anext(deliveries), 5)
        await delivery.ack()
        assert delivery.message == StepMessage("r", 1, 1)
        assert connection_open(transport)
    finally:
        await deliveries.aclose()
    assert not connection_open(transport)


async def test_async_with_a_clutch_holds_the_connection_across_its_runs(
    transport: Any, tmp_path: Path
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "runs.db")
    clutch = Clutch("lonely", transport=transport, checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def idle(data: dict[str, Any]) -> dict[str, Any]:
        return data

    connections = []
    async with clutch:
        for number in range(2):  # no worker: each run waits until cancelled
            task = await clutch.submit({"n": number})
            await wait_until(lambda: connection_open(transport), 5, "the first step published")
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert connection_open(transport)  # the run's use ended, the block's goes on
            connections.append(transport._connection)
    assert connections[0] is connections[1]
    assert not connection_open(transport)


async def test_waiting_counts_the_messages_ready_now(transport: Any) -> None:
    await transport.publish("c", StepMessage("r", 1, 1))  # declares "c" (empty) first
    assert await transport.waiting(["c"], hold=5.0)
    deliveries = transport.consume(["c"], hold=5.0)
    try:
        delivery = await asyncio.wait_for(anext(deliveries), 5)
        await delivery.ack()
        assert not await transport.waiting(["c"], hold=5.0)
    finally:
        await deliveries.aclose()


async def test_a_queue_name_longer_than_rabbitmq_takes_is_a_configuration_error(
    transport: Any,
) -> None:
    channel = channel_name("p" * 200, "a" * 40)
    size = len(transport.prefix) + len(channel)
    message = (
        f"RabbitMQ queue name {(transport.prefix + channel)[:60]!r}... is {size} bytes; "
        "RabbitMQ takes at most 255: give the pipeline or its agent a shorter name, or the "
        "transport a shorter prefix"
    )
    with pytest.raises(ConfigurationError) as publishing:
        await transport.publish(channel, StepMessage("r", 1, 1))
    assert str(publishing.value) == message
    with pytest.raises(ConfigurationError) as setting_up:
        await transport.set_up([channel])
    assert str(setting_up.value) == message
    # the longest name it takes still works
    longest = channel_name("p" * (255 - len(transport.prefix) - len("nestegg.")))
    await transport.publish(longest, StepMessage("r", 1, 1))
    await transport.delete_channels([longest])
