"""Checks of the options a caller passes: a flag that is a bool (``"no"`` would be true),
a count that is an int (``True`` would be 1)."""

from __future__ import annotations

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
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        takes = "a positive integer or None" if or_none else "a positive integer"
        raise ConfigurationError(
            f"{where} takes {option}= {takes}, got {option}={given!r}"
            + (" (a bool, not a number)" if isinstance(given, bool) else "")
        )
    return given


__all__ = ["check_count", "check_flag"]
