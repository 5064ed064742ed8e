"""nestegg: multi-agent pipelines that survive crashes.

A :class:`Clutch` runs async agents by a :class:`Strategy`; with
``checkpoint=CheckpointConfig(...)`` every step is committed to a store and a crashed,
failed or interrupted run resumes where it stopped.

Each name below is imported from its module when first used (``from nestegg import
Clutch`` does it), so that ``import nestegg.cli`` (the ``nestegg`` command) and
``import nestegg.checkpoint`` do not import the orchestrator; type checkers see the
imports as written here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nestegg.client_logs import quiet_unless_configured
from nestegg.lazy_names import imported_name

quiet_unless_configured("nestegg")  # the library's own lines: only where logging is set up

if TYPE_CHECKING:
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

_HOMES = {
    "Clutch": "nestegg.clutch",
    "ClutchContext": "nestegg.context",
    "ClutchState": "nestegg.context",
    "ClutchTask": "nestegg.task",
    "Handover": "nestegg.signals",
    "NestEggError": "nestegg.errors",
    "RetryPolicy": "nestegg.journal",
    "RunWaiting": "nestegg.errors",
    "SignalExistsError": "nestegg.errors",
    "SignalRefusedError": "nestegg.errors",
    "SignalTimeoutError": "nestegg.errors",
    "SignalValueError": "nestegg.errors",
    "StepEvent": "nestegg.task",
    "Strategy": "nestegg.strategies",
    "Terminate": "nestegg.signals",
    "call": "nestegg.journal",
    "durable": "nestegg.journal",
    "get_context": "nestegg.context",
    "handover": "nestegg.signals",
    "sleep": "nestegg.waits",
    "wait_for": "nestegg.waits",
}
"""The module each public name comes from (the imports above, for type checkers)."""

if not TYPE_CHECKING:  # a type checker reads the imports above, and flags a name not there

    def __getattr__(name: str) -> Any:
        """A public name, imported from its module (:data:`_HOMES`) when first used."""
        return imported_name(globals(), __name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


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
