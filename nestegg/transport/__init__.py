"""Distributed mode: step messages on a broker, workers that run one step per message.

``Clutch(..., transport="redis://...")`` makes the Clutch a caller (``run``, ``submit``,
``stream`` store the run and publish its first step) and ``clutch.serve()`` (or
``nestegg worker module:attr``) a worker. The store is the only source of truth.
"""

from __future__ import annotations

from nestegg.transport.base import (
    Delivery,
    StepMessage,
    Transport,
    channel_name,
    transport_from_url,
)

__all__ = ["Delivery", "StepMessage", "Transport", "channel_name", "transport_from_url"]
