"""Distributed mode: step messages on a broker, workers that run one step per message.

``Clutch(..., transport="redis://...")`` makes the Clutch a caller (``run``, ``submit``,
``stream`` store the run and publish its first step) and ``clutch.serve()`` (or
``nestegg worker module:attr``) a worker. The store is the only source of truth.

The transports are imported when first named, so that a missing broker client only
matters to who uses it.
"""

from __future__ import annotations

import importlib
from typing import Any

from nestegg.transport.base import (
    Delivery,
    StepMessage,
    Transport,
    WaitingProbe,
    channel_name,
    transport_from_url,
)

_LAZY = {
    "RedisStreamsTransport": "nestegg.transport.redis_streams",
    "RabbitMQTransport": "nestegg.transport.rabbitmq",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'nestegg.transport' has no attribute {name!r}")


__all__ = [
    "Delivery",
    "RabbitMQTransport",
    "RedisStreamsTransport",
    "StepMessage",
    "Transport",
    "WaitingProbe",
    "channel_name",
    "transport_from_url",
]
