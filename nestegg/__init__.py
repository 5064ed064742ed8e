"""nestegg: multi-agent pipelines that survive crashes.

A :class:`Clutch` runs async agents by a :class:`Strategy`; with
``checkpoint=CheckpointConfig(...)`` every step is committed to a store and a crashed,
failed or interrupted run resumes where it stopped.
"""

from __future__ import annotations

from nestegg.clutch import Clutch
from nestegg.context import ClutchContext, ClutchState, get_context
from nestegg.errors import (
    NestEggError,
    RunWaiting,
    SignalExistsError,
    SignalRefusedError,
    SignalTimeoutError,
    SignalValueError,
)
from nestegg.journal import RetryPolicy, call, durable
from nestegg.signals import Handover, Terminate, handover
from nestegg.strategies import Strategy
from nestegg.task import ClutchTask, StepEvent
from nestegg.waits import sleep, wait_for

__version__ = "0.1.0"

__all__ = [
    "Clutch",
    "ClutchContext",
    "ClutchState",
    "ClutchTask",
    "Handover",
    "NestEggError",
    "RetryPolicy",
    "RunWaiting",
    "SignalExistsError",
    "SignalRefusedError",
    "SignalTimeoutError",
    "SignalValueError",
    "StepEvent",
    "Strategy",
    "Terminate",
    "__version__",
    "call",
    "durable",
    "get_context",
    "handover",
    "sleep",
    "wait_for",
]
