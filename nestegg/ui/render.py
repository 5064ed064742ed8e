"""Turning data into what the templates show: JSON trees, shortened values, times."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from nestegg.checkpoint.codec import TAG, to_jsonable
from nestegg.cli.diff import Change, types_told
from nestegg.cli.paths import Key, format_path, set_items
from nestegg.cli.render import dump_json, escaped_lines, key_json, seconds, to_json, when
from nestegg.cli.runs import canceller_text, owner_text

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"
SHORT_CHARS = 160
"""A value longer than this (as JSON) is shortened, with a button showing all of it."""
TREE_ITEMS = 200
"""Items of an object or array shown in a tree; the rest through a link to that path."""
TREE_OPEN_DEPTH = 2
"""Levels of a tree shown open."""
UNKNOWN = "\N{EM DASH}"
"""What a duration that is not known shows (a damaged step, a call journaled before call
durations were recorded)."""


class Exact(str):
    """Text a form sends back (an input's value, a choice in a list): written as it is,
    HTML-escaped, not as :func:`shown`."""

    __slots__ = ()


def shown(value: Any) -> Any:
    """What a ``{{ ... }}`` writes, before HTML escaping: a string with its control and
    bidi characters (U+202E) as the command prints them (``\\u202e``), its newlines
    kept, so stored text cannot reorder or hide what the page shows; markup the templates
    made, and :class:`Exact` text, as they are."""
    if isinstance(value, str) and not isinstance(value, Markup | Exact):
        return escaped_lines(value)
    return value


def json_text(value: Any) -> str:
    """``value`` as compact JSON."""
    return to_json(value, indent=False)


def stored_json(value: Any) -> str:
    """``value`` as indented JSON in the codec's form, what the fork editor shows: a
    type JSON has no word for tagged as the codec stores it (``{"$ne": "map", ...}``, a
    datetime, a NaN), and a dict of one's own with a ``"$ne"`` key too, so that the fork
    endpoint, which rebuilds it as the codec does, gets back what was shown, exactly."""
    return dump_json(to_jsonable(value), indent=True)


def shortened(value: Any) -> dict[str, Any]:
    """A value's JSON text and, when it is long, its first characters."""
    text = json_text(value)
    short = text[:SHORT_CHARS] + "…" if len(text) > SHORT_CHARS else None
    return {"text": text, "short": short, "chars": len(text)}


def types_of(change: Change) -> tuple[str, str] | None:
    """A changed value's types before and after, when its two JSON texts read the same
    (a datetime that became its ISO string: see :func:`types_told`), as ``diff`` prints."""
    return types_told(change.old, change.new, json_text(change.old), json_text(change.new))


def tree(
    value: Any, keys: list[Key] | None = None, key: Key | None = None, label: str | None = None
) -> dict[str, Any]:
    """A value as nested nodes for the collapsible tree (a node knows its path; ``label``
    is how its key shows, when not as itself). The keys of a dict whose keys are not all
    strings show as JSON, ``1`` and ``"1"``, every entry kept, as the commands show such
    a dict (``{"$ne": "map", ...}``), each with a path of its own that selects it
    (``d[1]``, ``d['1']``, ``d[true]``: see :func:`format_path`); so do those of a dict of
    one's own with a ``"$ne"`` key, which the commands show so too. A set's items are in
    the order of :func:`set_items`, which their paths (``s[0]``) index."""
    keys = keys or []
    node: dict[str, Any] = {
        "key": key if label is None else label,
        "path": format_path(keys),
        "depth": len(keys),
    }
    items: list[tuple[Key, Any, str | None]]
    if isinstance(value, dict) and TAG not in value and all(isinstance(k, str) for k in value):
        node["type"], items = "object", [(str(k), v, None) for k, v in value.items()]
    elif isinstance(value, dict):
        node["type"], items = "object", [(k, v, key_json(k)) for k, v in value.items()]
    elif isinstance(value, list | tuple | set | frozenset):
        ordered = set_items(value) if isinstance(value, set | frozenset) else value
        node["type"], items = "array", [(i, v, None) for i, v in enumerate(ordered)]
    else:
        return {**node, "type": "scalar", **shortened(value)}
    node["size"] = len(items)
    node["more"] = max(0, len(items) - TREE_ITEMS)
    node["children"] = [tree(v, [*keys, k], k, shown) for k, v, shown in items[:TREE_ITEMS]]
    return node


def environment() -> Environment:
    """The templates, escaping everything they render, for HTML and as :func:`shown`."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=shown,
    )
    env.filters.update(
        when=when,
        seconds=lambda v: UNKNOWN if v is None else seconds(v),
        owner=owner_text,
        canceller=canceller_text,
        short=shortened,
        types=types_of,
        tree=tree,
        json=json_text,
        stored_json=stored_json,
        q=lambda v: quote(str(v), safe=""),
        exact=Exact,
    )
    env.globals.update(TREE_OPEN_DEPTH=TREE_OPEN_DEPTH)
    return env
