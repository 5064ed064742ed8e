"""The four strategies as small cursor objects that say which agent runs next.

A cursor's position is a small dict (``position()``) that a checkpoint stores and
``restore()`` reads back, checking that the agents it names still exist. It says where the
run goes on: SEQUENTIAL and ROUND_ROBIN ``{"index": i, "agent": a}`` (``a``, the agent at
``i`` of the order, runs next; None: the order is done), GRAPH ``{"node": n}`` (``n`` runs
next; None: the graph ended), SELECTOR ``{"forced": f}`` (``f``, the target of a hand-over,
runs next; None: the selector picks the next agent). ``upcoming()`` and
:func:`upcoming_at` read that.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from enum import Enum
from typing import Any, Protocol

from nestegg.errors import IncompatibleCheckpointError


class Strategy(Enum):
    """How a Clutch picks the next agent."""

    SEQUENTIAL = "sequential"
    ROUND_ROBIN = "round_robin"
    GRAPH = "graph"
    SELECTOR = "selector"


Choose = Callable[[Any], Awaitable[str | None]]
"""The selector, asked with the current data: the agent to run next, None to stop."""


class Undecided(Enum):
    """A next agent that no cursor state names: the selector picks it when the run goes on."""

    SELECTOR = "selector"


Upcoming = str | Undecided | None
"""The agent that runs next; None: the run stops; ``Undecided.SELECTOR``: not known yet."""


class Cursor(Protocol):
    """Where a run goes next."""

    async def next_agent(self, data: Any) -> str | None:
        """The agent to run now, or None to stop (``data``: the current data, which a
        selector is asked with)."""

    def completed(self, agent: str) -> bool:
        """Move past ``agent`` after it returned; False stops the run."""

    def handover(self, target: str) -> bool:
        """Jump to ``target``; False (unknown target) stops the run."""

    def upcoming(self) -> Upcoming:
        """The agent that runs next as the cursor's state says it, without asking the
        selector (None: the run stops; ``Undecided.SELECTOR``: the selector picks it)."""

    def position(self) -> dict[str, Any]:
        """The cursor's state, to store in a checkpoint."""

    def restore(self, position: Mapping[str, Any]) -> None:
        """Take back a stored position; IncompatibleCheckpointError if it names a lost agent."""


def _missing(agent: str, what: str) -> IncompatibleCheckpointError:
    return IncompatibleCheckpointError(
        f"the checkpoint continues with agent {agent!r} ({what}), which this pipeline no "
        "longer has",
        agent,
    )


class OrderCursor:
    """SEQUENTIAL (stops after the last agent) and ROUND_ROBIN (wraps around)."""

    def __init__(self, order: list[str], agents: Mapping[str, object], wrap: bool) -> None:
        self.order = order
        self.agents = agents
        self.wrap = wrap
        self.index = 0

    async def next_agent(self, data: Any) -> str | None:
        if self.wrap:
            return self.order[self.index % len(self.order)] if self.order else None
        return self.order[self.index] if self.index < len(self.order) else None

    def completed(self, agent: str) -> bool:
        self.index += 1
        return True

    def handover(self, target: str) -> bool:
        if target not in self.agents or target not in self.order:
            return False
        self.index = self.order.index(target)
        return True

    def upcoming(self) -> str | None:
        if self.order and (self.wrap or self.index < len(self.order)):
            return self.order[self.index % len(self.order)]
        return None

    @staticmethod
    def upcoming_at(position: Mapping[str, Any]) -> str | None:
        """The agent a stored position of this cursor runs next (None: the order is done)."""
        agent = position.get("agent")
        return agent if isinstance(agent, str) else None

    def position(self) -> dict[str, Any]:
        return {"index": self.index, "agent": self.upcoming()}

    def restore(self, position: Mapping[str, Any]) -> None:
        index = int(position.get("index", 0))
        agent = position.get("agent")
        if agent is None:
            self.index = index
            return
        if agent not in self.agents or agent not in self.order:
            raise _missing(agent, f"position {index} of the order")
        at = index % len(self.order)
        if self.order[at] != agent:
            index += self.order.index(agent) - at
        self.index = index


class GraphCursor:
    """GRAPH: start at the first agent, follow each agent's first edge."""

    def __init__(self, order: list[str], agents: Mapping[str, Any]) -> None:
        self.agents = agents
        self.node: str | None = order[0] if order else None

    async def next_agent(self, data: Any) -> str | None:
        return self.node if self.node in self.agents else None

    def completed(self, agent: str) -> bool:
        edges: list[str] = self.agents[agent].edges
        self.node = edges[0] if edges else None
        return self.node is not None

    def handover(self, target: str) -> bool:
        if target not in self.agents:
            return False
        self.node = target
        return True

    def upcoming(self) -> str | None:
        return self.node

    @staticmethod
    def upcoming_at(position: Mapping[str, Any]) -> str | None:
        """The node a stored position of this cursor runs next (None: the graph ended)."""
        node = position.get("node")
        return node if isinstance(node, str) else None

    def position(self) -> dict[str, Any]:
        return {"node": self.node}

    def restore(self, position: Mapping[str, Any]) -> None:
        node = position.get("node")
        if node is not None and node not in self.agents:
            raise _missing(node, "the graph node to run next")
        self.node = node


class SelectorCursor:
    """SELECTOR: ask the selector each turn, unless a hand-over forced the next agent."""

    def __init__(self, agents: Mapping[str, object], choose: Choose | None) -> None:
        self.agents = agents
        self.choose = choose
        self.forced: str | None = None

    async def next_agent(self, data: Any) -> str | None:
        agent: str | None
        if self.forced is not None:
            agent, self.forced = self.forced, None
        elif self.choose is not None:
            agent = await self.choose(data)
        else:
            return None
        return agent if agent in self.agents else None

    def completed(self, agent: str) -> bool:
        return True

    def handover(self, target: str) -> bool:
        if target not in self.agents:
            return False
        self.forced = target
        return True

    def upcoming(self) -> str | Undecided | None:
        if self.forced is None and self.choose is None:
            return None  # no selector: the run stops
        return self.upcoming_at(self.position())

    @staticmethod
    def upcoming_at(position: Mapping[str, Any]) -> str | Undecided:
        """The hand-over target a stored position of this cursor runs next, else
        ``Undecided.SELECTOR``."""
        forced = position.get("forced")
        return forced if isinstance(forced, str) else Undecided.SELECTOR

    def position(self) -> dict[str, Any]:
        return {"forced": self.forced}

    def restore(self, position: Mapping[str, Any]) -> None:
        forced = position.get("forced")
        if forced is not None and forced not in self.agents:
            raise _missing(forced, "the agent a hand-over chose")
        self.forced = forced


_BY_KEY: dict[str, Callable[[Mapping[str, Any]], Upcoming]] = {
    "index": OrderCursor.upcoming_at,
    "node": GraphCursor.upcoming_at,
    "forced": SelectorCursor.upcoming_at,
}


def upcoming_at(position: Mapping[str, Any] | None) -> Upcoming:
    """What a stored position (any cursor's ``position()``) says runs next, as that
    cursor's ``upcoming()`` does; None for no position or one of no strategy."""
    for key, read in _BY_KEY.items():
        if position and key in position:
            return read(position)
    return None


def make_cursor(
    strategy: Strategy, order: list[str], agents: Mapping[str, Any], choose: Choose | None
) -> Cursor:
    """The cursor object for ``strategy``."""
    if strategy is Strategy.SEQUENTIAL:
        return OrderCursor(order, agents, wrap=False)
    if strategy is Strategy.ROUND_ROBIN:
        return OrderCursor(order, agents, wrap=True)
    if strategy is Strategy.GRAPH:
        return GraphCursor(order, agents)
    return SelectorCursor(agents, choose)
