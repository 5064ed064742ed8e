"""The context an agent reads with :func:`get_context`: one per step, as in eggai-clutch.

Every step gets a new :class:`ClutchContext` (:meth:`ClutchContext.next`), so a context an
agent keeps says forever what its step saw. The states of a run's steps share one list of
history entries, which is only appended to: each state knows how many of them are its
history, so a step costs O(1) no matter how long the history is, and only a state read
after a later step was added copies its part of the list.
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

Entry = dict[str, Any]
"""A history entry: ``{"source": ..., "data": ...}``."""


class _Entries:
    """The history entries the states of a run's steps share, appended to only.

    A resumed run's earlier entries, decoded when first read (``earlier``), go before the
    ones appended here; ``base`` counts them once they are in.
    """

    __slots__ = ("base", "earlier", "items")

    def __init__(
        self, items: list[Entry], earlier: Callable[[], list[Entry]] | None = None
    ) -> None:
        self.items = items
        self.earlier = earlier
        self.base = 0

    def read(self) -> list[Entry]:
        """Every entry, the earlier ones decoded first if they were not yet."""
        if self.earlier is not None:
            entries = self.earlier()  # raises again on the next read if it fails
            self.earlier = None
            self.items[:0] = entries
            self.base = len(entries)
        return self.items


class ClutchState:
    """Bookkeeping of a run: id, strategy, members, turn and history.

    Built with eggai-clutch's defaults: a new id (``uuid4().hex``), ``"sequential"``, no
    members, turn 0 and a copy of the history given (none: empty).

    A resumed run's earlier history is decoded when ``history`` is first used
    (:meth:`defer_history`), so resuming a long run does not decode it all.
    """

    __slots__ = ("_entries", "_length", "clutch_id", "members", "strategy", "turn")

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
        self._entries = _Entries(list(history) if history is not None else [])
        self._length: int | None = None  # None: the entries are all its own

    @property
    def history(self) -> list[dict[str, Any]]:
        """The entries ``{"source": ..., "data": ...}`` before the current data, oldest
        first: those of this state's step, also when read after later steps."""
        entries = self._entries
        items = entries.read()
        if self._length is None:
            return items
        own = items[: entries.base + self._length]  # a later step's state shares the rest
        self._entries, self._length = _Entries(own), None
        return own

    @history.setter
    def history(self, entries: list[dict[str, Any]]) -> None:
        self._entries, self._length = _Entries(list(entries)), None

    def defer_history(self, earlier: Callable[[], list[dict[str, Any]]]) -> None:
        """Make the history the entries ``earlier()`` returns, called when it is first read."""
        self._entries, self._length = _Entries([], earlier), None

    def _following(self, entry: dict[str, Any]) -> ClutchState:
        """The state of the next step: this one's history and ``entry``, a turn later.

        This state keeps its history: the two share the entries, and it counts its own.
        O(1), unless this state was followed before (its entries are copied first).
        """
        if self._length is not None:
            _ = self.history  # followed before: go on from a copy of its entries
        entries = self._entries
        items = entries.items
        self._length = len(items) - entries.base  # the entries appended here are its own
        items.append(entry)
        state = ClutchState.__new__(ClutchState)
        state.clutch_id, state.strategy, state.members = self.clutch_id, self.strategy, self.members
        state.turn, state._entries, state._length = self.turn + 1, entries, None
        return state

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

    def next(self, source: str, data: Any) -> ClutchContext:
        """The context of the next step: ``data`` from ``source``, this context's data
        (a pydantic model's as its ``model_dump()``) and source appended to the history, a
        turn later, a copy of the metadata.

        This context keeps what it has (data, source, turn, history, metadata), so one an
        agent kept still says what its step saw. O(1) in the length of the history.
        """
        state = self.state._following({"source": self.source, "data": to_plain(self.data)})
        return ClutchContext(data, source, state, dict(self.metadata), self._execution)

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
        raise NoActiveContextError(
            "No active Clutch context: get_context() was called outside a running agent"
        )
    return ctx


def current_context() -> ClutchContext | None:
    """The active context, or None outside an agent."""
    return _current.get()


def set_context(ctx: ClutchContext | None) -> None:
    """Make ``ctx`` the active context of the current task."""
    _current.set(ctx)
