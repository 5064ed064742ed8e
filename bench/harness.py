"""Shared pieces of the benchmark scripts: the workload, timing, medians, tables.

Every script measures nestegg and its anchor in one process, interleaved repetition by
repetition (ours, anchor, anchor, ours, ...), and reports medians: the machine is shared
and noisy, so only numbers measured side by side are compared.
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import random
import signal
import statistics
import string
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

MESSAGE_BYTES = 1000
_TEXT = random.Random(20_240_601)
MESSAGE_CONTENTS = tuple(
    "".join(_TEXT.choices(string.ascii_letters + string.digits + " ", k=MESSAGE_BYTES))
    for _ in range(256)
)
"""The ~1 KB payloads the steps produce: random text, so that a store that compresses
(PostgreSQL's TOAST) is measured on data that does not shrink to nothing, as "x" * 1000 would."""

START_INPUT: dict[str, Any] = {"turn": 0, "content": ""}
"""What every run starts from; each step returns ``{"turn": turn + 1, "content": ...}``."""

LARGE_TIMEOUT = 1e9
"""eggai-clutch's ``run()`` times out after 30 s by default; the benchmarks pass this."""

PACKAGES = (
    "nestegg",
    "eggai-clutch",
    "eggai",
    "pydantic",
    "orjson",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "psycopg-pool",
    "redis",
)


def next_message(data: dict[str, Any]) -> dict[str, Any]:
    """The step of every workload: the next turn's ~1 KB message."""
    return message(data["turn"] + 1)


def message(turn: int) -> dict[str, Any]:
    """The ~1 KB message of one turn."""
    return {"turn": turn, "content": MESSAGE_CONTENTS[turn % len(MESSAGE_CONTENTS)]}


async def timed(run: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """Seconds one awaited call took (after a full garbage collection), and its result."""
    gc.collect()
    start = time.perf_counter()
    result = await run()
    return time.perf_counter() - start, result


def dump_tasks_on_sigusr1() -> None:
    """From now on, ``kill -USR1 <pid>`` prints every pending task's stack to stderr: to see
    where a benchmark that stopped moving waits."""
    loop = asyncio.get_running_loop()

    def dump() -> None:
        for task in asyncio.all_tasks(loop):
            task.print_stack(file=sys.stderr)

    loop.add_signal_handler(signal.SIGUSR1, dump)


def progress(message: str) -> None:
    """One line on stderr about what is being measured (the tables go to stdout)."""
    print(message, file=sys.stderr, flush=True)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def interleaved(names: Sequence[str], repetition: int) -> list[str]:
    """The order of the contenders in one repetition: reversed every other time."""
    return list(names) if repetition % 2 == 0 else list(reversed(names))


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def fmt_int(value: float) -> str:
    return f"{value:,.0f}"


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f}"


def fmt_ratio(value: float) -> str:
    return f"{value:,.1f}x"


def fmt_bytes(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:,.2f} MB"
    return f"{value / 1e3:,.1f} kB"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


@dataclass
class Table:
    """One result table, printed as markdown."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.headers) + " |")
        lines.append("|" + "|".join("---:" if i else "---" for i in range(len(self.headers))) + "|")
        lines.extend("| " + " | ".join(row) + " |" for row in self.rows)
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        return "\n".join(lines) + "\n"


def machine_markdown() -> str:
    """The machine and the package versions, as a markdown list."""
    versions = []
    for name in PACKAGES:
        try:
            versions.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    import sqlite3

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    lines = [
        f"- CPUs: {os.cpu_count()} (nproc), {platform.machine()}, {memory:.0f} GiB memory, "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()} ({sys.implementation.name}), "
        f"SQLite {sqlite3.sqlite_version}",
        "- Packages: " + ", ".join(versions),
    ]
    return "\n".join(lines) + "\n"


def print_tables(tables: Sequence[Table]) -> None:
    for table in tables:
        print(table.markdown(), flush=True)
