"""``nestegg diff`` and the web inspector's diff tell an enum from its plain value from
what is stored, whether or not the enum's module imports where they run."""

from __future__ import annotations

import html
import re
from pathlib import Path

import orjson
import pytest

from nestegg.ui import UISettings
from tests.cli.test_shown_forms import APP_MODULE, TONE, Store
from tests.ui.conftest import client_for

RUNS = {
    "enum": {"tone": TONE.LOW, "same": TONE.LOW, "keys": {TONE.LOW: 1}},
    "again": {"tone": TONE.LOW, "same": TONE.LOW, "keys": {TONE.LOW: 1}},
    "plain": {"tone": "low", "same": TONE.LOW, "keys": {TONE.LOW: 1}},
}
"""Runs whose data holds an enum of the app's module, or its plain value."""


def _store(folder: Path, importable: bool) -> Store:
    store = Store(folder, RUNS)
    if not importable:  # the commands run in the folder: its module is gone from there
        (folder / f"{APP_MODULE}.py").rename(folder / "app_source.txt")
    return store


@pytest.mark.parametrize("importable", [True, False], ids=["importable", "not-importable"])
def test_diff_tells_an_enum_from_its_plain_value(tmp_path: Path, importable: bool) -> None:
    store = _store(tmp_path, importable)
    changed = '~ tone: "low" (Tone) -> "low" (str)'
    assert store.out("diff", "enum", "plain", "--path", "data").splitlines() == [changed]
    whole = store.out("diff", "enum", "plain", "--path", "data.tone").splitlines()
    assert whole == ['~ (state): "low" (Tone) -> "low" (str)']
    report = orjson.loads(store.out("diff", "enum", "plain", "--path", "data", "--json"))
    assert report["changed"] == [
        {"path": "tone", "old": "low", "new": "low", "old_type": "Tone", "new_type": "str"}
    ]
    assert report["added"] == report["removed"] == []
    same = store.out("diff", "enum", "again", "--path", "data")
    assert same.splitlines() == ["no differences"]  # one enum both sides


def test_the_inspectors_diff_tells_an_enum_of_a_module_not_imported(tmp_path: Path) -> None:
    store = _store(tmp_path, importable=False)  # nor here: kept_app is not on the path
    with client_for(UISettings(store_url=store.url)) as client:
        pages = [client.get("/diff", params={"old": "enum", "new": new}).text for new in RUNS]
    rows = [
        re.sub(r"<[^>]+>|\s+", " ", html.unescape(row)).split()
        for row in re.findall(r'<tr class="changed">(.*?)</tr>', pages[2], re.S)
    ]
    assert [row for row in rows if row[1].startswith("data")] == [
        ["~", "data.tone", '"low"', "(Tone)", "→", '"low"', "(str)"]
    ]
    assert 'id="no-diff"' in pages[1]  # one enum both sides
