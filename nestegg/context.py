"""The per-run context an agent can read with :func:`get_context`.

One context object lives for the whole run and is updated in place at every step, so a
step costs O(1) no matter how long the history is.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from nestegg.errors import NoActiveContextError

if TYPE_CHECKING:
    from nestegg.execution import RunExecution


class ClutchState:
    """Bookkeeping of a run: id, strategy, members, turn and history."""

    __slots__ = ("clutch_id", "history", "members", "strategy", "turn")

    def __init__(
        self,
        clutch_id: str,
        strategy: str,
        members: list[str],
        turn: int = 0,
        history: list[dict[str, Any]] | None = None,
    ) -> None:
        self.clutch_id = clutch_id
        self.strategy = strategy
        self.members = members
        self.turn = turn
        self.history: list[dict[str, Any]] = history if history is not None else []

    def model_dump(self) -> dict[str, Any]:
        """The state as a plain dict."""
        return {
            "clutch_id": self.clutch_id,
            "strategy": self.strategy,
            "members": list(self.members),
            "turn": self.turn,
            "history": list(self.history),
        }


class ClutchContext:
    """What an agent sees of its run: current data, its source, the state and metadata.

    ``metadata`` is a free dict that agents may write to; it is checkpointed with the run.
    """

    __slots__ = ("_execution", "data", "metadata", "source", "state")

    def __init__(
        self,
        data: Any,
        source: str,
        state: ClutchState,
        metadata: dict[str, Any] | None = None,
        execution: RunExecution | None = None,
    ) -> None:
        self.data = data
        self.source = source
        self.state = state
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self._execution = execution

    @property
    def run_id(self) -> str:
        """The id of the run (same as ``state.clutch_id``)."""
        return self.state.clutch_id

    def advance(self, source: str, data: Any) -> None:
        """Record the current data in the history and make ``data`` from ``source`` current."""
        self.state.history.append({"source": self.source, "data": self.data})
        self.state.turn += 1
        self.source = source
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        """The context as a plain dict."""
        return {
            "data": self.data,
            "source": self.source,
            "state": self.state.model_dump(),
            "metadata": self.metadata,
        }


_current: ContextVar[ClutchContext | None] = ContextVar("nestegg_context", default=None)


def get_context() -> ClutchContext:
    """The context of the run whose agent is executing.

    Returns:
        The live :class:`ClutchContext`.

    Raises:
        NoActiveContextError: called outside an agent (it is also a ``RuntimeError``).

    Example:
        >>> async def agent(data):
        ...     turn = get_context().state.turn
    """
    ctx = _current.get()
    if ctx is None:
        raise NoActiveContextError("get_context() was called outside a running agent")
    return ctx


def current_context() -> ClutchContext | None:
    """The active context, or None outside an agent."""
    return _current.get()


def set_context(ctx: ClutchContext | None) -> None:
    """Make ``ctx`` the active context of the current task."""
    _current.set(ctx)
