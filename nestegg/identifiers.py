"""Identifiers: what a run id, a pipeline, an agent, a checkpoint id or a stored key may be.

Kept apart from :mod:`nestegg.agents` (which imports pydantic) and :mod:`nestegg.pipeline`
(the orchestrator), so that what checks an id or a pipeline filter, such as the command
line reading one, imports nothing else.
"""

from __future__ import annotations

from nestegg.constants import MAX_NAME_LENGTH
from nestegg.errors import ConfigurationError, InvalidIdentifierError

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


def unstorable_character(text: str) -> str | None:
    """What in ``text`` no store can keep in a thread id or a row key, and where: its first
    NUL (PostgreSQL's text has none) or lone surrogate (not UTF-8, as every store but the
    memory one writes keys); None when every store keeps it. Other control characters are
    kept (the command prints them escaped)."""
    for index, char in enumerate(text):
        if char == "\0":
            return f"a NUL character (U+0000) at index {index}"
        if "\ud800" <= char <= "\udfff":
            return f"a lone surrogate (U+{ord(char):04X}) at index {index}, which is not text"
    return None


def check_pipeline_name(name: object) -> None:
    """Refuse a pipeline name no store can keep with its runs: not a string, or holding a
    NUL or a lone surrogate. Any other name is kept (``/``, ``..`` and line breaks name no
    file; broker channels escape what they must), so no pipeline with stored runs is shut
    out of them.

    Raises:
        InvalidIdentifierError: naming the name and what is wrong.
    """
    if not isinstance(name, str):
        raise InvalidIdentifierError(f"pipeline name must be a string, got {name!r}")
    if (problem := unstorable_character(name)) is not None:
        raise InvalidIdentifierError(
            f"pipeline name {name!r} holds {problem}: no store can keep it with the runs"
        )


def check_pipeline_filter(pipeline: str | None) -> str | None:
    """``pipeline``, a name to list runs by (None: every pipeline), if a pipeline can have
    it (:func:`check_pipeline_name`): the rule of ``nestegg runs --pipeline``, ``nestegg
    prune --pipeline`` and the web inspector's filter.

    Raises:
        InvalidIdentifierError: naming the name and what is wrong (a NUL, bytes that are
            not UTF-8).
    """
    if pipeline is not None:
        check_pipeline_name(pipeline)
    return pipeline
