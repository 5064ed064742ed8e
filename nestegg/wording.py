"""Words the library and the command share: counts that agree with their nouns."""

from __future__ import annotations

STEPS = ("step", "steps")


def counted(count: int, noun: tuple[str, str]) -> str:
    """``1 run``, ``2 runs``: the count with the noun's singular or plural."""
    return f"{count} {noun[0] if count == 1 else noun[1]}"


__all__ = ["STEPS", "counted"]
