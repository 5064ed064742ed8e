"""resume and recover with the user's Clutch (--app), and how --store meets the app's store."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg.checkpoint import CheckpointConfig, FileCheckpointStorage, forks, given
from nestegg.checkpoint.codec import encode_value
from nestegg.checkpoint.stores import open_store
from nestegg.cli.replayed import replayed_failure_error
from nestegg.constants import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE
from nestegg.errors import JournaledCallError
from tests.cli import failed_call_app, pipeline_app
from tests.cli.conftest import (
    Cli,
    Filled,
    fill,
    json_of,
    leave_interrupted,
    leave_torn,
    queue,
    store_url_for,
    stored_as_is,
)
from tests.cli.pipeline_app import (
    OWN_STORE_ENV,
    POLICY,
    REFUSE_ENV,
    build,
    refuse_when_asked,
    without_enrich,
)

APP = "tests.cli.pipeline_app:pipeline"
GATED = "tests.cli.pipeline_app:gated"
FAILED_CALL_APP = "tests.cli.failed_call_app:pipeline"


def test_resume_a_failed_run(cli: Cli, filled_any: Filled) -> None:
    url = filled_any.url
    result = cli("resume", filled_any.bad, "--app", APP, "--store", url)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[0] == (
        f"run {filled_any.bad} completed: 3 steps (was failed at step 1)"
    )
    rows = json_of(cli("runs", "--store", url, "--json", "--status", "completed"))
    assert filled_any.bad in {r["run_id"] for r in rows}
    steps = json_of(cli("show", filled_any.bad, "--store", url, "--json"))["steps"]
    assert [s["agent"] for s in steps] == ["fetch", "enrich", "report"]


def test_resume_json_and_a_completed_run(cli: Cli, filled: Filled) -> None:
    summary = json_of(cli("resume", filled.ok, "--app", APP, "--store", filled.url, "--json"))
    assert summary == {
        "run_id": filled.ok,
        "status": "completed",
        "previous_status": "completed",
        "previous_steps": 3,
        "steps": 3,
        "resumed": False,
        "result": {"name": "Acme", "page": "page of Acme", "items": [1, 2, 3],
                   "tags": {"size": "big"}, "report": "Acme: 3 items"},
    }  # fmt: skip


def test_resume_of_a_completed_run_says_nothing_was_resumed(cli: Cli, filled: Filled) -> None:
    before = json_of(cli("show", filled.ok, "--store", filled.url, "--json"))
    result = cli("resume", filled.ok, "--app", APP, "--store", filled.url)
    assert result.exit_code == 0, result.stderr  # idempotent: the run is what was asked
    assert result.stdout.splitlines()[0] == (
        f"run {filled.ok} was completed already (3 steps): nothing to resume"
    )
    assert json_of(cli("show", filled.ok, "--store", filled.url, "--json")) == before


def test_resume_json_of_a_failed_run_says_it_was_resumed(cli: Cli, filled: Filled) -> None:
    summary = json_of(cli("resume", filled.bad, "--app", APP, "--store", filled.url, "--json"))
    assert (summary["previous_status"], summary["status"], summary["resumed"]) == (
        "failed",
        "completed",
        True,
    )


def test_resume_that_fails_again_exits_1(cli: Cli, filled: Filled) -> None:
    result = cli("resume", filled.bad, "--app", APP, "--store", filled.url, CLI_TEST_FAIL="1")
    assert result.exit_code == EXIT_FAILED
    assert result.stderr == f"error: run {filled.bad!r} failed: RuntimeError: enrich broke\n"
    assert "Traceback" not in result.output


async def _failed_for_good(url: str, run_id: str) -> None:
    """A run of ``priced`` whose journaled call failed for good (both attempts)."""
    store = open_store(url)
    try:
        with pytest.raises(ConnectionError, match="attempt 2"):
            await failed_call_app.build(CheckpointConfig(storage=store)).run(
                {"item": "lamp"}, run_id=run_id
            )
    finally:
        await store.close()


def test_resume_of_a_run_a_call_failed_for_good_makes_the_call_again(
    cli: Cli, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(failed_call_app, "CALLS", [])
    monkeypatch.setenv(failed_call_app.CALL_FAILS_ENV, "1")
    asyncio.run(_failed_for_good(local_url, "priced-1"))
    resume = ("resume", "priced-1", "--app", FAILED_CALL_APP, "--store", local_url)

    still_down = cli(*resume)  # its attempts made again: a fresh failure, not a replay

    assert still_down.exit_code == EXIT_FAILED, still_down.output
    assert still_down.stderr == (
        "error: run 'priced-1' failed: ConnectionError: no price for lamp (attempt 4)\n"
    )
    assert failed_call_app.CALLS == ["lamp"] * 4
    monkeypatch.setenv(failed_call_app.CALL_FAILS_ENV, "0")  # the API works again

    result = cli(*resume)

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("run priced-1 completed: 2 steps"), result.stdout
    assert failed_call_app.CALLS == ["lamp"] * 5


def test_recover_of_a_run_that_fails_on_a_replayed_failure_says_its_resume_calls_again(
    cli: Cli, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # recover said only the error, not that the run is failed now and calls again
    monkeypatch.setattr(failed_call_app, "CALLS", [])
    monkeypatch.setenv(failed_call_app.CALL_FAILS_ENV, "1")
    asyncio.run(_failed_for_good(local_url, "priced-1"))

    async def interrupted() -> None:  # its failure journaled, its process gone
        store = open_store(local_url)
        try:
            await leave_interrupted(store, "priced-1")
        finally:
            await store.close()

    asyncio.run(interrupted())
    monkeypatch.setenv(failed_call_app.CALL_FAILS_ENV, "0")
    recover = ("recover", "--app", FAILED_CALL_APP, "--store", local_url)

    result = cli(*recover, "--json")

    assert result.exit_code == EXIT_FAILED, result.output
    [outcome] = orjson.loads(result.stdout)["runs"]
    assert outcome == {
        "run_id": "priced-1",
        "outcome": "failed",
        "error": "tests.cli.failed_call_app.price failed: ConnectionError: no price for lamp "
        "(attempt 2)",
        "replayed": "tests.cli.failed_call_app.price",
    }
    assert failed_call_app.CALLS == ["lamp"] * 2  # replayed, not made again
    asyncio.run(interrupted())  # again, for the table
    shown = " ".join(cli(*recover).stdout.split())  # the table's lines joined
    assert shown.endswith(
        "replayed from the run's journal (the call failed for good before the run was "
        "interrupted); the run is failed now, and resuming it makes the call again: "
        f"nestegg resume priced-1 --app {FAILED_CALL_APP} --store {local_url} "
        "recovered 0 of 1 run; 1 failed, 0 taken by another process"
    ), shown


def test_a_replayed_failure_says_that_resuming_the_failed_run_makes_the_call_again() -> None:
    error = JournaledCallError("pipe.lookup", "ValueError", "not found")
    refused = replayed_failure_error("r 1", error, "--app pipe:clutch")
    assert refused.exit_code == EXIT_FAILED
    assert str(refused) == (
        "run 'r 1' failed: pipe.lookup failed: ValueError: not found, replayed from the "
        "run's journal (the call failed for good before the run was interrupted); the run "
        "is failed now, and resuming it makes the call again: "
        "nestegg resume 'r 1' --app pipe:clutch"
    )


def test_resume_of_a_run_its_on_request_hook_refused_awaits_the_hook_again(
    cli: Cli, local_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused() -> None:
        store = open_store(local_url)
        try:
            clutch = build("cli-test", CheckpointConfig(storage=store), refuse_when_asked)
            with pytest.raises(PermissionError):
                await clutch.run({"name": "Acme"}, run_id="refused")
        finally:
            await store.close()

    monkeypatch.setenv(REFUSE_ENV, "1")
    asyncio.run(refused())
    monkeypatch.delenv(REFUSE_ENV)
    recover = cli("recover", "--app", GATED, "--store", local_url)
    assert recover.stdout == "no interrupted runs of pipeline 'cli-test'\n"
    shown = json_of(cli("show", "refused", "--store", local_url, "--json"))
    assert (shown["run"]["status"], shown["steps"]) == ("failed", [])
    assert shown["run"]["error"]["hook"] == "on_request"

    again = cli("resume", "refused", "--app", GATED, "--store", local_url, CLI_TEST_REFUSE="1")
    assert (again.exit_code, again.stderr) == (
        EXIT_FAILED,
        "error: run 'refused' failed: PermissionError: run refused is not allowed\n",
    )
    shown = json_of(cli("show", "refused", "--store", local_url, "--json"))
    assert (shown["run"]["status"], shown["steps"]) == ("failed", [])

    passed = cli("resume", "refused", "--app", GATED, "--store", local_url)
    assert passed.exit_code == 0, passed.stderr
    assert passed.stdout.splitlines()[0] == "run refused completed: 3 steps (was failed at step 0)"


def test_resume_unknown_run(cli: Cli, filled: Filled) -> None:
    result = cli("resume", "nope", "--app", APP, "--store", filled.url)
    assert result.exit_code == EXIT_NOT_FOUND
    assert result.stderr == "error: no run 'nope' in the store\n"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("tests.cli.pipeline_app", "--app must look like module:attribute"),
        ("tests.cli.no_such_module:pipeline", "cannot import 'tests.cli.no_such_module'"),
        ("tests.cli.pipeline_app:missing", "has no attribute 'missing'"),
        ("tests.cli.pipeline_app:not_a_clutch", "is of type int, not a nestegg Clutch"),
        ("tests.cli.pipeline_app:here", "is of type pathlib.PosixPath, not a nestegg Clutch"),
        (
            "tests.cli.pipeline_app:Clutch",
            "is the class nestegg.clutch.Clutch (not an instance of it), not a nestegg Clutch",
        ),
    ],
)
def test_bad_app(cli: Cli, filled: Filled, spec: str, message: str) -> None:
    result = cli("resume", filled.bad, "--app", spec, "--store", filled.url)
    assert result.exit_code == EXIT_USAGE
    assert message in result.stderr and len(result.stderr.splitlines()) == 1
    if "Clutch" in message:
        assert result.stderr == f"error: {spec} {message}\n"


def test_an_app_whose_module_fails_while_imported_is_bad_usage_naming_where(
    cli: Cli, filled: Filled
) -> None:
    app = "tests.cli.boom_app:pipeline"
    result = cli("resume", filled.bad, "--app", app, "--store", filled.url)
    where = os.path.relpath(Path(__file__).with_name("boom_app.py"))
    assert result.exit_code == EXIT_USAGE
    assert result.stderr == (
        f"error: cannot import 'tests.cli.boom_app': RuntimeError: boom (at {where}, line 3) "
        "(nestegg --debug shows the traceback)\n"
    )


def test_app_without_checkpointing(
    cli: Cli, filled: Filled, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nestegg import Clutch

    monkeypatch.setattr(pipeline_app, "plain", Clutch("plain"), raising=False)
    result = cli("recover", "--app", "tests.cli.pipeline_app:plain", "--store", filled.url)
    assert result.exit_code == EXIT_USAGE
    assert "has no checkpointing" in result.stderr


def test_resume_a_run_of_another_pipeline(
    cli: Cli, filled: Filled, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = build("other", CheckpointConfig(policy=POLICY))
    monkeypatch.setattr(pipeline_app, "other", other, raising=False)
    result = cli("resume", filled.bad, "--app", "tests.cli.pipeline_app:other", "-s", filled.url)
    assert result.exit_code == EXIT_USAGE
    assert "belongs to pipeline 'cli-test', not 'other'" in result.stderr


async def _stored(url: str, run_ids: tuple[str, ...]) -> list[Any]:
    """The runs' records, events and checkpoints as stored."""
    store = open_store(url)
    try:
        return [
            (await store.get_run(r), await store.read_events(r, 0), await store.list_checkpoints(r))
            for r in run_ids
        ]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("order", "code", "message"),
    [
        (None, EXIT_FAILED, "run {run_id!r}: the checkpoint continues with agent 'enrich' "
                            "(position 1 of the order), which this pipeline no longer has"),
        (["fetch", "enrich", "report"], EXIT_USAGE, "order= names agent 'enrich', which is "
                                                    "not registered on Clutch 'cli-test' "
                                                    "(known: ['fetch', 'report'])"),
    ],
)  # fmt: skip
def test_resume_by_an_app_that_lost_the_next_agent_fails_first_and_stores_nothing(
    cli: Cli,
    filled: Filled,
    monkeypatch: pytest.MonkeyPatch,
    order: list[str] | None,
    code: int,
    message: str,
) -> None:
    monkeypatch.setattr(pipeline_app, "changed", without_enrich(None, order), raising=False)
    runs = (filled.bad, filled.gone)  # failed in enrich; interrupted in it (a resume claims it)
    before = asyncio.run(_stored(filled.url, runs))
    for run_id in runs:
        result = cli("resume", run_id, "--app", "tests.cli.pipeline_app:changed", "-s", filled.url)
        named = message.format(run_id=run_id)
        assert (result.exit_code, result.stderr) == (code, f"error: {named}\n")
    assert asyncio.run(_stored(filled.url, runs)) == before


def test_recover_resumes_the_interrupted_runs(cli: Cli, filled_any: Filled) -> None:
    url = filled_any.url
    report = json_of(cli("recover", "--app", APP, "--store", url, "--json"))
    assert report["pipeline"] == "cli-test"
    assert [r["run_id"] for r in report["runs"]] == [filled_any.gone]
    assert report["runs"][0]["outcome"] == "completed"
    assert report["runs"][0]["result"]["report"] == f"{filled_any.gone}: 3 items"
    assert (report["completed"], report["failed"], report["skipped"]) == (1, 0, 0)
    assert json_of(cli("runs", "--store", url, "--json", "--interrupted")) == []
    again = cli("recover", "--app", APP, "--store", url)
    assert (again.exit_code, again.stdout) == (0, "no interrupted runs of pipeline 'cli-test'\n")


def test_recover_many_with_a_concurrency_limit(cli: Cli, local_url: str) -> None:
    for index in range(5):
        asyncio.run(fill(local_url, f"-{index}"))
    result = cli("recover", "--app", APP, "--store", local_url, "--concurrency", "2")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RUN", "OUTCOME", "DETAIL"]
    assert sorted(line.split()[0] for line in lines[1:6]) == [f"gone-{i}" for i in range(5)]
    assert lines[-1] == "recovered 5 of 5 runs; 0 failed, 0 taken by another process"


def test_recover_with_runs_failing_again_exits_1(cli: Cli, filled: Filled) -> None:
    result = cli("recover", "--app", APP, "--store", filled.url, CLI_TEST_FAIL="1")
    assert result.exit_code == EXIT_FAILED
    row = result.stdout.splitlines()[1].split(maxsplit=2)
    assert row == [filled.gone, "failed", "RuntimeError: enrich broke"]


def test_recover_leaves_the_runs_queued_for_workers_to_them(cli: Cli, filled: Filled) -> None:
    # A run stored for workers that none took yet was resumed as an interrupted one, in
    # the command's process, though runs shows it queued.
    url = filled.url
    asyncio.run(queue(url, "q1"))
    before = asyncio.run(_stored(url, ("q1",)))
    report = json_of(cli("recover", "--app", APP, "--store", url, "--json"))
    assert [(r["run_id"], r["outcome"]) for r in report["runs"]] == [(filled.gone, "completed")]
    assert (report["completed"], report["queued"], report["queued_runs"]) == (1, 1, ["q1"])
    assert asyncio.run(_stored(url, ("q1",))) == before  # a worker's sweep publishes it
    again = cli("recover", "--app", APP, "--store", url)
    assert (again.exit_code, again.stdout) == (
        0,
        "no interrupted runs of pipeline 'cli-test'; 1 run queued for workers left to them\n",
    )
    resumed = cli("resume", "q1", "--app", APP, "--store", url)  # on purpose: it runs here
    assert resumed.exit_code == 0, resumed.stderr
    assert resumed.stdout.startswith("run q1 completed: 3 steps (was queued at step 0)")
    # its log says so too: it said run_interrupted (owner null), previous interrupted
    lines = cli("events", "q1", "--store", url, "--json").stdout.splitlines()
    opening = [orjson.loads(line) for line in lines[:2]]
    assert [(e["kind"], e["data"].get("previous")) for e in opening] == [
        ("run_started", None),
        ("run_resumed", "queued"),
    ]


def test_recover_tells_a_queued_run_in_its_summary(cli: Cli, filled: Filled) -> None:
    asyncio.run(queue(filled.url, "q1"))
    result = cli("recover", "--app", APP, "--store", filled.url)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "recovered 1 of 1 run; 0 failed, 0 taken by another process, "
        "1 run queued for workers left to them"
    )


def test_recover_of_a_run_the_changed_pipeline_refuses_reports_it_refused(
    cli: Cli, filled: Filled, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Refused before anything was stored, it was reported failed: "1 failed".
    monkeypatch.setattr(pipeline_app, "changed", without_enrich(None), raising=False)
    app = "tests.cli.pipeline_app:changed"
    before = asyncio.run(_stored(filled.url, (filled.gone,)))
    result = cli("recover", "--app", app, "--store", filled.url)
    assert result.exit_code == EXIT_FAILED  # as a resume refused so, and a run failed again
    lines = result.stdout.splitlines()
    reason = (
        f"run {filled.gone!r}: the checkpoint continues with agent 'enrich' (position 1 of "
        "the order), which this pipeline no longer has"
    )
    assert lines[1].split(maxsplit=2)[:2] == [filled.gone, "refused"]
    assert " ".join(" ".join(lines[1:-1]).split()[2:]) == reason
    assert lines[-1] == (
        "recovered 0 of 1 run; 0 failed, 0 taken by another process, "
        "1 refused as the pipeline changed"
    )
    as_json = cli("recover", "--app", app, "--store", filled.url, "--json")
    assert as_json.exit_code == EXIT_FAILED
    report = orjson.loads(as_json.stdout)
    assert (report["failed"], report["refused"], report["completed"]) == (0, 1, 0)
    assert report["runs"] == [{"run_id": filled.gone, "outcome": "refused", "error": reason}]
    assert asyncio.run(_stored(filled.url, (filled.gone,))) == before  # nothing changed


def test_an_app_with_its_own_store_ignores_store(cli: Cli, filled: Filled, tmp_path: Path) -> None:
    own = tmp_path / "own"

    async def own_run() -> None:
        store = FileCheckpointStorage(own)
        clutch = build("cli-own", CheckpointConfig(storage=store, policy=POLICY))
        await clutch.run({"name": "Own"}, run_id="own-1", timeout=10)
        await store.close()

    asyncio.run(own_run())
    spec = "tests.cli.pipeline_app:own_store_pipeline"
    env = {OWN_STORE_ENV: str(own)}
    result = cli("resume", "own-1", "--app", spec, "--store", filled.url, **env)
    assert result.exit_code == 0, result.stderr
    assert result.stderr == f"note: the Clutch at {spec} names its own store; --store is ignored\n"
    assert result.stdout.startswith("run own-1 was completed already (3 steps)")
    quiet = cli("resume", "own-1", "--app", spec, NESTEGG_STORE=filled.url, **env)
    assert (quiet.exit_code, quiet.stderr) == (0, "")


def test_the_app_clutch_is_left_as_it_was(cli: Cli, filled: Filled) -> None:
    config = pipeline_app.pipeline._checkpoint_config
    assert cli("recover", "--app", APP, "--store", filled.url).exit_code == 0
    assert pipeline_app.pipeline._checkpoint_config is config
    assert config is not None and config.storage is None


def test_fork_encodes_the_data_given_once(
    cli: Cli, filled: Filled, monkeypatch: pytest.MonkeyPatch
) -> None:
    # it was encoded to check it, then again to store it
    encoded: list[Any] = []

    def counted(value: Any, path: str = "data") -> bytes:
        encoded.append(value)
        return encode_value(value, path)

    for module in (given, forks):
        monkeypatch.setattr(module, "encode_value", counted)
    first = json_of(cli("checkpoints", filled.ok, "--store", filled.url, "--json"))[0]
    data = '{"name": "Acme", "size": 3}'
    args = ["fork", first["checkpoint_id"], "--app", APP, "--data", data, "--json"]
    forked = json_of(cli(*args, "--store", filled.url))
    assert forked["status"] == "completed"
    assert encoded == [{"name": "Acme", "size": 3}]


WAITING_APP = "tests.ui.pipelines:waiting_app"
TORN_WHY = (
    "run 'torn' is refused: the event log of run 'torn' is damaged (a torn batch), so what "
    "it waits for is unknown; it was not resumed"
)


def test_resume_signal_and_recover_refuse_a_waiting_run_whose_event_log_is_torn(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # recover stopped at it, and failed as a whole; the other commands said the store's line
    url = next(store_url_for("sqlite", request, tmp_path))
    leave_torn(url, "torn", "fine")
    assert cli("signal", "fine", "approval", '"yes"', "--store", url).exit_code == 0
    before = stored_as_is(url, "torn")
    sent = cli("signal", "torn", "approval", '"yes"', "--app", WAITING_APP, "--store", url)
    assert sent.exit_code == EXIT_FAILED
    assert sent.stderr.startswith(f"error: {TORN_WHY}, its signal 'approval' not stored and ")
    resumed = cli("resume", "torn", "--app", WAITING_APP, "--store", url)
    assert (resumed.exit_code, resumed.stderr.startswith(f"error: {TORN_WHY} and ")) == (1, True)
    result = cli("recover", "--app", WAITING_APP, "--store", url)
    assert result.exit_code == EXIT_FAILED
    rows = {line.split()[0]: line.split()[1] for line in result.stdout.splitlines()[1:-1]}
    assert rows == {"fine": "completed", "torn": "refused"}
    assert TORN_WHY in " ".join(result.stdout.split())
    assert result.stdout.splitlines()[-1] == (
        "recovered 1 of 2 runs; 0 failed, 0 taken by another process, "
        "1 refused as its event log is damaged"
    )
    as_json = cli("recover", "--app", WAITING_APP, "--store", url, "--json")
    assert as_json.exit_code == EXIT_FAILED
    report = orjson.loads(as_json.stdout)
    (row,) = report["runs"]
    assert (row["run_id"], row["outcome"], row["event_log"]) == ("torn", "refused", "damaged")
    assert row["error"].startswith(TORN_WHY)
    assert (report["refused"], report["completed"]) == (1, 0)
    assert stored_as_is(url, "torn") == before  # nothing of it changed
