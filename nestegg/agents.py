"""Agents: async functions with an optional pydantic-typed first parameter."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ValidationError

from nestegg.errors import ConfigurationError
from nestegg.identifiers import agent_names, check_name

AgentFunction = Callable[..., Awaitable[Any]]


def input_type_of(handler: Callable[..., Any]) -> type | None:
    """The annotation of the handler's first parameter, or None."""
    try:
        params = list(inspect.signature(handler).parameters.values())
        if not params:
            return None
        hint = get_type_hints(handler).get(params[0].name)
    except (TypeError, ValueError, NameError):
        return None
    return hint if isinstance(hint, type) else None


def to_typed(data: Any, target: type | None) -> Any:
    """``data`` rebuilt as ``target`` when that is a pydantic model and data is its dict form."""
    if not (isinstance(target, type) and issubclass(target, BaseModel)):
        return data  # None, or a plain annotation such as str or typing.Any
    if isinstance(data, dict):
        return target.model_validate(data)
    return data


def misfit(data: Any, target: type | None) -> str | None:
    """Why :func:`to_typed` cannot rebuild ``data`` as ``target`` (None: it can), as
    :func:`validation_problems` says it."""
    try:
        to_typed(data, target)
    except ValidationError as error:
        return validation_problems(error)
    return None


def validation_problems(error: ValidationError) -> str:
    """pydantic's reasons, short: ``pages: Field required`` (the first three)."""
    return "; ".join(
        f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors()[:3]
    )


PLAIN_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})
"""Types :func:`to_plain` passes on by their exact type, without asking pydantic whether the
value is a model: that check is about 1,000 instructions, and a step makes two."""


def to_plain(value: Any) -> Any:
    """A pydantic model dumped to its dict form; anything else unchanged."""
    if type(value) in PLAIN_TYPES or not isinstance(value, BaseModel):
        return value
    return value.model_dump()


class AgentNode:
    """One registered agent: its name, handler, graph edges and input type."""

    __slots__ = ("edges", "handler", "input_type", "name")

    def __init__(self, name: str, handler: AgentFunction, edges: list[str] | None = None) -> None:
        if not inspect.iscoroutinefunction(handler):
            raise ConfigurationError(f"agent {name!r} must be an async function (async def)")
        self.name = check_name(name, "agent name")
        self.handler = handler
        where = f"edges of agent {name!r}"
        self.edges: list[str] = [] if edges is None else agent_names(edges, where, "edges")
        self.input_type = input_type_of(handler)
