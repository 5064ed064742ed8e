"""What users read: the version, help, counts, tables, warnings and long values."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.cells import cell_len
from rich.console import Console

import nestegg
from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from nestegg.cli.render import MAX_CELL_WIDTH, Output, escaped
from nestegg.constants import EXIT_OK, EXIT_USAGE, HOME_ENV, STORE_ENV
from tests.cli.pipeline_app import POLICY
from tests.cli.test_subprocess import ROOT
from tests.cli.test_subprocess import nestegg as run_nestegg

COMMANDS = ("runs", "show", "checkpoints", "inspect", "diff", "events", "resume", "fork",
            "recover", "prune", "delete", "export", "import")  # fmt: skip
WIDE_ID = "データ処理-run"
LONG_ID = "a-very-long-run-id-" + "x" * 150


async def _store_runs(url: str, runs: dict[str, Any]) -> None:
    """One run per id, through two agents, each keeping its input."""
    store = open_store(url)
    clutch = Clutch("present", checkpoint=CheckpointConfig(storage=store, policy=POLICY))

    @clutch.agent()
    async def first(data: Any) -> Any:
        return data

    @clutch.agent()
    async def second(data: Any) -> Any:
        return {"before": data, "after": "changed"}

    for run_id, data in runs.items():
        await clutch.run(data, run_id=run_id)
    await store.close()


def test_version(tmp_path: Path) -> None:
    result = run_nestegg(tmp_path, "--version")
    assert (result.returncode, result.stdout) == (EXIT_OK, f"nestegg {nestegg.__version__}\n")


def test_nestegg_alone_prints_its_help_as_help_does_and_exits_2(tmp_path: Path) -> None:
    alone = run_nestegg(tmp_path)
    assert alone.returncode == EXIT_USAGE and alone.stdout == ""
    assert alone.stderr == run_nestegg(tmp_path, "--help").stdout  # lines kept, not one
    assert alone.stderr.startswith("Usage: nestegg [OPTIONS] COMMAND [ARGS]...\n")


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_values_not_types(tmp_path: Path, command: str) -> None:
    result = run_nestegg(tmp_path, command, "--help")
    assert result.returncode == EXIT_OK
    assert "<str>" not in result.stdout and "<int>" not in result.stdout
    assert "{" not in result.stdout.splitlines()[0]
    assert "--store URL" in result.stdout


def test_help_of_show_says_run_id(tmp_path: Path) -> None:
    usage = run_nestegg(tmp_path, "show", "--help").stdout
    assert usage.startswith("Usage: nestegg show [OPTIONS] RUN_ID\n")
    assert "\n  RUN_ID  The run id." in usage


def test_a_table_in_a_pipe_stays_aligned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {WIDE_ID: 1, LONG_ID: 2, "short": 3}))
    result = run_nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_OK, result.stderr
    lines = result.stdout.splitlines()
    words = ["STATUS", "completed", "completed", "completed"]
    status_at = {
        cell_len(line[: line.index(word)]) for line, word in zip(lines, words, strict=True)
    }
    assert len(status_at) == 1  # the STATUS column starts at the same cell on every line
    long_cell = next(line for line in lines if line.startswith("a-very-long"))
    assert long_cell.split("  ")[0].endswith("…")
    assert cell_len(long_cell.split("  ")[0]) <= MAX_CELL_WIDTH
    assert LONG_ID in run_nestegg(tmp_path, "runs", "--json", "--store", url).stdout


def test_a_table_on_a_terminal_stays_aligned() -> None:
    out = Output()
    buffer = io.StringIO()
    out.console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    out.terminal = True
    out.table(("RUN", "STATUS"), [[WIDE_ID, "completed"], [LONG_ID, "failed"], ["s", "failed"]])
    lines = [line for line in buffer.getvalue().splitlines() if line.strip()]
    rows = [line for line in lines if "completed" in line or "failed" in line]
    assert len({cell_len(line[: line.index(line.split()[-1])]) for line in rows}) == 1
    assert any("…" in line for line in rows)


def test_control_characters_in_a_table_cell_are_escaped_on_a_terminal_and_in_a_pipe(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cells = [["a\x1b[2Jb\nc\td\x9b", "ok"]]
    out = Output()
    buffer = io.StringIO()
    out.console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    out.terminal = True
    out.table(("ID", "STATUS"), cells)
    out.terminal = False
    out.table(("ID", "STATUS"), cells)
    for text in (buffer.getvalue(), capsys.readouterr().out):
        assert "a\\x1b[2Jb\\nc\\td\\x9b" in text
        assert not any(c in text for c in "\x1b\t\x9b")


def test_an_id_with_spaces_at_its_ends_is_quoted_in_a_table(tmp_path: Path) -> None:
    # ' space ' was shown as ' space', which a reader takes for 'space'
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {" space ": 1, "space": 2, "in between": 3}))
    result = run_nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_OK, result.stderr
    ids = sorted(line.split("  ")[0].rstrip() for line in result.stdout.splitlines()[1:])
    assert ids == ["' space '", "in between", "space"]
    out = Output()
    buffer = io.StringIO()
    out.console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    out.terminal = True
    out.table(("ID", "STATUS"), [["\u3000wide", "ok"], ["tab\t ", "ok"], ["plain", "ok"]])
    shown = buffer.getvalue()
    assert r"'\u3000wide'" in shown and r"'tab\t '" in shown
    assert " plain " in shown and "'plain'" not in shown


BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
UNSAFE = f"\x07\x1b\x7f\x9b{BIDI}"
"""What a stored name may hold that a terminal acts on: control and bidi characters."""


def test_bidi_characters_in_a_table_cell_are_escaped() -> None:
    out = Output()
    buffer = io.StringIO()
    out.console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    out.terminal = True
    out.table(("ID", "STATUS"), [["a\u202eb\u2066c", "ok"]])
    assert "a\\u202eb\\u2066c" in buffer.getvalue() and "\u202e" not in buffer.getvalue()
    assert escaped(BIDI) == "".join(f"\\u{ord(c):04x}" for c in BIDI)


async def _store_odd_run(url: str, run_id: str, name: str) -> None:
    store = open_store(url)
    clutch = Clutch(name, checkpoint=CheckpointConfig(storage=store, policy=POLICY))

    for agent_name in (name, f"{name}2"):  # two steps: two checkpoints, one to prune

        async def agent(data: Any) -> Any:
            return data

        agent.__name__ = agent_name
        clutch.agent()(agent)
    await clutch.run({"k": name}, run_id=run_id)
    await store.close()


def test_control_and_bidi_characters_of_stored_names_are_escaped_in_text(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    run_id, name = f"run{UNSAFE}id", f"odd\u202e{UNSAFE}name"
    asyncio.run(_store_odd_run(url, run_id, name))
    pruned = ("prune", "--keep", "1", "--dry-run")
    for command in (("runs",), ("show", run_id), ("events", run_id), pruned):
        result = run_nestegg(tmp_path, *command, "--store", url, PYTHONPATH=str(ROOT))
        assert result.returncode == EXIT_OK, (command, result.stderr)
        assert "\\u202e" in result.stdout, (command, result.stdout)
        assert not any(c in result.stdout + result.stderr for c in UNSAFE), (command, result)


C1 = "\x7f\x80\x85\x9b\x9f"


def _holds(value: Any, text: str) -> bool:
    """Whether ``text`` is a string somewhere in ``value`` (parsed JSON)."""
    if isinstance(value, dict):
        return any(_holds(v, text) for v in [*value, *value.values()])
    if isinstance(value, list):
        return any(_holds(v, text) for v in value)
    return value == text


def test_json_output_escapes_del_c1_and_bidi_characters_and_parses_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    run_id, name = f"run{C1}{BIDI}id", f"odd{C1}{BIDI}name"
    asyncio.run(_store_odd_run(url, run_id, name))
    commands = (
        ("runs", "--json"),
        ("show", run_id, "--json"),
        ("events", run_id, "--json"),
        ("inspect", run_id, "--json"),
        ("inspect", run_id),  # JSON for people, in a pipe
        ("export", run_id),
    )
    for command in commands:
        result = run_nestegg(tmp_path, *command, "--store", url, PYTHONPATH=str(ROOT))
        assert result.returncode == EXIT_OK, (command, result.stderr)
        assert not any(c in result.stdout for c in C1 + BIDI), (command, result.stdout)
        assert "\\u009b" in result.stdout and "\\u202e" in result.stdout, command
        lines = result.stdout.splitlines() if command[0] == "events" else [result.stdout]
        parsed = [json.loads(line) for line in lines]
        assert _holds(parsed, name) and (command[0] == "inspect" or _holds(parsed, run_id))


def test_json_for_people_on_a_terminal_stays_escaped() -> None:
    out = Output()
    buffer = io.StringIO()
    out.console = Console(file=buffer, force_terminal=True, width=100, color_system=None)
    out.terminal = True
    out.json({"k": f"a{C1}{BIDI}b"})
    text = buffer.getvalue()
    assert not any(c in text for c in C1 + BIDI) and json.loads(text) == {"k": f"a{C1}{BIDI}b"}


def _damage_checkpoints(path: Path, keep_oldest: bool) -> None:
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT checkpoint_id, body FROM checkpoints ORDER BY seq").fetchall()
    for checkpoint_id, body in rows[1:] if keep_oldest else rows:
        damaged = bytes(body).replace(b'"turn"', b'"tuRn"')
        conn.execute("UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?",
                     (damaged, checkpoint_id))  # fmt: skip
    conn.commit()
    conn.close()


@pytest.mark.parametrize("keep_oldest", [True, False])
def test_the_fallback_warning_is_printed_once(tmp_path: Path, keep_oldest: bool) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {"r": {"k": 1}}))
    _damage_checkpoints(tmp_path / "x.db", keep_oldest)
    result = run_nestegg(tmp_path, "inspect", "r", "--path", "seq", "--store", url)
    assert result.returncode == EXIT_OK, result.stderr
    warnings = result.stderr.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: skipping "), warnings
    if keep_oldest:
        assert "falling back to the older checkpoint" in warnings[0]
        assert result.stdout == "1\n"
    else:
        assert "there is no older checkpoint: falling back to the run's input" in warnings[0]
        assert result.stdout == "0\n"


BIG = 2_000_000


def test_inspect_and_diff_shorten_long_values(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {"big": "z" * BIG}))
    ids = [row["checkpoint_id"] for row in orjson.loads(
        run_nestegg(tmp_path, "checkpoints", "big", "--json", "--store", url).stdout)]  # fmt: skip
    inspected = run_nestegg(tmp_path, "inspect", "big", "--store", url)
    assert inspected.returncode == EXIT_OK, inspected.stderr
    assert len(inspected.stdout) < 10_000
    assert f"{BIG - 200:,} more characters; --full shows all" in inspected.stdout
    diffed = run_nestegg(tmp_path, "diff", ids[0], ids[-1], "--store", url)
    assert diffed.returncode == EXIT_OK, diffed.stderr
    assert len(diffed.stdout) < 10_000 and "more characters" in diffed.stdout
    full = run_nestegg(tmp_path, "inspect", "big", "--full", "--store", url)
    assert len(full.stdout) > BIG and "more characters" not in full.stdout
    full_diff = run_nestegg(tmp_path, "diff", ids[0], ids[-1], "--full", "--store", url)
    assert len(full_diff.stdout) > BIG
    as_json = run_nestegg(tmp_path, "inspect", "big", "--json", "--store", url)
    assert orjson.loads(as_json.stdout)["data"]["before"] == "z" * BIG  # JSON is whole


def _demo(tmp_path: Path) -> str:
    """Run ``make demo``'s script with its home in ``tmp_path``; its last line."""
    env = {**os.environ, HOME_ENV: str(tmp_path / "home")}
    env.pop(STORE_ENV, None)
    done = subprocess.run([sys.executable, "examples/demo.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return done.stdout.splitlines()[-1]


def test_the_demo_hint_names_the_venv_command_and_works(tmp_path: Path) -> None:
    hint = _demo(tmp_path)
    command = str(Path(sys.executable).parent.relative_to(ROOT) / "nestegg")
    assert hint.startswith(f"Try: {command} runs   |   {command} show demo-")
    for line in hint.removeprefix("Try: ").split("|"):
        args = line.split()
        assert args[0] == command
        result = run_nestegg(tmp_path, *args[1:])
        assert result.returncode == EXIT_OK, (line, result.stderr)


def test_the_readme_export_import_example_works(tmp_path: Path) -> None:
    run_id = _demo(tmp_path).split()[-1]
    readme = (ROOT / "README.md").read_text()
    lines = [line.split("#")[0].split() for line in readme.splitlines()
             if line.startswith(".venv/bin/nestegg export") or
             line.startswith(".venv/bin/nestegg import")]  # fmt: skip
    assert [args[1] for args in lines] == ["export", "import"]
    env = {**os.environ, HOME_ENV: str(tmp_path / "home")}
    env.pop(STORE_ENV, None)
    for args in lines:
        args = [run_id if arg == "RUN" else arg for arg in args[1:]]
        done = subprocess.run([sys.executable, "-m", "nestegg.cli", *args], cwd=tmp_path,
                              env={**env, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == EXIT_OK, (args, done.stderr)
    copy = run_nestegg(
        tmp_path, "show", run_id, "--json", "-s", f"sqlite:///{tmp_path / 'copy.db'}"
    )
    assert orjson.loads(copy.stdout)["run"]["status"] == "completed"


ODD = {"nan": math.nan, "inf": math.inf, "neg": -math.inf, "text": "NaN"}
"""Floats JSON has no number for, and a string that only looks like one."""
ODD_STRICT = {"nan": "NaN", "inf": "Infinity", "neg": "-Infinity", "text": "NaN"}
ODD_TEXT = '{"nan":NaN,"inf":Infinity,"neg":-Infinity,"text":"NaN"}'


def _is_odd(value: Any) -> bool:
    """Whether ``value`` is ODD read back by Python's json module (NaN is not NaN)."""
    return math.isnan(value["nan"]) and (value["inf"], value["neg"], value["text"]) == (
        math.inf,
        -math.inf,
        "NaN",
    )


def _reader(tmp_path: Path, url: str) -> Callable[..., str]:
    """What the command prints on the store at ``url`` (it must exit 0)."""

    def out(*args: str) -> str:
        done = run_nestegg(tmp_path, *args, "--store", url)
        assert done.returncode == EXIT_OK, done.stderr
        return done.stdout

    return out


def test_nan_and_infinities_are_shown_by_name_never_as_null(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {"odd": ODD}))
    out = _reader(tmp_path, url)

    shown = out("show", "odd")
    assert f"input:    {ODD_TEXT}\n" in shown
    assert f'result:   {{"before":{ODD_TEXT},"after":"changed"}}\n' in shown
    details = orjson.loads(out("show", "odd", "--json"))  # strict JSON: any parser reads it
    assert details["input"] == ODD_STRICT and details["result"]["before"] == ODD_STRICT
    assert _is_odd(json.loads(out("inspect", "odd"))["data"]["before"])
    assert out("inspect", "odd", "--path", "data.before.neg") == "-Infinity\n"
    assert orjson.loads(out("inspect", "odd", "--json"))["data"]["before"] == ODD_STRICT
    ids = [c["checkpoint_id"] for c in orjson.loads(out("checkpoints", "odd", "--json"))]
    assert f"+ data.before: {ODD_TEXT}\n" in out("diff", ids[0], ids[-1])
    added = orjson.loads(out("diff", ids[0], ids[-1], "--json"))["added"]
    assert {"path": "data.before", "value": ODD_STRICT} in added
    assert out("diff", ids[-1], ids[-1]) == "no differences\n"  # NaN is NaN here


MIXED = {1: "a", "1": "b", "n": {2: [3]}}
"""A dict with an int key and the same key as a string: both entries are stored."""
MIXED_JSON = {"$ne": "map", "v": [[1, "a"], ["1", "b"], ["n", {"$ne": "map", "v": [[2, [3]]]}]]}
MIXED_TEXT = '{"$ne":"map","v":[[1,"a"],["1","b"],["n",{"$ne":"map","v":[[2,[3]]]}]]}'


def test_a_dict_with_int_keys_is_shown_whole_its_int_keys_as_numbers(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {"mixed": MIXED, "plain": {"1": "b", "x": [1]}}))
    out = _reader(tmp_path, url)

    shown = out("show", "mixed")
    assert f"input:    {MIXED_TEXT}\n" in shown
    assert f'result:   {{"before":{MIXED_TEXT},"after":"changed"}}\n' in shown
    details = orjson.loads(out("show", "mixed", "--json"))
    assert details["input"] == MIXED_JSON and details["result"]["before"] == MIXED_JSON
    assert orjson.loads(out("inspect", "mixed", "--json"))["data"]["before"] == MIXED_JSON
    assert orjson.loads(out("inspect", "mixed"))["data"]["before"] == MIXED_JSON
    assert out("inspect", "mixed", "--path", "data.before[1]") == '"a"\n'
    assert out("inspect", "mixed", "--path", "data.before['1']") == '"b"\n'
    plain = orjson.loads(out("show", "plain", "--json"))  # string keys: plain JSON as before
    assert plain["input"] == {"1": "b", "x": [1]}
    assert 'input:    {"1":"b","x":[1]}\n' in out("show", "plain")

    exported = tmp_path / "mixed.json"
    out("export", "mixed", "-o", str(exported))
    imported = _reader(tmp_path, f"sqlite:///{tmp_path / 'copy.db'}")
    imported("import", str(exported))
    assert orjson.loads(imported("show", "mixed", "--json"))["input"] == MIXED_JSON
    assert f"input:    {MIXED_TEXT}\n" in imported("show", "mixed")


def test_diff_paths_tell_an_int_key_from_a_string_key() -> None:
    from nestegg.cli.diff import diff_values

    changes = diff_values({1: "a", "1": "b"}, {1: "x", "1": "y", 2: "z"})
    assert [(c.kind, c.path) for c in changes] == [
        ("changed", "[1]"),
        ("changed", "['1']"),
        ("added", "[2]"),
    ]
    changes = diff_values({1.5: "a", "1.5": "b", True: 1, None: 2}, {1.5: "x", "1.5": "y"})
    assert [(c.kind, c.path) for c in changes] == [
        ("changed", "[1.5]"),  # was ['1.5'] twice
        ("changed", "['1.5']"),
        ("removed", "[true]"),
        ("removed", "[null]"),
    ]


ODD_KEYS = {
    True: "t", None: "n", 1.5: "f", "1.5": "s", math.nan: "nan", -math.inf: "-inf", 2**70: "big",
    (1, 2): "tuple", "it's": "quote", "a\\b": "backslash", "true": "word",
}  # fmt: skip
"""A dict with a key of each kind the codec stores, and strings that look like them."""


def test_every_key_a_dict_can_have_has_a_path_that_selects_it_alone() -> None:
    from nestegg.cli.paths import format_path, select

    paths = {format_path(["data", key]): value for key, value in ODD_KEYS.items()}
    assert list(paths) == [
        "data[true]", "data[null]", "data[1.5]", "data['1.5']", "data[NaN]",
        "data[-Infinity]", f"data[{2**70}]", 'data[{"$ne":"tuple","v":[1,2]}]',
        """data["it's"]""", "data['a\\b']", "data.true",
    ]  # fmt: skip
    assert all(select({"data": ODD_KEYS}, path) == value for path, value in paths.items())


def test_inspect_path_selects_a_bool_none_or_float_key(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(_store_runs(url, {"odd": {True: "t", None: "n", 1.5: "f", "1.5": "s"}}))
    out = _reader(tmp_path, url)
    assert out("inspect", "odd", "--path", "data.before[true]") == '"t"\n'
    assert out("inspect", "odd", "--path", "data.before[null]") == '"n"\n'
    assert out("inspect", "odd", "--path", "data.before[1.5]") == '"f"\n'
    assert out("inspect", "odd", "--path", "data.before['1.5']") == '"s"\n'


def test_an_event_detail_names_nan_and_infinities() -> None:
    from nestegg.cli.events import _detail

    assert [_detail("x", v) for v in (math.nan, math.inf, -math.inf, 0.5)] == [
        "x=NaN", "x=Infinity", "x=-Infinity", "x=0.5",
    ]  # fmt: skip
