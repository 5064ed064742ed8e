"""Output: rich tables and highlighted JSON on a terminal, plain text in a pipe, or JSON.

JSON output holds plain JSON types only: datetimes become ISO 8601 strings, Decimal and
big integers strings, bytes base64, sets and tuples lists, non-string keys strings.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import sys
import uuid
from collections.abc import Sequence
from decimal import Decimal
from enum import Enum
from typing import Any

import orjson
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nestegg.constants import COMPLETED, FAILED, RUNNING

_INT_LIMIT = 2**63
MIN_COLUMN_WIDTH = 4
STATUS_STYLES = {COMPLETED: "green", FAILED: "red", RUNNING: "cyan", "interrupted": "yellow"}


def _plain_scalar(value: Any) -> Any:
    if isinstance(value, Enum):
        return plain(value.value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if hasattr(value, "model_dump"):
        return plain(value.model_dump())
    return repr(value)


def plain(value: Any) -> Any:
    """``value`` as plain JSON types (for printing)."""
    if value is None or isinstance(value, str | bool | float):
        return value
    if isinstance(value, int) and not isinstance(value, Enum):
        return value if -_INT_LIMIT <= value < _INT_LIMIT else str(value)
    if isinstance(value, dict):
        return {str(k) if not isinstance(k, str) else k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    return _plain_scalar(value)


def to_json(value: Any, *, indent: bool = True) -> str:
    """``value`` as a JSON document."""
    option = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(plain(value), option=option).decode()


def when(value: dt.datetime | None) -> str:
    """A time for people: local, to the second."""
    if value is None:
        return "-"
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    """A duration for people."""
    if value is None:
        return "-"
    if value < 0.001:
        return f"{value * 1_000_000:.0f}µs"
    if value < 1:
        return f"{value * 1000:.0f}ms"
    if value < 120:
        return f"{value:.1f}s"
    return f"{value / 60:.1f}m"


def fit_widths(widths: Sequence[int], whole: Sequence[int], available: int) -> list[int]:
    """Column widths within ``available``: the ``whole`` columns keep theirs, the others
    share the rest (narrow ones first, so what they leave goes to the wide ones)."""
    fitted = list(widths)
    left = available - sum(widths[i] for i in whole)
    others = sorted((i for i in range(len(widths)) if i not in whole), key=lambda i: widths[i])
    for position, index in enumerate(others):
        share = max(MIN_COLUMN_WIDTH, left // (len(others) - position))
        fitted[index] = min(widths[index], share)
        left -= fitted[index]
    return fitted


class Output:
    """Where a command writes: JSON, a terminal (rich) or a pipe (plain text)."""

    def __init__(self, as_json: bool = False) -> None:
        self.as_json = as_json
        self.console = Console(highlight=False)
        self.errors = Console(stderr=True, highlight=False)
        self.terminal = self.console.is_terminal

    def json(self, value: Any, *, indent: bool = True) -> None:
        """Write ``value`` as JSON (highlighted on a terminal unless --json)."""
        text = to_json(value, indent=indent)
        if self.terminal and not self.as_json and indent:
            self.console.print_json(text)
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def line(self, text: str = "") -> None:
        """Write one line of text (no markup)."""
        if self.terminal:
            self.console.print(text, markup=False, soft_wrap=True)
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def note(self, text: str) -> None:
        """A remark on stderr (progress, warnings), kept out of stdout."""
        self.errors.print(text, markup=False, soft_wrap=True)

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        status_column: int | None = None,
        title: str | None = None,
        whole: Sequence[int] = (0,),
    ) -> None:
        """A table: rich on a terminal (fits its width: the ``whole`` columns are never cut,
        the others end in an ellipsis), aligned plain text otherwise."""
        if not self.terminal:
            self._plain_table(columns, rows, title)
            return
        table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", header_style="bold")
        widths = [
            max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(columns)
        ]
        available = self.console.width - 3 * len(columns) - 1
        for name, width in zip(columns, fit_widths(widths, whole, available), strict=True):
            table.add_column(name, overflow="ellipsis", no_wrap=True, width=width)
        for row in rows:
            cells = [Text(cell) for cell in row]
            if status_column is not None:
                cells[status_column].stylize(STATUS_STYLES.get(row[status_column], ""))
            table.add_row(*cells)
        self.console.print(table)

    def _plain_table(
        self, columns: Sequence[str], rows: Sequence[Sequence[str]], title: str | None
    ) -> None:
        widths = [len(c) for c in columns]
        for row in rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
        lines = [title] if title else []
        for row in [list(columns), *rows]:
            cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True)]
            lines.append("  ".join(cells).rstrip())
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def pairs(self, items: Sequence[tuple[str, str]]) -> None:
        """``name: value`` lines, names aligned (on a terminal, long values are cut to fit)."""
        width = max((len(name) for name, _ in items), default=0)
        room = max(MIN_COLUMN_WIDTH, self.console.width - width - 2)
        for name, value in items:
            if self.terminal and len(value) > room:  # a terminal gets one line per item
                value = value[: room - 1] + "…"
            self.line(f"{name + ':':<{width + 1}} {value}")
