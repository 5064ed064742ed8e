"""A pipeline's definition: its agents (``@clutch.agent()``), its selector, the order they
run in, and the check that they fit together (``validate``). The base of
:class:`~nestegg.pipeline.PipelineBase`, which builds and drives the runs' executions.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar, overload

from nestegg.agents import AgentNode, input_type_of, to_typed
from nestegg.errors import ConfigurationError, InvalidIdentifierError
from nestegg.journal import function_name
from nestegg.journal_results import underlying
from nestegg.strategies import Strategy

F = TypeVar("F", bound=Callable[..., Any])
Selector = Callable[..., Awaitable[str | None]]


class PipelineDefinition:
    """A pipeline's agents, selector and order (set up by PipelineBase's ``__init__``)."""

    name: str
    strategy: Strategy
    _explicit_order: list[str] | None
    _agents: dict[str, AgentNode]
    _agent_order: list[str]
    _selector: Selector | None
    _selector_input_type: type | None

    @overload
    def agent(self, edges: F) -> F: ...

    @overload
    def agent(self, edges: list[str] | None = None) -> Callable[[F], F]: ...

    def agent(self, edges: Any = None) -> Any:
        """Register an async function as an agent (``@clutch.agent()`` or ``@clutch.agent``).

        Args:
            edges: for GRAPH, the agents that may follow (the first one is taken).

        The agent's name is its function's ``__name__``, unique in the Clutch. A function
        redefined (the same module and qualname: a notebook cell run again, a module
        reloaded) replaces the agent of its name, in place, with its edges.

        Raises:
            ConfigurationError: what is registered is not a function with a ``__name__``
                (naming it) or not async, or its name is another
                registered function's (naming both), or it is registered already with
                other edges (registering it again with the same edges does nothing).
            InvalidIdentifierError: its name is not a safe identifier.
        """
        if callable(edges):
            return self.agent()(edges)

        def register(fn: F) -> F:
            name = getattr(fn, "__name__", None)
            if not isinstance(name, str):  # 5, a partial: nothing to name the agent by
                raise ConfigurationError(
                    f"Clutch {self.name!r}: agent() registers an async function (async def), "
                    f"named by its __name__; got {fn!r}"
                )
            node = AgentNode(name, fn, edges)
            if self._registered(node):
                return fn
            self._agents[node.name] = node  # a redefined function's replaces it in place
            if node.name not in self._agent_order:
                self._agent_order.append(node.name)
            return fn

        return register

    def _registered(self, node: AgentNode) -> bool:
        """Whether ``node`` is registered already (the same function with the same edges:
        nothing to do); False too for a new name, or for the function registered under its
        name redefined (the same module and qualname, compiled again: a notebook cell run
        again, a module reloaded), which replaces it. A ConfigurationError when its name is
        another function's, which it would silently replace (two functions of one
        ``__name__`` in two modules, or two that one definition made), or the function is
        registered with other edges."""
        taken = self._agents.get(node.name)
        if taken is None:
            return False
        old, new = function_name(taken.handler), function_name(node.handler)
        if taken.handler is node.handler:
            if taken.edges == node.edges:
                return True
            raise ConfigurationError(
                f"function {new} is registered as agent {node.name!r} on Clutch "
                f"{self.name!r} already, with edges {taken.edges}: register it once, "
                f"with all its edges (not {node.edges} again)"
            )
        if old == new:
            if _redefines(taken.handler, node.handler):
                return False
            raise ConfigurationError(  # closures of one def: the same code, made twice
                f"agent name {node.name!r} is taken on Clutch {self.name!r} by {old}; "
                "another function that definition made has the same name and would replace "
                "it: an agent is named by its function's __name__, so give each its own"
            )
        raise ConfigurationError(
            f"agent name {node.name!r} is taken on Clutch {self.name!r} by {old}; {new} "
            "has the same name and would replace it: an agent is named by its function's "
            "__name__, so rename one of the two functions"
        )

    def selector(self, fn: Selector | None = None) -> Any:
        """Register the async function that picks the next agent (SELECTOR strategy).

        The selector gets the current data and returns the next agent's name (None
        stops the run; a name no agent has stops it too). A selector that raises, or
        returns what is neither a str nor None (InvalidIdentifierError), fails the run as
        an agent that raises does. Journaled calls it makes (``await nestegg.call(...)``, durable
        functions) are journaled in the step whose agent it is picking, at positions
        -1, -2, ... that the agent's own calls (0, 1, ...) never take: when that step
        runs again, the selector gets its recorded answers back and picks the same agent.

        Args:
            fn: the async selector (``@clutch.selector`` or ``@clutch.selector()``).

        Returns:
            ``fn`` unchanged, or a decorator that registers the function it gets.

        Raises:
            ConfigurationError: the selector is not an async function, or the Clutch has
                another selector already (naming both; registering the same function
                again does nothing, and the same function redefined replaces it).

        Example:
            >>> @clutch.selector
            ... async def choose(data: dict) -> str | None:
            ...     return await nestegg.call(route_with_llm, data)
        """

        def register(f: Selector) -> Selector:
            if not inspect.iscoroutinefunction(f):
                raise ConfigurationError(
                    f"selector {getattr(f, '__name__', f)!r} must be an async function"
                )
            if self._selector is not None and not _redefines(self._selector, f):
                raise ConfigurationError(
                    f"Clutch {self.name!r} has a selector already, "
                    f"{function_name(self._selector)}; {function_name(f)} would replace it: "
                    "a Clutch has one selector, so register only one"
                )
            self._selector = f
            self._selector_input_type = input_type_of(f)
            return f

        return register(fn) if fn is not None else register

    async def _select(self, data: Any) -> str | None:
        """The selector's pick for ``data``: the next agent's name, None to stop.

        Raises:
            InvalidIdentifierError: the selector returned what is neither a str nor None
                (naming it, and what it returned).
        """
        assert self._selector is not None
        picked = await self._selector(to_typed(data, self._selector_input_type))
        if picked is None or isinstance(picked, str):
            return picked
        raise InvalidIdentifierError(
            f"selector {function_name(self._selector)} returned {reprlib.repr(picked)} "
            f"(a {type(picked).__name__}), not the name of an agent: a selector returns the "
            "name of the agent to run next (a str), or None to stop"
        )

    def _get_order(self) -> list[str]:
        return self._explicit_order if self._explicit_order else self._agent_order

    def _to_typed(self, data: Any, target_type: type | None) -> Any:
        return to_typed(data, target_type)

    def check_registered(self, names: Iterable[str], where: str) -> None:
        """Refuse the first of ``names`` that is not a registered agent.

        Raises:
            ConfigurationError: ``order= names agent 'x', which is not registered on Clutch
                'p' (known: [...])``, ``where`` naming what named it.
        """
        for name in names:
            if name not in self._agents:
                raise ConfigurationError(
                    f"{where} names agent {name!r}, which is not registered on Clutch "
                    f"{self.name!r} (known: {sorted(self._agents)})"
                )

    def validate(self) -> None:
        """Check the definition: names in ``order=`` and ``edges=`` exist.

        Raises:
            ConfigurationError: naming the unknown agent and where it was named.
        """
        self.check_registered(self._explicit_order or [], "order=")
        for node in self._agents.values():
            for edge in node.edges:
                if edge not in self._agents:
                    raise ConfigurationError(
                        f"agent {node.name!r} has an edge to {edge!r}, which is not "
                        f"registered on Clutch {self.name!r}"
                    )
        if self.strategy is Strategy.ROUND_ROBIN and not self._get_order():
            raise ConfigurationError(f"ROUND_ROBIN Clutch {self.name!r} has no agents")


def _code(fn: Callable[..., Any]) -> Any:
    """The code object of the function ``fn`` wraps (None: it has none)."""
    return getattr(underlying(fn), "__code__", None)


def _redefines(old: Callable[..., Any], new: Callable[..., Any]) -> bool:
    """Whether ``new`` is ``old``, or ``old`` redefined: the same module and qualname
    compiled again (a notebook cell run again, a module reloaded)."""
    return new is old or (function_name(old) == function_name(new) and _code(old) is not _code(new))


__all__ = ["PipelineDefinition", "Selector"]
