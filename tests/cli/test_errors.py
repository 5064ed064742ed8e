"""Errors: one line on stderr, a distinct exit code, a traceback only with --debug."""

from __future__ import annotations

import asyncio
import importlib
import sqlite3
import sys
from pathlib import Path

import orjson
import pytest

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from nestegg.constants import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_UNAVAILABLE, EXIT_USAGE
from nestegg.errors import CheckpointFallbackWarning
from tests.cli.conftest import Cli, Filled, json_of
from tests.cli.pipeline_app import POLICY, build

UNREACHABLE_SQLITE = "sqlite:////proc/no-such-dir/n.db"


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "--bogus"],
        ["runs", "--limit", "zero"],
        ["runs", "--limit", "0"],
        ["runs", "--status", "done"],
        ["show"],
        ["nope"],
        ["runs", "--store", "bogus://x"],
        ["runs", "--store", "sqlite://host/x.db"],
        ["runs", "--store", "redis://127.0.0.1:6379/abc"],  # redis-py would read db 0
        ["runs", "--store", "redis://127.0.0.1:6379/99"],  # a database the server lacks
        ["events", "r", "--poll-interval", "0"],
        ["events", "r", "--since", str(2**64)],  # past a store's 64-bit integers
        ["runs", "--limit", str(2**64)],
        ["resume", "r"],
    ],
)
def test_bad_usage_exits_2_with_one_line(cli: Cli, args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # nan was "Input should be greater than or equal to 0.01"; inf, 1e3 and other
        # scripts' digits were taken
        (["events", "r", "-f", "--poll-interval", "nan"], "'nan' is not a number of seconds"),
        (["events", "r", "-f", "--poll-interval", "inf"], "'inf' is not a number of seconds"),
        (["events", "r", "-f", "--poll-interval", "\u0661"], "'\u0661' is not a number of"),
        (["events", "r", "-f", "--poll-interval", "0.001"], "0.001 is less than 0.01 seconds"),
        (["events", "r", "-f", "--poll-interval", "-1"], "-1 is less than 0.01 seconds"),
        (["worker", "x:y", "--grace", "nan"], "'nan' is not a number of seconds"),
        (["worker", "x:y", "--grace", "-1"], "-1 is less than 0 seconds"),
        (["worker", "x:y", "--grace", "9" * 12], "999999999999 seconds is more than 100 years"),
    ],
)
def test_seconds_given_to_an_option_are_digits_in_range(
    cli: Cli, args: list[str], message: str
) -> None:
    result = cli(*args)
    assert (result.exit_code, result.stdout) == (EXIT_USAGE, "")
    option = args[-2]
    assert result.stderr.startswith(f"error: Invalid value for '{option}': {message}")
    assert len(result.stderr.splitlines()) == 1


def test_usage_error_names_the_help(cli: Cli) -> None:
    result = cli("runs", "--bogus")
    assert result.stderr == "error: No such option: --bogus (see 'nestegg runs --help')\n"


def test_an_unknown_status_names_every_status_each_command_takes(cli: Cli) -> None:
    listed = cli("runs", "--status", "bogus")
    assert listed.stderr == (
        "error: unknown status 'bogus'; one of running, completed, failed, cancelled, waiting, "
        "interrupted, queued\n"
    )
    pruned = cli("prune", "--keep", "1", "--status", "interrupted")  # not a status prune takes
    assert pruned.stderr == (
        "error: unknown status 'interrupted'; one of running, completed, failed, cancelled, "
        "waiting\n"
    )
    assert (listed.exit_code, pruned.exit_code) == (EXIT_USAGE, EXIT_USAGE)


def test_not_found_exits_3(cli: Cli, filled: Filled) -> None:
    for args in (["show", "x"], ["inspect", "x"], ["diff", "x", "y"], ["delete", "x", "--yes"],
                 ["export", "x"], ["checkpoints", "x"], ["events", "x", "--follow"]):  # fmt: skip
        result = cli(*args, "--store", filled.url)
        assert result.exit_code == EXIT_NOT_FOUND, (args, result.output)
        assert len(result.stderr.splitlines()) == 1


def test_with_json_a_failure_is_also_a_json_object_on_stdout(cli: Cli, filled: Filled) -> None:
    missing = cli("show", "x", "--json", "--store", filled.url)
    assert missing.exit_code == EXIT_NOT_FOUND
    assert missing.stderr == "error: no run 'x' in the store\n"
    assert orjson.loads(missing.stdout) == {
        "error": "no run 'x' in the store",
        "exit_code": EXIT_NOT_FOUND,
        "type": "RunNotFoundError",
    }
    usage = cli("runs", "--status", "bogus", "--json", "--store", filled.url)
    assert usage.exit_code == EXIT_USAGE
    assert orjson.loads(usage.stdout)["error"] == usage.stderr.removeprefix("error: ").strip()
    assert cli("show", "x", "--store", filled.url).stdout == ""  # without --json: nothing
    # --json as another option's value, or given to a command that has none: no JSON
    named = cli("runs", "--pipeline", "--json", "--status", "bogus", "--store", filled.url)
    assert (named.exit_code, named.stdout) == (EXIT_USAGE, "")
    unknown = cli("delete", "x", "--json", "--store", filled.url)
    assert (unknown.exit_code, unknown.stdout) == (EXIT_USAGE, "")


@pytest.mark.parametrize(
    "url",
    [UNREACHABLE_SQLITE, "file:///proc/no-such-dir/store", "redis://127.0.0.1:1/0"],
)
def test_unreachable_store_exits_4(cli: Cli, filled: Filled, url: str) -> None:
    # import is a command that writes (creates the store): the store cannot be made there
    document = cli("export", filled.ok, "--store", filled.url).stdout
    result = cli("import", "-", "--store", url, input=document)
    assert result.exit_code == EXIT_UNAVAILABLE, result.output
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback(cli: Cli, filled: Filled) -> None:
    document = cli("export", filled.ok, "--store", filled.url).stdout
    result = cli("--debug", "import", "-", "--store", UNREACHABLE_SQLITE, input=document)
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("error: cannot open")


def test_global_and_command_store(cli: Cli, filled: Filled, local_url: str) -> None:
    assert len(json_of(cli("--store", filled.url, "runs", "--json"))) == 3
    # the command's --store wins over the global one and over NESTEGG_STORE
    both = cli("--store", UNREACHABLE_SQLITE, "runs", "--store", filled.url, "--json")
    assert len(json_of(both)) == 3
    assert len(json_of(cli("runs", "-s", filled.url, "--json", NESTEGG_STORE=local_url))) == 3


def _one_run(url: str, run_id: str, name: str) -> None:
    """A completed run of the test pipeline in the store at ``url``."""

    async def run() -> None:
        store = open_store(url)
        await build("cli-test", CheckpointConfig(storage=store, policy=POLICY)).run(
            {"name": name}, run_id=run_id
        )
        await store.close()

    asyncio.run(run())


def test_a_damaged_checkpoint_is_reported_not_a_traceback(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "dmg.db"
    url = f"sqlite:///{path}"
    _one_run(url, "dmg", "D")
    with sqlite3.connect(path) as conn:
        checkpoint_id, body = conn.execute(
            "SELECT checkpoint_id, body FROM checkpoints WHERE run_id = 'dmg' ORDER BY seq DESC"
        ).fetchone()
        damaged = bytes(body).replace(b'"turn":3', b'"turn":4')
        conn.execute("UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?",
                     (damaged, checkpoint_id))  # fmt: skip
    listed = json_of(cli("checkpoints", "dmg", "--store", url, "--json"))
    assert [r["valid"] for r in listed] == [True, True, False]
    result = cli("inspect", checkpoint_id, "--store", url)
    assert result.exit_code == EXIT_FAILED
    assert result.stderr == (
        f"error: checkpoint {checkpoint_id!r} of run 'dmg' failed its checksum (torn or altered)\n"
    )
    with pytest.warns(CheckpointFallbackWarning):
        fallback = json_of(cli("inspect", "dmg", "--store", url, "--path", "seq"))
    assert fallback == 2  # the newest valid checkpoint


def test_a_step_body_altered_into_text_is_damaged_as_for_a_checksum(
    cli: Cli, tmp_path: Path
) -> None:
    # sqlite3 "UPDATE steps SET body = replace(body, ...)" leaves TEXT where a BLOB was
    url = f"sqlite:///{tmp_path / 'txt.db'}"
    _one_run(url, "txt", "HELLO")
    with sqlite3.connect(tmp_path / "txt.db") as conn:
        conn.execute(
            "UPDATE steps SET body = replace(body, 'HELLO', 'HACKD') WHERE agent = 'enrich'"
        )
        assert conn.execute("SELECT typeof(body) FROM steps WHERE agent = 'enrich'").fetchone() == (
            "text",
        )
    damaged = "error: step 2 of run 'txt' failed its checksum (torn or altered)\n"
    listed = json_of(cli("checkpoints", "txt", "--store", url, "--json"))
    assert [r["valid"] for r in listed] == [True, False, False]
    first, _, last = (r["checkpoint_id"] for r in listed)
    for args in (["inspect", last], ["diff", first, last]):
        result = cli(*args, "--store", url)
        assert (result.exit_code, result.stderr) == (EXIT_FAILED, damaged), args
    shown = json_of(cli("show", "txt", "--store", url, "--json"))
    assert [step["outcome"] for step in shown["steps"]] == ["completed", "damaged", "completed"]
    exported = cli("export", "txt", "-o", str(tmp_path / "txt.json"), "--store", url)
    assert exported.exit_code == 0, exported.stderr  # as stored, as for a checksum failure
    imported = cli("import", str(tmp_path / "txt.json"), "--store", f"{url}.copy")
    in_file = damaged.replace("error: ", f"error: {tmp_path / 'txt.json'}: ")  # the file's
    assert (imported.exit_code, imported.stderr) == (EXIT_FAILED, in_file)


def test_import_nestegg_does_not_import_typer_or_rich() -> None:
    code = (
        "import sys, nestegg, nestegg.checkpoint; "
        "print(sorted(m for m in ('typer', 'rich', 'nestegg.cli') if m in sys.modules))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert importlib.import_module("nestegg.cli").main is not None


def test_a_run_input_altered_into_text_is_damaged_as_for_a_checksum(
    cli: Cli, tmp_path: Path
) -> None:
    # the runs table's sealed values too: a TEXT input gave "TypeError: a bytes-like object"
    url = f"sqlite:///{tmp_path / 'txt.db'}"
    _one_run(url, "txt", "HELLO")
    with sqlite3.connect(tmp_path / "txt.db") as conn:
        conn.execute("UPDATE runs SET input = replace(input, 'HELLO', 'HACKD')")
        assert conn.execute("SELECT typeof(input) FROM runs").fetchone() == ("text",)
    shown = cli("show", "txt", "--store", url)
    assert "TypeError" not in shown.stderr + shown.stdout
    assert "checksum" in shown.stderr + shown.stdout
