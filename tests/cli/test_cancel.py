"""nestegg cancel RUN: each status it meets, its output and exit codes, a live owner in
another process stopped by it, and a resume in another process that read the run before the
cancel and does not reopen it (real processes)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from nestegg.checkpoint.ownership import host_id
from nestegg.checkpoint.stores import open_store
from nestegg.constants import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE
from tests.cli.conftest import Cli, Filled, fill, json_of, store_url_for
from tests.cli.test_subprocess import ROOT, TIMEOUT, _env, nestegg

APP = "tests.cli.pipeline_app:pipeline"
RACE_APP = "tests.cli.race_app:pipeline"


async def _stored(url: str) -> dict[str, object]:
    """Every run of the store with its events, to compare before and after."""
    store = open_store(url)
    try:
        return {
            run.run_id: (run, await store.read_events(run.run_id))
            for run in await store.list_runs()
        }
    finally:
        await store.close()


def stored(url: str) -> dict[str, object]:
    return asyncio.run(_stored(url))


def test_completed_failed_unknown_and_bad_ids_change_nothing(cli: Cli, filled: Filled) -> None:
    before = stored(filled.url)
    for run_id, status in ((filled.ok, "completed"), (filled.bad, "failed")):
        result = cli("cancel", run_id, "--store", filled.url)
        assert (result.exit_code, result.stdout) == (EXIT_FAILED, "")
        assert result.stderr == (
            f"error: run {run_id!r} is {status}: only a running or waiting run can be "
            "cancelled; nothing was changed\n"
        )
    unknown = cli("cancel", "ghost", "--store", filled.url)
    assert (unknown.exit_code, unknown.stderr) == (
        EXIT_NOT_FOUND,
        "error: no run 'ghost' in the store\n",
    )
    bad = cli("cancel", "../x", "--store", filled.url)
    assert bad.exit_code == EXIT_USAGE
    assert bad.stderr.startswith("error: run id '../x' contains '..' at index 0 (")
    assert stored(filled.url) == before


def test_an_interrupted_run_is_cancelled_once_then_left_to_a_resume(
    cli: Cli, filled: Filled
) -> None:
    url = filled.url
    result = cli("cancel", filled.gone, "--store", url)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"run {filled.gone} cancelled (was interrupted after 1 step)\n"
    before = stored(url)
    again = cli("cancel", filled.gone, "--store", url)
    assert (again.exit_code, again.stdout) == (
        0,
        f"run {filled.gone} is cancelled already; nothing was changed\n",
    )
    assert stored(url) == before
    recovered = cli("recover", "--app", APP, "--store", url)
    assert recovered.stdout == "no interrupted runs of pipeline 'cli-test'\n"
    events = [
        orjson.loads(line)
        for line in cli("events", filled.gone, "--json", "-s", url).stdout.splitlines()
    ]
    last = events[-1]
    assert last["kind"] == "run_cancelled"
    assert last["data"]["previous"] == "interrupted" and last["data"]["outside"] is True
    assert (last["data"]["by"]["host"], last["data"]["by"]["pid"]) == (host_id(), os.getpid())
    resumed = cli("resume", filled.gone, "--app", APP, "--store", url)
    assert resumed.stdout.splitlines()[0] == (
        f"run {filled.gone} completed: 3 steps (was cancelled at step 1)"
    )


def test_json(cli: Cli, filled: Filled) -> None:
    summary = json_of(cli("cancel", filled.gone, "--store", filled.url, "--json"))
    owner = summary.pop("previous_owner")
    assert owner["pid"] == 99_999_999
    assert summary == {
        "run_id": filled.gone,
        "status": "cancelled",
        "cancelled": True,
        "previous": "interrupted",
        "steps": 1,
    }
    again = json_of(cli("cancel", filled.gone, "--store", filled.url, "--json"))
    assert (again["cancelled"], again["previous"], again["previous_owner"]) == (
        False,
        "cancelled",
        None,
    )


OWNER = """
import asyncio, sys, time
from pathlib import Path
from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from nestegg.errors import StaleOwnerError

marks = Path(sys.argv[2])
clutch = Clutch("live-test", checkpoint=CheckpointConfig(storage=open_store(sys.argv[1])))

@clutch.agent()
async def first(data: int) -> int:
    return data + 1

@clutch.agent()
async def slow(data: int) -> int:
    (marks / "entered").touch()
    while not (marks / "go").exists():
        await asyncio.sleep(0.02)
    (marks / "returned").touch()
    return data + 1

@clutch.agent()
async def last(data: int) -> int:
    (marks / "last ran").touch()
    return data + 1

try:
    print(asyncio.run(clutch.run(1, run_id="live")))
except StaleOwnerError as lost:
    print(f"{type(lost).__name__}: {lost}")
    sys.exit(7)
"""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_a_live_owner_in_another_process_is_stopped_by_cancel(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'n.db'}"
    marks = tmp_path / "marks"
    marks.mkdir()
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, url, str(marks)],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(marks / "entered")
        cancelled = nestegg(tmp_path, "cancel", "live", "--store", url)
        assert cancelled.returncode == 0, cancelled.stderr
        assert cancelled.stdout == (
            f"run live cancelled (was running after 1 step; its owner, pid {owner.pid} on "
            f"{host_id()}, stops at its next commit)\n"
        )
        (marks / "go").touch()
        out, err = owner.communicate(timeout=TIMEOUT)
    finally:
        owner.kill()
    canceller = orjson.loads(
        nestegg(tmp_path, "events", "live", "--json", "-s", url).stdout.splitlines()[-1]
    )
    by = canceller["data"]["by"]
    assert owner.returncode == 7, err
    assert out == (
        f"StaleOwnerError: run 'live' was cancelled from outside (by pid {by['pid']} on "
        f"{by['host']}); this process stopped it, the step under way not recorded: "
        "resume_latest('live') continues it\n"
    )
    assert err == ""
    assert (marks / "returned").exists() and not (marks / "last ran").exists()
    shown = orjson.loads(nestegg(tmp_path, "show", "live", "--json", "--store", url).stdout)
    assert (shown["run"]["status"], shown["run"]["steps"]) == ("cancelled", 1)
    # the owner that ran it, not the short-lived canceller whose claim the store keeps
    assert shown["run"]["owner"]["pid"] == owner.pid and shown["run"]["cancelled_by"] == by
    host = host_id().split("#")[0]
    summary = nestegg(tmp_path, "show", "live", "--store", url).stdout.splitlines()
    assert f"owner:    {host}:{owner.pid} (cancelled by {host}:{by['pid']})" in summary
    table = nestegg(tmp_path, "runs", "--store", url).stdout.splitlines()
    assert table[1].split()[-1] == f"{host}:{owner.pid}"
    assert canceller["kind"] == "run_cancelled" and canceller["data"]["previous"] == "running"
    assert canceller["data"]["previous_owner"]["pid"] == owner.pid


@pytest.fixture(params=["sqlite", "postgres"])
def race_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty SQLite store, or PostgreSQL in a database of its own."""
    yield from store_url_for(request.param, request, tmp_path)


def test_a_cancel_after_a_resume_read_the_run_wins_and_the_resume_says_so(
    tmp_path: Path, race_url: str
) -> None:
    filled = asyncio.run(fill(race_url))
    marks = tmp_path / "marks"
    marks.mkdir()
    resumer = subprocess.Popen(
        [sys.executable, "-m", "nestegg.cli", "resume", filled.gone, "--app", RACE_APP],
        cwd=ROOT,
        env=_env(tmp_path, RACE_STORE=race_url, RACE_MARKS=str(marks)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(marks / "read")  # the resume read the run interrupted
        cancelled = nestegg(tmp_path, "cancel", filled.gone, "--store", race_url)
        assert (cancelled.returncode, cancelled.stdout) == (
            0,
            f"run {filled.gone} cancelled (was interrupted after 1 step)\n",
        ), cancelled.stderr
        (marks / "go").touch()
        out, err = resumer.communicate(timeout=TIMEOUT)
    finally:
        resumer.kill()
    assert (resumer.returncode, out) == (EXIT_FAILED, ""), out
    events = nestegg(tmp_path, "events", filled.gone, "--json", "-s", race_url).stdout
    by = orjson.loads(events.splitlines()[-1])["data"]["by"]
    assert err == (
        f"error: run {filled.gone!r} was cancelled from outside (by pid {by['pid']} on "
        f"{by['host']}) before this resume claimed it; nothing was resumed: resume it again "
        "to continue it on purpose\n"
    )
    shown = orjson.loads(nestegg(tmp_path, "show", filled.gone, "--json", "-s", race_url).stdout)
    assert (shown["run"]["status"], shown["run"]["steps"]) == ("cancelled", 1)
    again = nestegg(tmp_path, "resume", filled.gone, "--app", APP, "--store", race_url)
    assert again.stdout.splitlines()[0] == (
        f"run {filled.gone} completed: 3 steps (was cancelled at step 1)"
    ), again.stderr
