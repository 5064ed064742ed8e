"""The per-run context an agent can read with :func:`get_context`.

One context object lives for the whole run and is updated in place at every step, so a
step costs O(1) no matter how long the history is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from nestegg.agents import to_plain
from nestegg.errors import ConfigurationError, NoActiveContextError

if TYPE_CHECKING:
    from nestegg.execution import RunExecution


class ClutchState:
    """Bookkeeping of a run: id, strategy, members, turn and history.

    Built with eggai-clutch's defaults: a new id (``uuid4().hex``), ``"sequential"``, no
    members, turn 0 and a copy of the history given (none: empty).

    A resumed run's earlier history is decoded when ``history`` is first used
    (:meth:`defer_history`), so resuming a long run does not decode it all.
    """

    __slots__ = ("_earlier", "_history", "clutch_id", "members", "strategy", "turn")

    def __init__(
        self,
        clutch_id: str | None = None,
        strategy: str = "sequential",
        members: list[str] | None = None,
        turn: int = 0,
        history: list[dict[str, Any]] | None = None,
    ) -> None:
        self.clutch_id = clutch_id if clutch_id is not None else uuid.uuid4().hex
        self.strategy = strategy
        self.members = members if members is not None else []
        self.turn = turn
        self._history: list[dict[str, Any]] = list(history) if history is not None else []
        self._earlier: Callable[[], list[dict[str, Any]]] | None = None

    @property
    def history(self) -> list[dict[str, Any]]:
        """The entries ``{"source": ..., "data": ...}`` before the current data, oldest
        first."""
        if self._earlier is not None:
            entries = self._earlier()  # raises again on the next read if it fails
            self._earlier = None
            self._history[:0] = entries
        return self._history

    @history.setter
    def history(self, entries: list[dict[str, Any]]) -> None:
        self._history = entries
        self._earlier = None

    def defer_history(self, earlier: Callable[[], list[dict[str, Any]]]) -> None:
        """Put the entries ``earlier()`` returns before the history when it is first read."""
        self.history = []
        self._earlier = earlier

    def record(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` to the history (without reading deferred entries)."""
        self._history.append(entry)

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
    Built with eggai-clutch's defaults: source ``"input"``, a new :class:`ClutchState`, no
    metadata; so an agent's unit test can give it a context (``set_context``).

    Example:
        >>> set_context(ClutchContext({"text": "hi"}, metadata={"user": "u1"}))
    """

    __slots__ = ("_execution", "data", "metadata", "source", "state")

    def __init__(
        self,
        data: Any,
        source: str = "input",
        state: ClutchState | None = None,
        metadata: dict[str, Any] | None = None,
        execution: RunExecution | None = None,
    ) -> None:
        self.data = data
        self.source = source
        self.state = state if state is not None else ClutchState()
        self.metadata: dict[str, Any] = metadata if metadata is not None else {}
        self._execution = execution

    @property
    def run_id(self) -> str:
        """The id of the run (same as ``state.clutch_id``)."""
        return self.state.clutch_id

    def advance(self, source: str, data: Any) -> None:
        """Record the current data in the history and make ``data`` from ``source`` current."""
        self.state.record({"source": self.source, "data": self.data})
        self.state.turn += 1
        self.source = source
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        """The context as a plain dict (a pydantic model's data as its ``model_dump()``)."""
        return {
            "data": to_plain(self.data),
            "source": self.source,
            "state": self.state.model_dump(),
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClutchContext:
        """The context :meth:`to_dict` gave ``raw`` of (``metadata`` may be left out).

        Raises:
            ConfigurationError: ``raw`` lacks ``data``, ``source`` or ``state``, or its
                ``state`` is not a dict of :class:`ClutchState`'s fields.
        """
        _check_context_dict(raw)
        return cls(
            data=raw["data"],
            source=raw["source"],
            state=ClutchState(**raw["state"]),
            metadata=raw.get("metadata", {}),
        )


STATE_FIELDS = ("clutch_id", "strategy", "members", "turn", "history")
"""The keys of :meth:`ClutchState.model_dump`, which ``ClutchState(**dumped)`` takes back."""


def _check_context_dict(raw: dict[str, Any]) -> None:
    missing = [key for key in ("data", "source", "state") if key not in raw]
    if missing:
        raise ConfigurationError(
            f"ClutchContext.from_dict: the dict has no {', '.join(map(repr, missing))} "
            "(it takes what to_dict gives: data, source, state and metadata)"
        )
    state = raw["state"]
    unknown = sorted(set(state) - set(STATE_FIELDS)) if isinstance(state, dict) else None
    if unknown is None or unknown:
        got = f"unknown keys {unknown}" if unknown else f"a {type(state).__name__}"
        raise ConfigurationError(
            f"ClutchContext.from_dict: 'state' must be a dict of the fields of ClutchState "
            f"({', '.join(STATE_FIELDS)}), got {got}"
        )


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
