"""The Redis Streams transport on the real Redis: delivery, ack, keep-alive, reclaim of a
gone consumer's message, requeue, and the message a forward hands over."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from nestegg.transport.base import Delivery, StepMessage
from nestegg.transport.redis_streams import GROUP, RedisStreamsTransport
from tests.servers import delete_redis_keys

pytestmark = pytest.mark.server
HOLD = 0.4


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    tag = f"nestegg-streams-{uuid.uuid4().hex[:10]}:"
    yield tag
    await delete_redis_keys(redis_url, tag)


async def next_delivery(stream: AsyncIterator[Delivery], timeout: float = 5.0) -> Delivery:
    return await asyncio.wait_for(anext(stream), timeout)


async def pending(transport: RedisStreamsTransport, channel: str) -> Any:
    return await transport.client.xpending(transport.key(channel), GROUP)


async def test_a_message_is_delivered_once_and_gone_when_acked(redis_url: str, prefix: str) -> None:
    transport = RedisStreamsTransport(redis_url, prefix=prefix)
    stream = transport.consume(["c"], hold=HOLD)
    try:
        await transport.publish("c", StepMessage("r", 1, 1, "a"))
        delivery = await next_delivery(stream)
        assert (delivery.message, delivery.redelivered) == (StepMessage("r", 1, 1, "a"), False)
        assert (await pending(transport, "c"))["pending"] == 1
        await delivery.ack()
        assert (await pending(transport, "c"))["pending"] == 0
        assert await transport.client.xlen(transport.key("c")) == 0
    finally:
        await stream.aclose()
        await transport.close()


async def test_more_publishes_at_once_than_the_pool_holds_wait_for_a_connection(
    redis_url: str, prefix: str
) -> None:
    # redis-py's plain pool raised MaxConnectionsError past its 100 connections: a caller
    # that submitted 1,000 runs at once failed most of them
    transport = RedisStreamsTransport(f"{redis_url}?max_connections=4", prefix=prefix)
    try:
        messages = [StepMessage(f"r{n}", 1, 1, "a") for n in range(50)]
        await asyncio.gather(*(transport.publish("c", message) for message in messages))
        assert await transport.client.xlen(transport.key("c")) == 50
    finally:
        await transport.close()


async def test_a_gone_consumers_message_goes_to_another_after_hold_unless_kept_alive(
    redis_url: str, prefix: str
) -> None:
    first = RedisStreamsTransport(redis_url, prefix=prefix)
    second = RedisStreamsTransport(redis_url, prefix=prefix)
    first_stream = first.consume(["c"], hold=HOLD)
    second_stream = second.consume(["c"], hold=HOLD)
    try:
        await first.publish("c", StepMessage("r", 1, 1))
        held = await next_delivery(first_stream)
        taking = asyncio.ensure_future(next_delivery(second_stream))
        for _ in range(6):  # three holds: kept alive, it stays
            await asyncio.sleep(HOLD / 2)
            await held.keep_alive()
        assert not taking.done()
        taken = await taking  # no more keep-alive: the first consumer is "gone"
        assert (taken.message, taken.redelivered) == (held.message, True)
        await taken.ack()
    finally:
        for stream in (first_stream, second_stream):
            await stream.aclose()
        await first.close()
        await second.close()


async def test_a_requeued_message_comes_back_redelivered(redis_url: str, prefix: str) -> None:
    transport = RedisStreamsTransport(redis_url, prefix=prefix)
    stream = transport.consume(["c"], hold=30)
    try:
        await transport.publish("c", StepMessage("r", 2, 3))
        await (await next_delivery(stream)).requeue()
        again = await next_delivery(stream)
        assert (again.message, again.redelivered) == (StepMessage("r", 2, 3), True)
        await again.ack()
    finally:
        await stream.aclose()
        await transport.close()


async def test_a_forward_hands_over_the_channels_next_message_while_consuming(
    redis_url: str, prefix: str
) -> None:
    transport = RedisStreamsTransport(redis_url, prefix=prefix)
    stream = transport.consume(["c"], hold=30)
    try:
        await transport.publish("c", StepMessage("r", 1, 1))
        first = await next_delivery(stream)
        following = await first.forward("c", StepMessage("r", 2, 2))
        assert following is not None and following.message == StepMessage("r", 2, 2)
        await transport.publish("c", StepMessage("other", 1, 1))  # older than the next one
        oldest = await following.forward("c", StepMessage("r", 3, 3))
        assert oldest is not None and oldest.message == StepMessage("other", 1, 1)
        assert (await pending(transport, "c"))["pending"] == 1
    finally:
        await stream.aclose()
    assert await oldest.forward("c", StepMessage("other", 2, 2)) is None  # not consuming
    assert await transport.client.xlen(transport.key("c")) == 2  # r 3 and other 2, unread
    await transport.close()


async def test_waiting_tells_a_message_not_delivered_or_left_by_a_gone_consumer(
    redis_url: str, prefix: str
) -> None:
    transport = RedisStreamsTransport(redis_url, prefix=prefix)
    stream = transport.consume(["c", "d"], hold=HOLD)
    try:
        await transport.publish("c", StepMessage("r", 1, 1))
        await asyncio.sleep(0.01)  # the consumer reads only when asked
        assert await transport.waiting(["c", "d"], hold=HOLD)
        held = await next_delivery(stream)
        assert not await transport.waiting(["c", "d"], hold=HOLD)  # it has a consumer
        await transport.publish("d", StepMessage("s", 1, 1))
        assert await transport.waiting(["c", "d"], hold=HOLD)
        assert not await transport.waiting(["c"], hold=HOLD)
        await (await next_delivery(stream)).ack()
        await asyncio.sleep(HOLD * 1.5)  # held, never kept alive: its consumer seems gone
        assert await transport.waiting(["c"], hold=HOLD)
        await held.keep_alive()
        assert not await transport.waiting(["c", "d"], hold=HOLD)
        await held.ack()
        assert not await transport.waiting(["c", "d"], hold=HOLD)
    finally:
        await stream.aclose()
        await transport.close()
