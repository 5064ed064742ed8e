"""``nestegg resume RUN --from CHECKPOINT`` and ``nestegg fork CHECKPOINT`` as real processes,
with an app module written to the test's directory: what they run and print, and the cases
they refuse (exit code, one line naming what was wrong, the store unchanged)."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest

from nestegg.checkpoint.codec import unseal_value
from nestegg.checkpoint.ownership import current_owner
from nestegg.checkpoint.stores import open_store
from nestegg.cli.transfer import export_run
from nestegg.constants import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, HOME_ENV, STORE_ENV
from tests.cli.test_subprocess import ROOT
from tests.cli.test_subprocess import nestegg as run_nestegg

TIMEOUT = 60
LOG_ENV = "REWIND_LOG"
FAIL_ENV = "REWIND_FAIL"
APP_MODULE = "rewind_app"
APP = f"{APP_MODULE}:pipeline"
APP_SOURCE = """
import os
from pathlib import Path

from pydantic import BaseModel

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy


def _step(agent, data):
    with Path(os.environ["REWIND_LOG"]).open("a") as log:
        log.write(agent + "\\n")
    if os.environ.get("REWIND_FAIL") == agent:
        raise RuntimeError(agent + " broke")
    return {**data, "trail": [*data["trail"], agent]}


async def draft(data):
    return _step("draft", data)


async def review(data):
    return _step("review", data)


async def publish(data):
    return _step("publish", data)


def build(name="rewind", agents=(draft, review, publish), storage=None):
    policy = CheckpointPolicy(every_n_steps=1, keep_latest=None)
    config = CheckpointConfig(storage=storage, policy=policy)
    clutch = Clutch(name, strategy=Strategy.SEQUENTIAL, checkpoint=config)
    for agent in agents:
        clutch.agent()(agent)
    return clutch


pipeline = build()
other = build("other")
without_review = build(agents=(draft, publish))


class Trail(BaseModel):
    trail: list[str]


class Signed(Trail):
    owner: str


def _typed(model):
    async def review(data: model):
        return _step("review", data.model_dump())

    return build(agents=(draft, review, publish))


typed = _typed(Trail)  # review takes a Trail
signed = _typed(Signed)  # review's model wants an owner no stored data has
"""


@dataclass(frozen=True)
class Stored:
    """A store with two runs of the app's pipeline: ``done`` completed, ``failed`` failed
    in ``review`` (step 2); the first checkpoint of each (after ``draft``, before
    ``review``); the log the agents write their names to."""

    folder: Path
    url: str
    log: Path
    done_first: str
    failed_first: str

    def ran(self) -> list[str]:
        return self.log.read_text().splitlines()


def _load_app(folder: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        f"{APP_MODULE}_{uuid.uuid4().hex}", folder / f"{APP_MODULE}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _fill(app: ModuleType, url: str) -> tuple[str, str]:
    store = open_store(url)
    try:
        clutch = app.build(storage=store)
        await clutch.run({"trail": []}, run_id="done")
        os.environ[FAIL_ENV] = "review"
        try:
            with pytest.raises(RuntimeError, match="review broke"):
                await clutch.run({"trail": []}, run_id="failed")
        finally:
            del os.environ[FAIL_ENV]
        firsts = [(await store.list_checkpoints(r))[0] for r in ("done", "failed")]
        assert [c.seq for c in firsts] == [1, 1]
        return firsts[0].checkpoint_id, firsts[1].checkpoint_id
    finally:
        await store.close()


@pytest.fixture(params=["sqlite", "file"])
def stored(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Stored:
    (tmp_path / f"{APP_MODULE}.py").write_text(APP_SOURCE)
    log = tmp_path / "ran.log"
    monkeypatch.setenv(LOG_ENV, str(log))
    url = (
        f"sqlite:///{tmp_path / 'runs.db'}"
        if request.param == "sqlite"
        else f"file://{tmp_path / 'runs'}"
    )
    done_first, failed_first = asyncio.run(_fill(_load_app(tmp_path), url))
    assert log.read_text().splitlines() == ["draft", "review", "publish", "draft", "review"]
    return Stored(tmp_path, url, log, done_first, failed_first)


async def _snapshot(url: str) -> dict[str, Any]:
    """Every run in the store, exported whole (record, steps, checkpoints, events, journal)."""
    store = open_store(url)
    try:
        return {r.run_id: await export_run(store, r.run_id) for r in await store.list_runs()}
    finally:
        await store.close()


def snapshot(stored: Stored) -> dict[str, Any]:
    return asyncio.run(_snapshot(stored.url))


def nestegg(
    stored: Stored, *args: str, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """The command, run in the app module's folder with the test's store."""
    base = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, FAIL_ENV, "PYTHONPATH")}
    base["PYTHONPATH"] = str(ROOT)  # this tree's nestegg, beside the app module in the folder
    return subprocess.run(
        [sys.executable, "-m", "nestegg.cli", *args, "--store", stored.url],
        cwd=stored.folder,
        env={**base, HOME_ENV: str(stored.folder / "home"), LOG_ENV: str(stored.log), **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


async def _claim(url: str, run_id: str) -> None:
    """Mark ``run_id`` as executed by this (live) test process."""
    store = open_store(url)
    try:
        run = await store.get_run(run_id)
        assert run is not None
        now = time.time()
        await store.claim_run(run_id, run.fence, current_owner(), now + 60, now, reopen=True)
    finally:
        await store.close()


def _resumed_from(stored: Stored, run_id: str) -> list[Any]:
    """The checkpoints the run's resumes started from, as its events say."""
    events = snapshot(stored)[run_id]["events"]
    bodies = [orjson.loads(e["body"])["body"] for e in events]  # sealed: {"crc", "body"}
    return [
        b["checkpoint_id"]
        for e, b in zip(events, bodies, strict=True)
        if e["kind"] == "run_resumed"
    ]


def test_resume_from_a_checkpoint_rewinds_the_run_and_runs_the_steps_after_it(
    stored: Stored,
) -> None:
    result = nestegg(stored, "resume", "done", "--from", stored.done_first, "--app", APP)
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout.splitlines() == [
        "run done completed: 3 steps (was completed at step 3; resumed from checkpoint "
        f"{stored.done_first} at step 1)",
        'result: {"trail":["draft","review","publish"]}',
    ]
    assert stored.ran()[5:] == ["review", "publish"]  # the steps after the checkpoint, again
    assert _resumed_from(stored, "done") == [stored.done_first]


def test_resume_from_a_checkpoint_of_a_failed_run_as_json(stored: Stored) -> None:
    args = ("resume", "failed", "--from", stored.failed_first, "--app", APP, "--json")
    result = nestegg(stored, *args)
    assert result.returncode == EXIT_OK, result.stderr
    assert orjson.loads(result.stdout) == {
        "run_id": "failed",
        "status": "completed",
        "previous_status": "failed",
        "previous_steps": 1,
        "steps": 3,
        "resumed": True,
        "result": {"trail": ["draft", "review", "publish"]},
        "from_checkpoint": stored.failed_first,
        "from_step": 1,
    }
    assert stored.ran()[5:] == ["review", "publish"]


@pytest.mark.parametrize(
    ("run_id", "checkpoint", "app", "code", "message"),
    [
        ("failed", "DONE", APP, EXIT_USAGE,
         "checkpoint 'DONE' belongs to run 'done', not 'failed' (fork from it to continue it "
         "on a new run)"),
        ("done", "nope", APP, EXIT_NOT_FOUND, "no checkpoint 'nope' in the store"),
        ("done", "../x", APP, EXIT_USAGE,
         "checkpoint id '../x' contains '..' at index 0 "
         "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"),
        ("nope", "DONE", APP, EXIT_NOT_FOUND, "no run 'nope' in the store"),
        ("done", "DONE", f"{APP_MODULE}:other", EXIT_USAGE,
         "run 'done' belongs to pipeline 'rewind', not 'other'"),
        ("failed", "FAILED", f"{APP_MODULE}:without_review", EXIT_FAILED,
         "run 'failed': the checkpoint continues with agent 'review' (position 1 of the "
         "order), which this pipeline no longer has"),
    ],
)  # fmt: skip
def test_resume_from_refuses_and_changes_nothing(
    stored: Stored, run_id: str, checkpoint: str, app: str, code: int, message: str
) -> None:
    checkpoint, message = _named(stored, checkpoint, message)
    _refused(stored, ["resume", run_id, "--from", checkpoint, "--app", app], code, message)


def test_resume_from_refuses_a_run_executing_elsewhere(stored: Stored) -> None:
    asyncio.run(_claim(stored.url, "failed"))
    before, ran = snapshot(stored), stored.ran()
    result = nestegg(stored, "resume", "failed", "--from", stored.failed_first, "--app", APP)
    assert result.returncode == EXIT_FAILED
    assert result.stderr == (
        f"error: run 'failed' is being executed by a live process (pid {os.getpid()}); it "
        "cannot be resumed now\n"
    )
    assert snapshot(stored) == before
    assert stored.ran() == ran


def _forks(stored: Stored) -> dict[str, Any]:
    """The runs in the store other than the two the fixture made, exported whole."""
    return {k: v for k, v in snapshot(stored).items() if k not in ("done", "failed")}


def test_fork_from_a_checkpoint_runs_a_new_run_and_leaves_the_original(stored: Stored) -> None:
    before = snapshot(stored)
    result = nestegg(stored, "fork", stored.done_first, "--app", APP)
    assert result.returncode == EXIT_OK, result.stderr
    [new_id] = _forks(stored)
    assert result.stdout.splitlines() == [
        f"run {new_id} completed: 3 steps (forked from run done at checkpoint "
        f"{stored.done_first}, step 1)",
        'result: {"trail":["draft","review","publish"]}',
    ]
    assert stored.ran()[5:] == ["review", "publish"]
    after = snapshot(stored)
    assert {k: after[k] for k in before} == before  # the original is unchanged
    forked = after[new_id]["run"]
    assert (forked["parent_run"], forked["parent_checkpoint"]) == ("done", stored.done_first)


@pytest.mark.parametrize("given", ["--data", "--data-file", "stdin"])
def test_fork_with_replaced_data_as_json(stored: Stored, given: str) -> None:
    data = '{"trail": ["edited"]}'
    (stored.folder / "data.json").write_text(data)
    where = {"--data": ("--data", data), "--data-file": ("--data-file", "data.json"),
             "stdin": ("--data-file", "-")}[given]  # fmt: skip
    result = nestegg(stored, "fork", stored.failed_first, "--app", APP, *where, "--json",
                     stdin=data if given == "stdin" else None)  # fmt: skip
    assert result.returncode == EXIT_OK, result.stderr
    [new_id] = _forks(stored)
    assert orjson.loads(result.stdout) == {
        "run_id": new_id,
        "status": "completed",
        "parent_run": "failed",
        "parent_checkpoint": stored.failed_first,
        "from_step": 1,
        "steps": 3,
        "result": {"trail": ["edited", "review", "publish"]},
    }
    assert stored.ran()[5:] == ["review", "publish"]


async def _result(url: str, run_id: str) -> Any:
    store = open_store(url)
    try:
        run = await store.get_run(run_id)
        assert run is not None and run.result is not None
        return unseal_value(run.result, "result")
    finally:
        await store.close()


TAGGED = (
    '{"$ne": "map", "v": [["trail", []], [1, "a"], ["1", "b"],'
    ' ["own", {"$ne": "map", "v": [["$ne", "mine"], ["v", 2]]}]]}'
)
"""Data in the codec's form, as nestegg show writes a dict with an int key, and a dict of
one's own with the keys "$ne" and "v" as the codec stores it."""


def test_fork_data_in_the_codecs_form_is_rebuilt_as_the_codec_rebuilds_it(stored: Stored) -> None:
    result = nestegg(stored, "fork", stored.done_first, "--app", APP, "--data", TAGGED, "--json")
    assert result.returncode == EXIT_OK, result.stderr
    [new_id] = _forks(stored)
    assert asyncio.run(_result(stored.url, new_id)) == {
        "trail": ["review", "publish"],
        1: "a",
        "1": "b",
        "own": {"$ne": "mine", "v": 2},
    }


CUT_ITEM = "… (5 more items; --full shows all)"
"""The last item of a list of 101 that nestegg inspect cut."""


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--data", '{"x": {"$ne": "bogus", "v": 1}}'], EXIT_USAGE,
         "--data holds {\"$ne\":\"bogus\",\"v\":1} at data.x, which is not a value the codec "
         "writes (unknown tag \"bogus\"; one of …, map); a dict of your own with a '$ne' key "
         'is written {"$ne": "map", "v": [[key, value], ...]}'),
        (["--data", '{"trail": [], "x": NaN}'], EXIT_USAGE,
         "--data is not JSON: NaN, Infinity and -Infinity are not JSON numbers (line 1 column "
         '20); give one as {"$ne":"float","v":"NaN"} ("Infinity", "-Infinity"); nestegg '
         "inspect CHECKPOINT --path data --stored prints the data in the form fork reads back "
         "exactly"),
        (["--data", '{"trail": [], "x": {"$ne": "bytes", "v": "@@@"}}'], EXIT_USAGE,
         '--data holds {"$ne":"bytes","v":"@@@"} at data.x, which is not a value the codec '
         "writes (its value is not the bytes in base64 …"),
        (["--data", orjson.dumps({"trail": ["x"] * 100 + [CUT_ITEM]}).decode()],
         EXIT_USAGE, "--data holds at data.trail[100] a value nestegg inspect cut (…"),
        (["--data", "{draft"], EXIT_USAGE,
         "--data is not JSON (…: line 1 column 2 (char 1)): quote a string as '\"text\"'"),
        (["--data-file", "bad.json"], EXIT_USAGE,
         "--data-file bad.json is not JSON: …: line 1 column 2 (char 1)"),
        (["--data", "[" * 300 + "1" + "]" * 300], EXIT_USAGE,  # deeper than the codec writes
         "cannot store the value at data: type list is not serializable (Recursion limit "
         "reached)"),
        (["--data", "[" * 600 + "1" + "]" * 600], EXIT_USAGE,  # than Python's stack holds
         "cannot store the value at data: type list is not serializable (nested too deeply)"),
        (["--data-file", "missing.json"], EXIT_USAGE,
         "cannot read --data-file missing.json: No such file or directory"),
        (["--data-file", ""], EXIT_USAGE,  # it read the current directory: Is a directory
         "the path given to --data-file is empty: give a file's path, or - for standard input"),
        (["--data", "{}", "--data-file", "bad.json"], EXIT_USAGE,
         "give --data or --data-file, not both"),
    ],
)  # fmt: skip
def test_fork_refuses_bad_data_and_stores_nothing(
    stored: Stored, args: list[str], code: int, message: str
) -> None:
    (stored.folder / "bad.json").write_text("{draft")
    before, ran = snapshot(stored), stored.ran()
    result = nestegg(stored, "fork", stored.done_first, "--app", APP, *args)
    assert (result.returncode, result.stdout) == (code, "")
    head, _, tail = message.partition("…")  # … stands for the JSON parser's own words
    assert result.stderr.startswith(f"error: {head}") and result.stderr.endswith(f"{tail}\n")
    assert len(result.stderr.splitlines()) == 1
    assert snapshot(stored) == before
    assert stored.ran() == ran


@pytest.mark.parametrize(
    ("checkpoint", "app", "code", "message"),
    [
        ("nope", APP, EXIT_NOT_FOUND, "no checkpoint 'nope' in the store"),
        ("../x", APP, EXIT_USAGE,
         "checkpoint id '../x' contains '..' at index 0 "
         "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"),
        ("DONE", f"{APP_MODULE}:other", EXIT_USAGE,
         "checkpoint 'DONE' belongs to pipeline 'rewind', not 'other'"),
        ("FAILED", f"{APP_MODULE}:without_review", EXIT_FAILED,
         "run 'failed': the checkpoint continues with agent 'review' (position 1 of the "
         "order), which this pipeline no longer has"),
    ],
)  # fmt: skip
def test_fork_refuses_a_checkpoint_and_stores_nothing(
    stored: Stored, checkpoint: str, app: str, code: int, message: str
) -> None:
    checkpoint, message = _named(stored, checkpoint, message)
    args = ["fork", checkpoint, "--app", app, "--data", '{"trail": []}']
    _refused(stored, args, code, message)


@pytest.mark.parametrize(
    ("app", "data", "message"),
    [
        ("typed", ["--data", '{"trail": "notalist"}'],
         "fork of checkpoint 'DONE' of run 'done': the data given does not fit the model "
         "Trail of agent 'review' (trail: Input should be a valid list); nothing was stored: "
         "give data that fits it"),
        ("signed", [],
         "fork of checkpoint 'DONE' of run 'done': the stored data of step 1 no longer fits "
         "the model Signed of agent 'review' (owner: Field required); nothing was stored: "
         "give data that fits it, or fork once the model fits the data again"),
    ],
    ids=["given", "the-checkpoints"],
)  # fmt: skip
def test_fork_with_data_the_next_agents_model_refuses_stores_nothing(
    stored: Stored, app: str, data: list[str], message: str
) -> None:
    """As nestegg resume refuses data that no longer fits: before the new run is stored."""
    checkpoint, message = _named(stored, "DONE", message)
    args = ["fork", checkpoint, "--app", f"{APP_MODULE}:{app}", "--run-id", "f2", *data]
    _refused(stored, args, EXIT_FAILED, message)
    fitting = nestegg(stored, *args[:6], "--data", '{"trail": ["draft"], "owner": "me"}')
    assert fitting.returncode == EXIT_OK, fitting.stderr
    assert list(_forks(stored)) == ["f2"]


def _forks_shown(stored: Stored, run_id: str, url: str | None = None) -> list[str]:
    """The lines ``nestegg show RUN`` lists the run's forks on (the store at ``url``, else
    the fixture's), the label taken off; and the same from --json."""

    def show(*args: str) -> str:
        if url is None:
            return nestegg(stored, "show", run_id, *args).stdout
        return run_nestegg(stored.folder, "show", run_id, *args, "--store", url).stdout

    lines = show().split("timeline\n", 1)[0].splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith("forks:")]
    shown = []
    if at:
        shown.append(lines[at[0]].removeprefix("forks:").strip())
        shown += [line.strip() for line in lines[at[0] + 1 :] if line.startswith(" ")]
    details = orjson.loads(show("--json"))
    assert details["forks_complete"] is True
    as_json = [f"{f['run_id']} at {f['checkpoint']} ({f['status']})" for f in details["forks"]]
    assert shown == as_json
    return shown


def test_show_lists_the_forks_made_deleted_and_imported(stored: Stored) -> None:
    for new_id in ("fork-a", "fork-b"):
        made = nestegg(stored, "fork", stored.done_first, "--app", APP, "--run-id", new_id)
        assert made.returncode == EXIT_OK, made.stderr
    listed = nestegg(stored, "checkpoints", "fork-a", "--json")
    fork_a_first = orjson.loads(listed.stdout)[0]["checkpoint_id"]
    made = nestegg(stored, "fork", fork_a_first, "--app", APP, "--run-id", "fork-a-1")
    assert made.returncode == EXIT_OK, made.stderr
    at = stored.done_first
    assert _forks_shown(stored, "done") == [f"fork-b at {at} (completed)",
                                            f"fork-a at {at} (completed)"]  # fmt: skip
    assert _forks_shown(stored, "fork-a") == [f"fork-a-1 at {fork_a_first} (completed)"]
    assert _forks_shown(stored, "failed") == _forks_shown(stored, "fork-a-1") == []
    deleted = nestegg(stored, "delete", "fork-b", "--yes")
    assert deleted.returncode == EXIT_OK, deleted.stderr
    assert _forks_shown(stored, "done") == [f"fork-a at {at} (completed)"]

    target = f"sqlite:///{stored.folder / 'imported.db'}"
    for run_id in ("fork-a-1", "fork-a", "done"):  # a fork before its parent
        if run_id == "done":  # not there yet: its forks name it
            shown = run_nestegg(stored.folder, "show", "done", "--store", target)
            assert shown.returncode == EXIT_NOT_FOUND, shown.stderr
        exported = stored.folder / f"{run_id}.json"
        assert nestegg(stored, "export", run_id, "-o", str(exported)).returncode == EXIT_OK
        imported = run_nestegg(stored.folder, "import", str(exported), "--store", target)
        assert imported.returncode == EXIT_OK, imported.stderr
    assert _forks_shown(stored, "done", target) == [f"fork-a at {at} (completed)"]
    assert _forks_shown(stored, "fork-a", target) == [f"fork-a-1 at {fork_a_first} (completed)"]


def test_fork_with_a_run_id_gives_the_new_run_that_id(stored: Stored) -> None:
    args = ["fork", stored.done_first, "--app", APP, "--run-id", "retry-1", "--json"]
    result = nestegg(stored, *args)
    assert result.returncode == EXIT_OK, result.stderr
    assert orjson.loads(result.stdout)["run_id"] == "retry-1"
    forked = _forks(stored)
    assert list(forked) == ["retry-1"]
    assert (forked["retry-1"]["run"]["parent_run"], forked["retry-1"]["run"]["status"]) == (
        "done",
        "completed",
    )
    plain = nestegg(stored, "fork", stored.done_first, "--app", APP, "--run-id", "retry-2")
    assert plain.stdout.startswith("run retry-2 completed: 3 steps (forked from run done")


@pytest.mark.parametrize(
    ("run_id", "code", "message"),
    [
        ("done", EXIT_FAILED, "run 'done' exists; choose another --run-id"),
        ("failed", EXIT_FAILED, "run 'failed' exists; choose another --run-id"),
        ("../x", EXIT_USAGE,
         "run id '../x' contains '..' at index 0 "
         "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"),
        ("", EXIT_USAGE, "run id must be a non-empty string, got ''"),
    ],
)  # fmt: skip
def test_fork_refuses_a_run_id_and_stores_nothing(
    stored: Stored, run_id: str, code: int, message: str
) -> None:
    args = ["fork", stored.done_first, "--app", APP, "--run-id", run_id]
    _refused(stored, args, code, message)


def test_a_fork_that_fails_in_a_step_stays_failed_and_names_its_run(stored: Stored) -> None:
    result = nestegg(stored, "fork", stored.done_first, "--app", APP, REWIND_FAIL="publish")
    assert result.returncode == EXIT_FAILED
    [(new_id, forked)] = _forks(stored).items()
    assert result.stderr == f"error: run {new_id!r} failed: RuntimeError: publish broke\n"
    assert forked["run"]["status"] == "failed"


def test_the_help_says_what_fork_and_resume_from_do(tmp_path: Path) -> None:
    fork = run_nestegg(tmp_path, "fork", "--help")
    assert fork.returncode == EXIT_OK
    assert fork.stdout.startswith("Usage: nestegg fork [OPTIONS] CHECKPOINT_ID\n")
    assert "Fork a new run from a checkpoint with the app's Clutch" in fork.stdout
    assert "--data JSON" in fork.stdout and "--data-file PATH" in fork.stdout
    assert "--run-id RUN_ID" in fork.stdout
    resume = run_nestegg(tmp_path, "resume", "--help")
    assert resume.returncode == EXIT_OK
    assert "--from CHECKPOINT_ID" in resume.stdout
    assert "With --from CHECKPOINT_ID it continues from that checkpoint" in resume.stdout


def _named(stored: Stored, checkpoint: str, message: str) -> tuple[str, str]:
    """``checkpoint`` and ``message`` with the names DONE and FAILED turned into the ids of
    the first checkpoints of the completed and the failed run."""
    names = {"DONE": stored.done_first, "FAILED": stored.failed_first}
    for name, value in names.items():
        message = message.replace(f"'{name}'", repr(value))
    return names.get(checkpoint, checkpoint), message


def _refused(stored: Stored, args: list[str], code: int, message: str) -> None:
    """``nestegg *args`` exits ``code`` with ``message``, stores nothing and runs no agent."""
    before, ran = snapshot(stored), stored.ran()
    result = nestegg(stored, *args)
    assert (result.returncode, result.stderr, result.stdout) == (code, f"error: {message}\n", "")
    assert snapshot(stored) == before
    assert stored.ran() == ran
