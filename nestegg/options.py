"""Checks of the options a caller passes: a flag that is a bool (``"no"`` would be true),
a count that is an int (``True`` would be 1, ``2.0`` is a float)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeGuard

from nestegg.errors import ConfigurationError


def check_flag(given: object, option: str, where: str) -> bool:
    """``given`` if it is True or False.

    Raises:
        ConfigurationError: anything else, naming ``where``, ``option`` and the value.
    """
    if not isinstance(given, bool):  # "no" would be true
        raise ConfigurationError(
            f"{where} takes {option}=True or {option}=False, got {option}={given!r}"
        )
    return given


def check_count(given: object, option: str, where: str, *, or_none: bool = False) -> int:
    """``given`` if it is an int of at least 1 (a bool is not one).

    ``or_none``: the caller takes None too (checked before), which the refusal says.

    Raises:
        ConfigurationError: anything else, naming ``where``, ``option`` and the value.
    """
    if not is_count(given):
        takes = "a positive integer or None" if or_none else "a positive integer"
        raise ConfigurationError(f"{where} takes {option}= {takes}, got {option}={shown(given)}")
    return given


def is_count(given: object, least: int = 1) -> TypeGuard[int]:
    """Whether ``given`` is an int of at least ``least``; a bool is not one (``True``
    would be 1)."""
    return isinstance(given, int) and not isinstance(given, bool) and given >= least


def shown(given: object, written: Callable[[object], str] = repr) -> str:
    """``given`` as a refusal of a count names it: ``written`` (its repr; a request's
    JSON body: as JSON writes it), and of a bool or a float, what it is
    (``True (a bool, not a number)``, ``1e+29 (a float, not an integer)``)."""
    if isinstance(given, bool):
        return f"{written(given)} (a bool, not a number)"
    if isinstance(given, float):
        return f"{written(given)} (a float, not an integer)"
    return written(given)


__all__ = ["check_count", "check_flag", "is_count", "shown"]
