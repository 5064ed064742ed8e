"""Control-flow signals an agent raises to steer its Clutch (not errors)."""

from __future__ import annotations

import reprlib
from typing import Any, NoReturn

from nestegg.errors import InvalidIdentifierError


class Terminate(Exception):
    """Raise inside an agent to stop the pipeline; ``result``, when given, is returned.

    Example:
        >>> async def check(data):
        ...     raise Terminate({"status": "rejected"})
    """

    def __init__(self, result: Any = None) -> None:
        self.result = result
        super().__init__()


class WaitSuspended(BaseException):
    """Raised through an agent's step by ``nestegg.wait_for`` or ``nestegg.sleep`` when
    its run has to wait (not an error: a ``BaseException``, so an agent's
    ``except Exception`` lets it through)."""

    def __init__(self, signal: str | None, deadline: float | None) -> None:
        super().__init__(signal, deadline)
        self.signal = signal
        self.deadline = deadline


class Handover(Exception):
    """Raise inside an agent to pass control to another agent, optionally with new data.

    A hand-over to an agent the Clutch does not know stops the pipeline.

    Raises:
        InvalidIdentifierError: ``agent`` is not a str (the agent's error then fails its
            step).

    Example:
        >>> async def triage(data):
        ...     raise Handover("billing", data)
    """

    def __init__(self, agent: str, data: Any = None) -> None:
        if not isinstance(agent, str):
            raise InvalidIdentifierError(
                f"Handover({reprlib.repr(agent)}) names no agent: hand over to an agent by "
                "its name (a str)"
            )
        self.agent = agent
        self.data = data
        super().__init__()


def handover(agent: str, data: Any = None) -> NoReturn:
    """Pass control to ``agent`` with optional ``data`` (raises :class:`Handover`)."""
    raise Handover(agent, data)
