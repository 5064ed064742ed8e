"""Output: rich tables and highlighted JSON on a terminal, plain text in a pipe, or JSON.

Every command writes stored values through this module. JSON output holds plain JSON
types only: datetimes become ISO 8601 strings, Decimal and big integers strings, bytes
base64, sets and tuples lists, and a float that is NaN or infinite the string ``"NaN"``,
``"Infinity"`` or ``"-Infinity"`` (JSON has no number for them; ``float()`` reads these
back). A dict whose keys are not all strings becomes ``{"$ne": "map", "v": [[key, value],
...]}``, as the codec stores it: every entry is kept (``{1: "a", "1": "b"}`` has two) and
an int key stays a number; so does a dict of one's own with a ``"$ne"`` key, as the codec
escapes it, so that what is shown, given back (``fork --data``), is that dict and not a
tag. A tuple or frozenset key is tagged as the codec stores it (``{"$ne": "tuple", "v": [1,
2]}``), which reads back as a key, where a list would not, and so is a key of a type JSON
has no value for (``{"$ne": "datetime", "v": "2024-01-02T00:00:00"}``), which reads back
as that key, where its plain value would be another. A set's items are in the
order of :func:`~nestegg.cli.paths.set_items`, the same in every process, which a
path's index follows (a frozenset key's too). What this writes, read again, is written
the same. Text for people writes
those floats bare, as Python's json module does: ``NaN``, ``Infinity``, ``-Infinity``;
never ``null``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import math
import re
import sys
import uuid
from collections.abc import Callable, Sequence
from decimal import Decimal
from enum import Enum
from typing import Any

import orjson
from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.table import Table
from rich.text import Text

from nestegg.checkpoint.codec import TAG, KeptEnum, to_jsonable
from nestegg.checkpoint.iso_times import iso_text
from nestegg.cli import json_output
from nestegg.cli.escapes import FORMAT_CHARS
from nestegg.cli.escapes import escaped as escaped
from nestegg.cli.escapes import escaped_lines as escaped_lines
from nestegg.cli.paths import format_path, set_items
from nestegg.constants import (
    CLI_VALUE_CHARS,
    CLI_VALUE_ITEMS,
    COMPLETED,
    DAMAGED,
    FAILED,
    MISSING,
    RUNNING,
)
from nestegg.errors import CheckpointSerializationError
from nestegg.wording import STEPS as STEPS
from nestegg.wording import counted as counted

_INT_LIMIT = 2**63
MIN_COLUMN_WIDTH = 4
MAX_CELL_WIDTH = 60
"""Terminal cells a table cell takes at most (a longer one, say a very long run id, ends
in an ellipsis; --json has it whole)."""
STATUS_STYLES = {
    COMPLETED: "green",
    FAILED: "red",
    RUNNING: "cyan",
    "interrupted": "yellow",
    DAMAGED: "red",
    MISSING: "red",
}


_UNSAFE_IN_JSON = re.compile(f"[\x7f-\x9f{FORMAT_CHARS}]")
"""What a terminal acts on that JSON text may hold raw (orjson escapes C0)."""


def table_cell(text: str) -> str:
    """A table cell: ``text`` :func:`escaped`, or written as Python writes a string
    (``' space '``) when it begins or ends with a space, which a table would not show (so
    an id ``' space '`` is not taken for ``space``)."""
    shown = escaped(text)
    return repr(text) if shown != shown.strip() else shown


def clip(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells (wide characters count two), ending
    in an ellipsis when cut."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, max(0, width - 1)).rstrip() + "…"


def pad(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` terminal cells."""
    return text + " " * max(0, width - cell_len(text))


def _non_finite_name(value: float) -> str:
    """How a float that is no finite number is written: ``NaN``, ``Infinity``, ``-Infinity``."""
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _bare(value: float) -> orjson.Fragment:
    return orjson.Fragment(_non_finite_name(value).encode())


_NonFinite = Callable[[float], Any]
"""What a NaN or an infinity becomes in a plain value."""


def _plain_scalar(value: Any, non_finite: _NonFinite) -> Any:
    if isinstance(value, Enum):
        return _plain(value.value, non_finite)
    if isinstance(value, KeptEnum):
        return _plain(value.rebuilt_value(), non_finite)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return iso_text(value)
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, uuid.UUID | Decimal):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value), non_finite)
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump(), non_finite)
    return repr(value)


class _Tagged(dict[str, Any]):
    """A dict :func:`_plain` wrote as the codec tags it (``{"$ne": "map", "v": ...}``):
    plain already, so written as it is again (where a dict of one's own with a ``"$ne"``
    key is escaped)."""

    __slots__ = ()


def _plain(value: Any, non_finite: _NonFinite) -> Any:
    if type(value) is _Tagged:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else non_finite(value)
    if value is None or isinstance(value, str | bool | orjson.Fragment):
        return value
    if isinstance(value, int) and not isinstance(value, Enum):
        return value if -_INT_LIMIT <= value < _INT_LIMIT else str(value)
    if isinstance(value, dict):
        if TAG not in value and all(isinstance(k, str) for k in value):
            return {k: _plain(v, non_finite) for k, v in value.items()}
        entries = [[_plain_key(k, non_finite), _plain(v, non_finite)] for k, v in value.items()]
        return _Tagged({TAG: "map", "v": entries})
    if isinstance(value, set | frozenset):
        return [_plain(v, non_finite) for v in set_items(value)]
    if isinstance(value, list | tuple):
        return [_plain(v, non_finite) for v in value]
    return _plain_scalar(value, non_finite)


def _plain_key(key: Any, non_finite: _NonFinite) -> Any:
    """A dict's key as :func:`_plain` writes it: a tuple or a frozenset tagged as the codec
    stores it (a frozenset's items in the order of :func:`set_items`), so that it reads
    back as a key (``fork --data``), where a list would not; so is any other key JSON has
    no value for (a datetime, a UUID, a Decimal, bytes, an Enum, an int past 64 bits, NaN),
    which as its plain value would read back as another key (a datetime's ISO string);
    a string, a number, a bool or None as a value."""
    if type(key) is frozenset:
        items: Sequence[Any] = set_items(key)
    elif type(key) is tuple:
        items = key
    else:
        try:
            tagged = to_jsonable(key)
        except CheckpointSerializationError:  # no key the codec stores: shown as a value
            return _plain(key, non_finite)
        return _Tagged(tagged) if type(tagged) is dict else _plain(key, non_finite)
    shown = [_plain_key(item, non_finite) for item in items]
    return _Tagged({TAG: type(key).__name__, "v": shown})


def key_json(key: Any) -> str:
    """A dict's key as JSON for people, as :func:`to_json` writes it in the dict's entries
    (``1``, ``"1"``, ``{"$ne":"frozenset","v":["x","y"]}``)."""
    return dump_json(_plain_key(key, _bare), indent=False)


def plain(value: Any) -> Any:
    """``value`` as plain JSON types, as ``--json`` writes it (NaN and the infinities as
    the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``)."""
    return _plain(value, _non_finite_name)


def readable(value: Any) -> Any:
    """``value`` as plain JSON types for people: NaN and the infinities stay numbers,
    which :func:`to_json` writes bare (``NaN``, ``Infinity``, ``-Infinity``)."""
    return _plain(value, _bare)


_CUT_KEY = "…"
_CUT = "; --full shows all"
_CUT_STRING = re.compile(rf"… \([\d,]+ more characters{re.escape(_CUT)}\)\Z")
_CUT_ITEM = re.compile(rf"… \([\d,]+ more items{re.escape(_CUT)}\)\Z")
_CUT_KEYS = re.compile(rf"[\d,]+ more keys{re.escape(_CUT)}\Z")
"""The end of a string :func:`shorten` cut, the item it puts last where it cut a list,
and the value of the key it puts last where it cut a dict."""


def shorten(value: Any, chars: int = CLI_VALUE_CHARS, items: int = CLI_VALUE_ITEMS) -> Any:
    """``value`` (plain JSON types) with long strings, lists and dicts cut, each cut saying
    how much it left out: what ``inspect`` and ``diff`` show unless ``--full``."""
    if isinstance(value, str) and len(value) > chars:
        return f"{value[:chars]}… ({len(value) - chars:,} more characters{_CUT})"
    if isinstance(value, list):
        kept = [shorten(v, chars, items) for v in value[:items]]
        if len(value) > items:
            kept.append(f"… ({len(value) - items:,} more items{_CUT})")
        return kept
    if isinstance(value, dict):
        shown = {k: shorten(v, chars, items) for k, v in list(value.items())[:items]}
        if len(value) > items:
            shown[_CUT_KEY] = f"{len(value) - items:,} more keys{_CUT}"
        return _Tagged(shown) if type(value) is _Tagged else shown
    return value


def _cut_string(given: str) -> bool:
    """Whether ``given`` is a string :func:`shorten` cut: CLI_VALUE_CHARS characters, then
    what it left out."""
    found = _CUT_STRING.search(given)
    return found is not None and found.start() == CLI_VALUE_CHARS


def cut_at(given: Any, keys: tuple[Any, ...] = ("data",)) -> str | None:
    """The path in ``given`` (JSON someone gave, at ``keys``) of a value :func:`shorten`
    cut, as it cuts: a string of CLI_VALUE_CHARS characters and what it left out, the
    last item of a list of CLI_VALUE_ITEMS + 1 that says what a cut left out
    (``data.items[100]``), or the last key of a dict of as many, ``"…"``, whose value says
    so; None if it holds none. A string of one's own that merely ends so is no cut."""
    if isinstance(given, str):
        return format_path(list(keys)) if _cut_string(given) else None
    if isinstance(given, dict):
        inner: list[tuple[Any, Any]] = list(given.items())
        mark = _CUT_KEYS
    elif isinstance(given, list):
        inner, mark = list(enumerate(given)), _CUT_ITEM
    else:
        return None
    if len(inner) == CLI_VALUE_ITEMS + 1:
        key, item = inner[-1]
        if (type(key) is int or key == _CUT_KEY) and isinstance(item, str) and mark.match(item):
            return format_path([*keys, key])
    return next((at for at in (cut_at(v, (*keys, k)) for k, v in inner) if at), None)


def dump_json(value: Any, *, indent: bool = True) -> str:
    """``value`` (plain JSON types) as JSON text safe on a terminal: DEL, the C1 controls
    and the bidi controls, which orjson writes raw, as ``\\u`` escapes (``\\u009b``,
    ``\\u202e``), which parse back to the same string; the one writer of the command's JSON."""
    option = orjson.OPT_INDENT_2 if indent else 0
    text = orjson.dumps(value, option=option).decode()
    return _UNSAFE_IN_JSON.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def to_json(value: Any, *, indent: bool = True, strict: bool = False) -> str:
    """``value`` as JSON text for people, NaN and the infinities bare as Python's json
    module writes them (``{"x": NaN}``); ``strict``: a JSON document any parser reads, as
    ``--json`` writes it, with them as strings (``{"x": "NaN"}``). Both as
    :func:`dump_json` writes them."""
    return dump_json(plain(value) if strict else readable(value), indent=indent)


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
        """Write ``value`` as JSON: strict with --json, else for people (highlighted on a
        terminal)."""
        self.json_text(to_json(value, indent=indent, strict=self.as_json), indent=indent)

    def json_text(self, text: str, *, indent: bool = True) -> None:
        """Write JSON ``text`` (:func:`dump_json`'s) as :meth:`json` writes it."""
        json_output.state.written = True
        if self.terminal and not self.as_json and indent:
            # highlighted as print_json does, without its parsing again, which unescapes
            self.console.print(JSONHighlighter()(text), soft_wrap=True)
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def line(self, text: str = "") -> None:
        """Write one line of text (no markup), escaped."""
        text = escaped(text)
        if self.terminal:
            self.console.print(text, markup=False, soft_wrap=True)
        else:
            sys.stdout.write(text + "\n")
            sys.stdout.flush()

    def note(self, text: str) -> None:
        """A remark on stderr (progress, warnings), kept out of stdout; escaped."""
        self.errors.print(escaped(text), markup=False, soft_wrap=True)

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        status_column: int | None = None,
        title: str | None = None,
        whole: Sequence[int] = (0,),
        sentences: Sequence[int] = (),
    ) -> None:
        """A table: rich on a terminal (fits its width: the ``whole`` columns are never cut,
        the others end in an ellipsis), aligned plain text otherwise, where a cell longer
        than ``MAX_CELL_WIDTH`` ends in an ellipsis too unless it is in one of the
        ``sentences`` columns (messages, which a pipe gets whole)."""
        rows = [[table_cell(text) for text in row] for row in rows]
        if not self.terminal:
            self._plain_table(columns, rows, title, sentences)
            return
        table = Table(box=box.SIMPLE_HEAD, title=title, title_justify="left", header_style="bold")
        rows = [[clip(cell, MAX_CELL_WIDTH) for cell in row] for row in rows]
        widths = [
            max([cell_len(name), *(cell_len(row[i]) for row in rows)])
            for i, name in enumerate(columns)
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
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        title: str | None,
        sentences: Sequence[int],
    ) -> None:
        rows = [
            [cell if i in sentences else clip(cell, MAX_CELL_WIDTH) for i, cell in enumerate(row)]
            for row in rows
        ]
        widths = [cell_len(c) for c in columns]
        for row in rows:
            widths = [max(w, cell_len(cell)) for w, cell in zip(widths, row, strict=True)]
        lines = [title] if title else []
        for row in [list(columns), *rows]:
            cells = [pad(cell, width) for cell, width in zip(row, widths, strict=True)]
            lines.append("  ".join(cells).rstrip())
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()

    def pairs(self, items: Sequence[tuple[str, str | list[str]]]) -> None:
        """``name: value`` lines, names aligned (on a terminal, long values are cut to fit).
        A value given as lines (an error whose message has several, as pydantic's) shows
        its first beside the name and the others under it, indented to the values."""
        width = max((len(name) for name, _ in items), default=0)
        room = max(MIN_COLUMN_WIDTH, self.console.width - width - 2)
        for name, value in items:
            for index, line in enumerate([value] if isinstance(value, str) else value):
                shown = escaped(line)
                if self.terminal:  # a terminal gets one line per line of a value
                    shown = clip(shown, room)
                label = f"{name}:" if index == 0 else ""
                self.line(f"{label:<{width + 1}} {shown}")
