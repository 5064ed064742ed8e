"""Words the library and the command share: counts that agree with their nouns."""

from __future__ import annotations

STEPS = ("step", "steps")
RUNS = ("run", "runs")
CHECKPOINTS = ("checkpoint", "checkpoints")
EVENTS = ("event", "events")
JOURNAL_ENTRIES = ("journal entry", "journal entries")
THREADS = ("thread", "threads")
ROWS = ("row", "rows")
LANGGRAPH_THREADS = ("LangGraph thread", "LangGraph threads")


def counted(count: int, noun: tuple[str, str]) -> str:
    """``1 run``, ``2 runs``: the count with the noun's singular or plural."""
    return f"{count} {noun[0] if count == 1 else noun[1]}"


def numbers_text(numbers: list[int]) -> str:
    """``3``, ``3 to 5``, ``1, 3 to 5 and 8``: sorted whole numbers, runs of them joined."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    parts = [str(low) if low == high else f"{low} to {high}" for low, high in spans]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


__all__ = [
    "CHECKPOINTS",
    "EVENTS",
    "JOURNAL_ENTRIES",
    "LANGGRAPH_THREADS",
    "ROWS",
    "RUNS",
    "STEPS",
    "THREADS",
    "counted",
    "numbers_text",
]
