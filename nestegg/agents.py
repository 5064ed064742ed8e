"""Agents: async functions with an optional pydantic-typed first parameter."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

from pydantic import BaseModel, ValidationError

from nestegg.constants import MAX_NAME_LENGTH
from nestegg.errors import ConfigurationError, InvalidIdentifierError

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


UNSAFE_CHARACTERS = {
    "/": "a path separator '/'",
    "\\": "a path separator '\\'",
    "\0": "a NUL (U+0000)",
    "\n": "a line feed (U+000A)",
    "\r": "a carriage return (U+000D)",
}
"""What :func:`check_name` refuses in a name, as its message names each."""
NOT_ALLOWED = "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"
"""What :func:`check_name` refuses in a name (of its characters: UNSAFE_CHARACTERS; a tab,
ESC or a bidi control is taken), as the end of its refusal says it."""


def check_name(name: str, what: str) -> str:
    """``name`` if it is a safe identifier for ``what`` (no separators, no '..', bounded)."""
    if not isinstance(name, str) or not name:
        raise InvalidIdentifierError(f"{what} must be a non-empty string, got {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidIdentifierError(
            f"{what} {name[:40]!r}... is {len(name)} characters long; at most "
            f"{MAX_NAME_LENGTH} are allowed"
        )
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError as error:  # a lone surrogate: bytes that were not UTF-8
            raise InvalidIdentifierError(
                f"{what} {name!r} is not valid Unicode text (a lone surrogate at character "
                f"{error.start}, as bytes that are not UTF-8 give)"
            ) from None
    found = _unsafe_part(name)
    if found is not None:
        raise InvalidIdentifierError(f"{what} {name!r} {found} {NOT_ALLOWED}")
    return name


def _unsafe_part(name: str) -> str | None:
    """What makes ``name`` unsafe as a file or key name, and where (its first such part);
    None when nothing does."""
    if name == ".":
        return "is '.', the name of the folder it would be in"
    found = [(i, UNSAFE_CHARACTERS[c]) for i, c in enumerate(name) if c in UNSAFE_CHARACTERS]
    if ".." in name:
        found.append((name.index(".."), "'..'"))
    if not found:
        return None
    index, part = min(found)
    return f"contains {part} at index {index}"


def agent_names(given: object, what: str, option: str) -> list[str]:
    """``given`` (a list or tuple of strings) as a list of agent names.

    Raises:
        ConfigurationError: anything else, ``what`` naming where it was given (a string
            alone: how to write it as the list, ``option=[...]``).
    """
    if isinstance(given, str) or not isinstance(given, list | tuple):
        raise ConfigurationError(
            f"{what} must be a list of agent names, got {given!r}"
            + (f" (write {option}=[{given!r}])" if isinstance(given, str) else "")
        )
    wrong = [name for name in given if not isinstance(name, str)]
    if wrong:
        raise ConfigurationError(f"{what} must be agent names (strings), got {wrong[0]!r}")
    return list(given)


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
