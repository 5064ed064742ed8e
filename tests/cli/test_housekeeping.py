"""prune, delete, export and import: confirmation, dry runs and exact round trips."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import orjson
import pytest

from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy, MemoryCheckpointStorage
from nestegg.checkpoint.records import CheckpointRecord
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.cli.app import CommandError
from nestegg.cli.housekeeping import parse_duration, plan_prune
from nestegg.cli.reading import list_run_rows
from nestegg.cli.transfer import export_run, import_run
from nestegg.constants import COMPLETED, EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE
from nestegg.testing.builders import commit_steps, create
from tests.cli.conftest import (
    Cli,
    Filled,
    damage_newest_event_batch,
    delete_runs,
    fill,
    json_of,
    store_url_for,
    tear,
)
from tests.cli.pipeline_app import POLICY, build
from tests.cli.test_subprocess import nestegg


def _ids(cli: Cli, url: str) -> set[str]:
    return {row["run_id"] for row in json_of(cli("runs", "--store", url, "--json"))}


def _checkpoints(cli: Cli, url: str, run_id: str) -> list[int]:
    return [r["seq"] for r in json_of(cli("checkpoints", run_id, "--store", url, "--json"))]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("15m", 900), ("12h", 43200), ("7d", 604800), ("2w", 1209600),
     ("1d12h", 129600), ("1.5h", 5400), (" 7 D ", 604800)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text",
    ["", "7", "d", "7y", "-1d", "1d x", "7dd", "1s1s", "1d2d", "12h1d", "\u0661s", "1d\u0662h",
     "\uff11s", "1.\u0665h"],
)  # fmt: skip
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(CommandError, match="bad duration") as caught:
        parse_duration(text)
    assert caught.value.exit_code == EXIT_USAGE


@pytest.mark.parametrize("older_than", ["1s1s", "\u0661s"])
def test_prune_refuses_a_unit_twice_and_digits_other_than_ascii(
    cli: Cli, filled: Filled, older_than: str
) -> None:
    # both were taken: 1s1s as 2s, an Arabic-Indic one as 1s (a regex's \d and float() read it)
    refused = cli("prune", "--older-than", older_than, "--yes", "-s", filled.url)
    assert (refused.exit_code, refused.stdout) == (EXIT_USAGE, "")
    assert refused.stderr == (
        f"error: bad duration {older_than!r}: use a number (digits 0-9) and a unit s, m, h, "
        "d or w, or a sum of such, each unit once, the largest first (e.g. 7d, 1.5h, 1d12h)\n"
    )
    assert _ids(cli, filled.url) == {filled.ok, filled.bad, filled.gone}


@pytest.mark.parametrize("text", ["1000000000d", "99999999999d", "142857143w", "9" * 400 + "s"])
def test_parse_duration_refuses_more_than_the_longest(text: str) -> None:
    assert parse_duration("999999999d") == timedelta(days=999_999_999)
    with pytest.raises(CommandError) as caught:
        parse_duration(text)
    assert str(caught.value) == f"bad duration {text!r}: the longest taken is 999999999d"
    assert caught.value.exit_code == EXIT_USAGE


def test_prune_keep_dry_run_then_yes(cli: Cli, filled: Filled) -> None:
    url = filled.url
    dry = cli("prune", "--keep", "1", "--dry-run", "--store", url)
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        f"2 checkpoints of run {filled.ok} (keeping the newest 1)",
        "dry run: would delete 0 runs and 2 checkpoints; nothing was changed",
    ]
    assert _checkpoints(cli, url, filled.ok) == [1, 2, 3]
    done = cli("prune", "--keep", "1", "--yes", "--store", url)
    assert done.stdout.splitlines()[-1] == "deleted 0 runs and 2 checkpoints"
    assert _checkpoints(cli, url, filled.ok) == [3]
    # history stays: the run still shows every step, and it still inspects
    assert len(json_of(cli("show", filled.ok, "--store", url, "--json"))["steps"]) == 3
    assert json_of(cli("inspect", filled.ok, "--store", url, "--path", "turn")) == 3
    assert cli("prune", "--keep", "1", "--yes", "--store", url).stdout == "nothing to prune\n"


def test_prune_asks_and_a_no_changes_nothing(cli: Cli, filled: Filled) -> None:
    for answer in ("n\n", ""):  # a no, and stdin's end (no answer), said alike
        declined = cli("prune", "--keep", "1", "--store", filled.url, input=answer)
        assert declined.exit_code == EXIT_FAILED, answer
        assert declined.stderr.endswith("error: nothing was changed (not confirmed)\n")
        assert _checkpoints(cli, filled.url, filled.ok) == [1, 2, 3]
    accepted = cli("prune", "--keep", "2", "--store", filled.url, input="y\n")
    assert accepted.exit_code == 0, accepted.stderr
    assert _checkpoints(cli, filled.url, filled.ok) == [2, 3]


def test_prune_older_than_by_status(cli: Cli, filled: Filled) -> None:
    url = filled.url
    assert cli("prune", "--older-than", "1h", "--yes", "-s", url).stdout == "nothing to prune\n"
    time.sleep(0.05)
    only_failed = cli("prune", "--older-than", "0s", "--status", "failed", "--yes", "-s", url)
    assert only_failed.exit_code == 0, only_failed.stderr
    assert only_failed.stdout.splitlines()[-1] == "deleted 1 run and 0 checkpoints"
    assert _ids(cli, url) == {filled.ok, filled.gone}
    finished = cli("prune", "--older-than", "0s", "--dry-run", "-s", url)
    assert finished.stdout.splitlines()[0].startswith(f"run {filled.ok} (cli-test, completed")
    assert _ids(cli, url) == {filled.ok, filled.gone}
    cli("prune", "--older-than", "0s", "--yes", "-s", url)
    assert _ids(cli, url) == {filled.gone}  # running runs only with --status running
    cli("prune", "--older-than", "0s", "--status", "running", "--yes", "-s", url)
    assert _ids(cli, url) == set()


def test_prune_never_touches_a_run_a_live_process_executes(cli: Cli, local_url: str) -> None:
    store = open_store(local_url)

    async def live() -> None:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))

        @clutch.agent()
        async def hold(data: dict) -> dict:
            result = await asyncio.to_thread(
                cli, "prune", "--older-than", "0s", "--status", "running", "--keep", "1",
                "--yes", "-s", local_url,
            )  # fmt: skip
            assert result.stdout == "nothing to prune\n", result.stdout
            deleting = await asyncio.to_thread(cli, "delete", "live", "--yes", "-s", local_url)
            assert deleting.exit_code == EXIT_FAILED
            assert "is executing" in deleting.stderr
            return data

        await clutch.run({"name": "Live"}, run_id="live", timeout=30)
        await store.close()

    asyncio.run(live())


def test_prune_usage(cli: Cli, filled: Filled) -> None:
    nothing = cli("prune", "--store", filled.url)
    assert nothing.exit_code == EXIT_USAGE
    assert nothing.stderr == "error: prune needs --keep N and/or --older-than DURATION\n"
    assert cli("prune", "--older-than", "soon", "-s", filled.url).exit_code == EXIT_USAGE
    assert cli("prune", "--keep", "0", "-s", filled.url).exit_code == EXIT_USAGE


def test_prune_names_a_bad_status_before_asking_for_keep_or_older_than(
    cli: Cli, filled: Filled
) -> None:
    bad = cli("prune", "--status", "bogus", "--dry-run", "-s", filled.url)
    assert (bad.exit_code, bad.stdout) == (EXIT_USAGE, "")
    assert bad.stderr.startswith("error: unknown status 'bogus'"), bad.stderr
    assert "--keep" not in bad.stderr


def test_prune_of_a_pipeline_without_runs_says_so(cli: Cli, filled: Filled) -> None:
    url = filled.url
    none = cli("prune", "--older-than", "1s", "--pipeline", "nosuch", "--dry-run", "-s", url)
    assert (none.exit_code, none.stdout) == (0, "no runs of pipeline 'nosuch'\n")
    kept = cli("prune", "--older-than", "1h", "--pipeline", "cli-test", "--dry-run", "-s", url)
    assert kept.stdout == "nothing to prune\n"  # it has runs, none to prune
    args = ("prune", "--older-than", "0s", "--status", "cancelled", "--pipeline", "cli-test")
    assert cli(*args, "--dry-run", "-s", url).stdout == "nothing to prune\n"  # none cancelled


@pytest.mark.parametrize("older_than", ["1000000000d", "99999999999d"])
def test_prune_older_than_the_longest_duration_is_bad_usage(
    cli: Cli, filled: Filled, tmp_path: Path, older_than: str
) -> None:
    for dry_run in (["--dry-run"], ["--yes"]):
        refused = nestegg(tmp_path, "prune", "--older-than", older_than, *dry_run, "-s", filled.url)
        assert refused.returncode == EXIT_USAGE, refused.stderr
        assert refused.stdout == ""
        assert refused.stderr == (
            f"error: bad duration '{older_than}': the longest taken is 999999999d\n"
        )
    assert _ids(cli, filled.url) == {filled.ok, filled.bad, filled.gone}
    assert _checkpoints(cli, filled.url, filled.ok) == [1, 2, 3]
    assert cli("prune", "--keep", "1", "--status", "odd", "-s", filled.url).exit_code == EXIT_USAGE


def test_delete(cli: Cli, filled: Filled) -> None:
    url = filled.url
    dry = cli("delete", filled.bad, "--dry-run", "--store", url)
    assert dry.stdout == (
        f"dry run: would delete run {filled.bad} (cli-test, failed, 1 step, 1 checkpoint); "
        "nothing was changed\n"
    )
    for answer in ("n\n", ""):  # a no, and stdin's end (no answer), said alike
        declined = cli("delete", filled.bad, "--store", url, input=answer)
        assert declined.exit_code == EXIT_FAILED and filled.bad in _ids(cli, url)
        assert declined.stderr.endswith("error: nothing was changed (not confirmed)\n")
    done = cli("delete", filled.bad, "--store", url, input="y\n")
    assert done.exit_code == 0 and filled.bad not in _ids(cli, url)
    assert cli("events", filled.bad, "--store", url).exit_code == EXIT_NOT_FOUND
    again = cli("delete", filled.bad, "--yes", "--store", url)
    assert again.exit_code == EXIT_NOT_FOUND


def test_export_import_round_trip_across_stores(
    cli: Cli, filled_any: Filled, tmp_path: Path
) -> None:
    target = f"sqlite:///{tmp_path / 'target.db'}"
    for run_id in (filled_any.ok, filled_any.bad, filled_any.gone):
        exported = cli("export", run_id, "--store", filled_any.url)
        assert exported.exit_code == 0, exported.stderr
        document = orjson.loads(exported.stdout)
        assert document["format"] == "nestegg-run" and document["version"] == 1
        assert [(j["step"], j["position"]) for j in document["journal"]] == [(2, 0)]
        path = tmp_path / f"{run_id}.json"
        path.write_text(exported.stdout)
        imported = cli("import", str(path), "--store", target)
        assert imported.exit_code == 0, imported.stderr
        assert imported.stdout.startswith(f"imported run {run_id} (cli-test, ")
        again = cli("export", run_id, "--store", target)
        assert again.stdout == exported.stdout
    shown = json_of(cli("show", filled_any.ok, "--store", target, "--json"))
    assert shown["result"]["report"] == "Acme: 3 items"
    assert json_of(cli("runs", "--store", target, "--interrupted", "--json"))[0]["run_id"] == (
        filled_any.gone
    )


def test_import_into_every_kind_of_store(cli: Cli, any_url: str, tmp_path: Path) -> None:
    source = asyncio.run(fill(f"sqlite:///{tmp_path / 'source.db'}", f"-{uuid.uuid4().hex[:8]}"))
    ids = (source.ok, source.bad, source.gone)
    try:
        for run_id in ids:
            exported = cli("export", run_id, "--store", source.url)
            imported = cli("import", "-", "--store", any_url, input=exported.stdout)
            assert imported.exit_code == 0, imported.stderr
            assert cli("export", run_id, "--store", any_url).stdout == exported.stdout
        resumed = cli("recover", "--app", "tests.cli.pipeline_app:pipeline", "-s", any_url)
        assert resumed.exit_code == 0, resumed.stderr
        assert source.gone in resumed.stdout and "recovered 1 of 1" in resumed.stdout
    finally:
        asyncio.run(delete_runs(any_url, ids))


def test_export_to_a_file_and_import_from_stdin(cli: Cli, filled: Filled, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    exported = cli("export", filled.ok, "-o", str(out), "--store", filled.url)
    assert exported.exit_code == 0 and exported.stdout == ""
    target = f"file://{tmp_path / 'target'}"
    imported = cli("import", "-", "--store", target, input=out.read_text())
    assert imported.exit_code == 0, imported.stderr
    assert orjson.loads(cli("export", filled.ok, "-s", target).stdout) == orjson.loads(
        out.read_bytes()
    )
    clash = cli("import", str(out), "--store", target)
    assert clash.exit_code == EXIT_FAILED
    assert clash.stderr == f"error: run {filled.ok!r} already exists in the target store; " \
        "delete it first\n"  # fmt: skip


def test_export_and_import_refuse_an_empty_path_as_bad_usage(
    cli: Cli, filled: Filled, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Path('') is the current directory: cannot write .: Is a directory (exit 1)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    exported = cli("export", filled.ok, "-o", "", "-s", filled.url)
    assert (exported.exit_code, exported.stdout) == (EXIT_USAGE, "")
    assert exported.stderr == (
        "error: the path given to --output is empty: give a file's path, or - for standard output\n"
    )
    imported = cli("import", "", "-s", f"sqlite:///{here / 'target.db'}")
    assert (imported.exit_code, imported.stdout) == (EXIT_USAGE, "")
    assert imported.stderr == (
        "error: the path given is empty: give a file's path, or - for standard input\n"
    )
    assert list(here.iterdir()) == []  # no file written, no store made


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "standard input is empty: it holds no JSON"),  # was: - is not JSON: Input is ...
        (" \n", "standard input is empty: it holds no JSON"),
        ("{draft", "standard input is not JSON: "),
        ('{"format": "other"}', "standard input: not a nestegg-run export"),
    ],
)
def test_import_from_standard_input_names_it(
    cli: Cli, tmp_path: Path, given: str, message: str
) -> None:
    result = cli("import", "-", "-s", f"sqlite:///{tmp_path / 'target.db'}", input=given)
    assert (result.exit_code, result.stdout) == (EXIT_USAGE, "")
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert not (tmp_path / "target.db").exists()


def test_import_refuses_bad_documents(cli: Cli, filled: Filled, tmp_path: Path) -> None:
    document = orjson.loads(cli("export", filled.ok, "--store", filled.url).stdout)
    target = f"sqlite:///{tmp_path / 'target.db'}"
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    assert cli("import", str(path), "-s", target).exit_code == EXIT_USAGE
    path.write_bytes(orjson.dumps({"format": "other"}))
    wrong = cli("import", str(path), "-s", target)
    assert wrong.exit_code == EXIT_USAGE and "not a nestegg-run export" in wrong.stderr
    assert cli("import", str(tmp_path / "missing.json"), "-s", target).exit_code == EXIT_USAGE
    body = document["steps"][1]["body"]
    document["steps"][1]["body"] = body.replace('"completed"', '"complete!"')
    path.write_bytes(orjson.dumps(document))
    damaged = cli("import", str(path), "-s", target)
    assert damaged.exit_code == EXIT_FAILED
    assert damaged.stderr.startswith(
        f"error: {path}: step 2 of run {filled.ok!r} failed its checksum"
    )
    assert not (tmp_path / "target.db").exists()  # refused before the store was opened


async def test_transfer_between_memory_stores() -> None:
    source, target = MemoryCheckpointStorage(), MemoryCheckpointStorage()
    policy = CheckpointPolicy(keep_latest=2)
    clutch = build("cli-test", CheckpointConfig(storage=source, policy=policy))
    await clutch.run({"name": "Mem"}, run_id="mem")
    document = await export_run(source, "mem")
    assert [c["seq"] for c in document["checkpoints"]] == [2, 3]
    await import_run(target, document)
    assert await export_run(target, "mem") == document
    assert await target.get_run("mem") == await source.get_run("mem")
    assert await target.load_steps("mem") == await source.load_steps("mem")
    assert await target.read_events("mem") == await source.read_events("mem")


def test_export_refuses_a_run_whose_event_log_is_torn_and_writes_nothing(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # an export is a run whole or nothing: not a copy that would import without its events
    url = next(store_url_for("sqlite", request, tmp_path))
    filled = asyncio.run(fill(url))
    damage_newest_event_batch(url, filled.gone, tear)
    target = tmp_path / "gone.json"
    for output in ((), ("-o", str(target))):
        result = cli("export", filled.gone, *output, "--store", url)
        assert (result.exit_code, result.stdout) == (EXIT_FAILED, "")
        assert result.stderr == (
            f"error: run {filled.gone!r} cannot be exported: the event log of run "
            f"{filled.gone!r} is damaged (a torn batch); nothing was written (an export "
            f"copies a run whole; nestegg events {filled.gone} lists the events before the "
            "damage)\n"
        )
    assert not target.exists()
    assert cli("export", filled.ok, "--store", url).exit_code == 0  # the others export


async def test_runs_and_prune_read_the_checkpoints_of_many_runs_at_once(tmp_path: Path) -> None:
    """A read per run made `runs --limit 10000` and `prune --keep` of a store of 10,000
    runs take seconds: a store that lists many runs' checkpoints at once is read so."""

    reads: list[str] = []

    class Counting(SQLiteCheckpointStorage):
        async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
            reads.append(run_id)
            return await super().list_checkpoints(run_id)

        async def list_checkpoints_of(
            self, run_ids: Sequence[str]
        ) -> dict[str, list[CheckpointRecord]]:
            reads.append(f"{len(run_ids)} runs")
            return await super().list_checkpoints_of(run_ids)

    store = Counting(tmp_path / "runs.db")
    await store.setup()
    try:
        for i in range(6):
            run = await create(store, run_id=f"r{i}", status=COMPLETED)
            await commit_steps(store, run, range(1, i % 3 + 2), checkpoints=True)
        rows = await list_run_rows(
            store, pipeline=None, statuses=None, shown=None, limit=None, now=time.time()
        )
        assert reads == ["6 runs"]
        assert [(r["run_id"], r["last_checkpoint"]["seq"]) for r in rows] == [
            (f"r{i}", i % 3 + 1) for i in reversed(range(6))
        ]
        reads.clear()
        plan = await plan_prune(store, keep=1, older_than=None, statuses=[COMPLETED], pipeline=None)
        assert reads == ["6 runs"]
        assert {run_id: len(ids) for run_id, ids in plan.checkpoints.items()} == {
            f"r{i}": i % 3 for i in range(6) if i % 3
        }
    finally:
        await store.close()
