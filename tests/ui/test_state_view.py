"""How a state is shown: long values cut with a way to see them, big lists cut with a link
to that part, and a tree that opens two levels deep."""

from __future__ import annotations

import asyncio
import datetime as dt
import html
import math
import re
from enum import Enum
from typing import Any

import pytest

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.cli.paths import select
from nestegg.ui import UISettings
from nestegg.ui.render import SHORT_CHARS, TREE_ITEMS, shortened, tree
from tests.ui.conftest import client_for

LONG = "x" * 500


def test_shortened_keeps_short_values_and_cuts_long_ones() -> None:
    assert shortened({"a": 1}) == {"text": '{"a":1}', "short": None, "chars": 7}
    cut = shortened(LONG)
    assert cut["text"] == f'"{LONG}"' and cut["chars"] == 502
    assert cut["short"] == f'"{LONG}'[:SHORT_CHARS] + "…"


def test_a_tree_knows_each_nodes_path_and_cuts_big_containers() -> None:
    root = tree({"items": list(range(TREE_ITEMS + 5)), "deep": {"a": [{"b": 1}]}})
    items, deep = root["children"]
    assert (items["path"], items["size"], items["more"]) == ("items", TREE_ITEMS + 5, 5)
    assert len(items["children"]) == TREE_ITEMS
    leaf = deep["children"][0]["children"][0]["children"][0]
    assert (leaf["path"], leaf["text"], leaf["depth"]) == ("deep.a[0].b", "1", 4)


def test_nan_and_infinities_show_by_name_in_a_tree() -> None:
    root = tree({"odd": [math.nan, math.inf, -math.inf], "text": "NaN"})
    odd, text = root["children"]
    assert [leaf["text"] for leaf in odd["children"]] == ["NaN", "Infinity", "-Infinity"]
    assert text["text"] == '"NaN"'  # a string stays one
    assert shortened({"x": math.nan})["text"] == '{"x":NaN}'


MIXED = {1: "a", "1": "b"}
MIXED_TEXT = '{"$ne":"map","v":[[1,"a"],["1","b"]]}'


def test_a_tree_shows_every_key_of_a_dict_with_int_keys_as_json() -> None:
    root = tree({"d": MIXED, "n": {(1, 2): None, "k": 3}})
    mixed, other = root["children"]
    assert [(c["key"], c["path"], c["text"]) for c in mixed["children"]] == [
        ("1", "d[1]", '"a"'),
        ('"1"', "d['1']", '"b"'),
    ]
    tagged = '{"$ne":"tuple","v":[1,2]}'  # as the value shows it: a list is no key
    assert mixed["size"] == 2 and [c["key"] for c in other["children"]] == [tagged, '"k"']
    assert [c["path"] for c in other["children"]] == [f"n[{tagged}]", "n.k"]


def test_a_frozenset_key_shows_tagged_with_its_items_in_set_order() -> None:
    value = {"f": {frozenset({"b", "c", "a"}): 1}}
    [key] = tree(value)["children"][0]["children"]
    frozen = '{"$ne":"frozenset","v":["a","b","c"]}'
    assert (key["key"], key["path"]) == (frozen, f"f[{frozen}]")
    assert shortened(value)["text"] == f'{{"f":{{"$ne":"map","v":[[{frozen},1]]}}}}'
    assert select(value, key["path"]) == 1


def test_a_datetime_key_shows_tagged_as_its_path_names_it() -> None:
    value = {"d": {dt.date(2024, 1, 2): 1, "2024-01-02": 2}}
    date, text = tree(value)["children"][0]["children"]
    tagged = '{"$ne":"date","v":"2024-01-02"}'  # was "2024-01-02", the string key's
    assert (date["key"], date["path"], text["key"]) == (tagged, f"d[{tagged}]", '"2024-01-02"')
    entries = f'[[{tagged},1],["2024-01-02",2]]'
    assert shortened(value)["text"] == f'{{"d":{{"$ne":"map","v":{entries}}}}}'
    assert select(value, date["path"]) == 1


def test_a_tree_gives_bool_none_and_float_keys_paths_that_select_them() -> None:
    odd = {True: "t", None: "n", 1.5: "f", "1.5": "s"}
    children = tree({"d": odd})["children"][0]["children"]
    assert [(c["key"], c["path"]) for c in children] == [
        ("true", "d[true]"),  # were d.true, d.null and d['1.5'] twice, selecting none
        ("null", "d[null]"),
        ("1.5", "d[1.5]"),
        ('"1.5"', "d['1.5']"),
    ]
    assert [select({"d": odd}, c["path"]) for c in children] == ["t", "n", "f", "s"]


OWN = {"$ne": "tuple", "v": [1, 2]}
"""A dict of one's own that looks like a tag: shown as the codec escapes it."""
OWN_TEXT = '{"$ne":"map","v":[["$ne","tuple"],["v",[1,2]]]}'


def test_a_dict_of_ones_own_with_a_tag_key_shows_as_it_reads_back() -> None:
    assert shortened(OWN)["text"] == OWN_TEXT
    [own] = tree({"own": OWN})["children"]
    assert [(c["key"], c["path"]) for c in own["children"]] == [
        ('"$ne"', "own['$ne']"),
        ('"v"', "own.v"),
    ]


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("children", []) for n in _nodes(child))]


def test_every_path_a_tree_gives_an_item_of_a_set_selects_it() -> None:
    value = {"tags": {"b", "a", "c"}, "pairs": {("b", (2,)), ("a", (1,))}}
    nodes = _nodes(tree(value))[1:]
    assert [n["path"] for n in nodes[:4]] == ["tags", "tags[0]", "tags[1]", "tags[2]"]
    assert [n["text"] for n in nodes[1:4]] == ['"a"', '"b"', '"c"']
    assert all(tree(select(value, n["path"]))["type"] == n["type"] for n in nodes)
    leaves = [n for n in nodes if n["type"] == "scalar"]
    assert all(shortened(select(value, n["path"]))["text"] == n["text"] for n in leaves)
    assert select(value, "pairs[1][1][0]") == 2


def test_a_run_and_its_checkpoint_show_both_entries_of_int_and_string_keys() -> None:
    store = MemoryCheckpointStorage()
    clutch = Clutch("mixed", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def keep(data: dict[Any, str]) -> dict[Any, str]:
        return data

    asyncio.run(clutch.run(MIXED, run_id="mixed"))
    with client_for(UISettings(store=store)) as client:
        run_page = client.get("/runs/mixed").text
        checkpoint = re.findall(r'class="cp" href="/checkpoints/([^"]+)"', run_page)[-1]
        page = client.get(f"/checkpoints/{checkpoint}", params={"path": "data"}).text
        by_int = client.get(f"/checkpoints/{checkpoint}", params={"path": "data[1]"}).text
        by_str = client.get(f"/checkpoints/{checkpoint}", params={"path": "data['1']"}).text
    shown = f'<code class="val">{MIXED_TEXT}</code>'
    assert html.unescape(run_page).count(shown) == 2  # input and result
    leaves = [html.unescape(m) for m in re.findall(r'<div class="leaf">(.*?)</div>', page)]
    keys = ['<span class="key">1</span>: <code class="val">"a"</code>',
            '<span class="key">"1"</span>: <code class="val">"b"</code>']  # fmt: skip
    assert leaves == keys
    assert '<code class="val">&#34;a&#34;</code>' in by_int
    assert '<code class="val">&#34;b&#34;</code>' in by_str


def test_a_checkpoint_page_cuts_long_values_and_links_the_rest() -> None:
    store = MemoryCheckpointStorage()
    clutch = Clutch("big", strategy=Strategy.SEQUENTIAL, checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def grow(data: dict[str, Any]) -> dict[str, Any]:
        return {"long": LONG, "many": list(range(TREE_ITEMS + 50))}

    asyncio.run(clutch.run({}, run_id="big"))
    with client_for(UISettings(store=store)) as client:
        run_page = client.get("/runs/big").text
        checkpoint = re.findall(r'class="cp" href="/checkpoints/([^"]+)"', run_page)[-1]
        page = client.get(f"/checkpoints/{checkpoint}").text
        part = client.get(f"/checkpoints/{checkpoint}", params={"path": "data.many"}).text
    assert "show all (502 chars)" in page and f'data-full="&#34;{LONG}&#34;"' in page
    assert "… 50 more" in page
    assert f'href="/checkpoints/{checkpoint}?path=data.many"' in page
    assert part.count('<div class="leaf">') == TREE_ITEMS and "part <code>data.many</code>" in part


def _position(page: str) -> str:
    """The line under a checkpoint's title: its step, turn and next agent, as text."""
    match = re.search(r"<p[^>]*>(after step .*?)</p>", page, re.S)
    assert match, page
    return html.unescape(re.sub(r"<[^>]+>|\s+·.*", "", match.group(1), flags=re.S)).strip()


def test_a_checkpoint_page_says_which_agent_is_next_and_when_none_is() -> None:
    store = MemoryCheckpointStorage()
    config = CheckpointConfig(storage=store, policy=CheckpointPolicy(keep_latest=None))
    clutch = Clutch("next", strategy=Strategy.SEQUENTIAL, checkpoint=config)
    taken: list[str] = []

    @clutch.agent()
    async def first(data: list[str]) -> list[str]:
        return [*data, "first"]

    @clutch.agent()
    async def second(data: list[str]) -> list[str]:
        taken.append(await clutch.checkpoint())  # before its step: it continues with second
        return [*data, "second"]

    asyncio.run(clutch.run([], run_id="next"))
    with client_for(UISettings(store=store)) as client:
        run_page = client.get("/runs/next").text
        after_first, *_, final = re.findall(r'class="cp" href="/checkpoints/([^"]+)"', run_page)
        shown = (*taken, after_first, final)
        lines = [_position(client.get(f"/checkpoints/{c}").text) for c in shown]
    assert lines == [
        "after step 1, turn 1; next agent: second",  # the agent under way when it was taken
        "after step 1, turn 1; next agent: second",  # the position's: a resume runs it
        "after step 2, turn 2; next agent: none, the run ended after this step",
    ]


def test_a_selector_checkpoint_page_says_the_selector_chooses() -> None:
    store = MemoryCheckpointStorage()
    config = CheckpointConfig(storage=store)
    clutch = Clutch("choose", strategy=Strategy.SELECTOR, checkpoint=config)
    picks = iter(["fine", "broken"])

    @clutch.agent()
    async def fine(data: int) -> int:
        return data + 1

    @clutch.agent()
    async def broken(data: int) -> int:
        raise RuntimeError("broken")

    @clutch.selector
    async def pick(data: int) -> str | None:
        return next(picks)

    with pytest.raises(RuntimeError):
        asyncio.run(clutch.run(0, run_id="choose"))
    with client_for(UISettings(store=store)) as client:
        run_page = client.get("/runs/choose").text
        (after_fine,) = re.findall(r'class="cp" href="/checkpoints/([^"]+)"', run_page)
        line = _position(client.get(f"/checkpoints/{after_fine}").text)
    assert line == "after step 1, turn 1; next agent: chosen by the selector"


class Color(Enum):
    RED = 2


def test_the_diff_page_names_the_types_of_a_change_that_shows_the_same_text() -> None:
    store = MemoryCheckpointStorage()
    clutch = Clutch("typed", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def keep(data: list[Any]) -> list[Any]:
        return data

    asyncio.run(clutch.run([dt.date(2024, 1, 2), Color.RED, 1], run_id="typed"))
    asyncio.run(clutch.run(["2024-01-02", 2, 2], run_id="text"))
    with client_for(UISettings(store=store)) as client:
        old, new = (
            re.findall(r'class="cp" href="/checkpoints/([^"]+)"', client.get(f"/runs/{r}").text)[-1]
            for r in ("typed", "text")
        )
        page = client.get("/diff", params={"old": old, "new": new}).text
    rows = [
        re.sub(r"<[^>]+>|\s+", " ", html.unescape(row)).split()
        for row in re.findall(r'<tr class="changed">(.*?)</tr>', page, re.S)
    ]
    assert [row for row in rows if row[1].startswith("data")] == [
        ["~", "data[0]", '"2024-01-02"', "(date)", "→", '"2024-01-02"', "(str)"],
        ["~", "data[1]", "2", "(Color)", "→", "2", "(int)"],  # was 2 → 2
        ["~", "data[2]", "1", "→", "2"],
    ]
