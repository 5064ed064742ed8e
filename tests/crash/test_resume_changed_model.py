"""A run SIGKILLed mid-step whose pydantic model then changes: ``nestegg resume`` and
``clutch.resume_latest`` refuse it with IncompatibleDataError before claiming it (``nestegg
recover`` reports it refused), leaving it interrupted and untouched; with the model as it
was, it resumes and completes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.crash.test_recover_started_module import (
    LOG_ENV,
    ROOT,
    TIMEOUT,
    _env,
    _killed_at,
    _nestegg,
)

pytestmark = pytest.mark.crash

FLOW = """
import asyncio, os, sys
from pathlib import Path

from pydantic import BaseModel

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig

clutch = Clutch("docs", checkpoint=CheckpointConfig())


class Doc(BaseModel):
    title: str


def ran(what):
    with Path(os.environ["FLOW_LOG"]).open("a") as log:
        log.write(what + "\\n")


async def step(doc, name):
    ran(name)
    if os.environ.get("FLOW_HANG") == name:
        await asyncio.sleep(60)
    return Doc(title=f"{doc.title} {name}ed")


@clutch.agent()
async def draft(doc: Doc) -> Doc:
    return await step(doc, "draft")


@clutch.agent()
async def review(doc: Doc) -> Doc:
    return await step(doc, "review")


if __name__ == "__main__":
    asyncio.run(clutch.run(Doc(title="t"), run_id=sys.argv[1], timeout=None))
"""

ORIGINAL = "class Doc(BaseModel):\n    title: str\n"
CHANGED = "class Doc(BaseModel):\n    title: str\n    pages: int\n"

RESUME_LATEST = """
import asyncio, sys

from docs import clutch
from nestegg.errors import IncompatibleDataError


async def main():
    async with clutch:
        try:
            await clutch.resume_latest(sys.argv[1])
        except IncompatibleDataError as error:
            print(type(error).__name__, error.step, error.agent, error.model, error.reason)


asyncio.run(main())
"""


def _stored(cwd: Path, env: dict[str, str], run_id: str) -> tuple[object, ...]:
    """What the store holds of the run, as the commands show it."""
    shown = _nestegg(cwd, env, "show", run_id, "--json")
    events = _nestegg(cwd, env, "events", run_id, "--json")
    listed = _nestegg(cwd, env, "runs", "--json")
    assert shown.returncode == events.returncode == listed.returncode == 0, shown.stderr
    [row] = [r for r in orjson.loads(listed.stdout) if r["run_id"] == run_id]
    logged = [orjson.loads(line) for line in events.stdout.splitlines()]
    return orjson.loads(shown.stdout), logged, row


@pytest.mark.parametrize(
    ("hang", "stored"),
    [("review", "the stored data of step 1"), ("draft", "the run's input")],
    ids=["step-2", "step-1"],
)
def test_a_killed_run_whose_model_changed_is_refused_by_resume_and_left_interrupted(
    tmp_path: Path, hang: str, stored: str
) -> None:
    flow = tmp_path / "docs.py"
    flow.write_text(FLOW)
    log = tmp_path / "ran.log"
    env = _env(tmp_path, **{LOG_ENV: str(log)})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    _killed_at(tmp_path, {**env, "FLOW_HANG": hang}, ["docs.py", "m1"], log, hang)  # in the step
    before = _stored(tmp_path, env, "m1")
    assert (before[2]["status"], before[2]["interrupted"]) == ("running", True)
    flow.write_text(FLOW.replace(ORIGINAL, CHANGED))  # a required field more

    refused = _nestegg(tmp_path, env, "resume", "m1", "--app", "docs:clutch")

    assert refused.returncode == 1, refused.stdout + refused.stderr
    agent = hang
    reason = (
        f"run 'm1': {stored} no longer fits the model Doc of agent {agent!r} "
        "(pages: Field required); nothing was changed: resume it once the model fits the "
        "data again"
    )
    assert refused.stderr == f"error: {reason}\n"
    recovered = _nestegg(tmp_path, env, "recover", "--app", "docs:clutch", "--json")
    assert recovered.returncode == 1, recovered.stdout + recovered.stderr
    report = orjson.loads(recovered.stdout)  # refused, not failed: nothing was changed
    assert report["runs"] == [{"run_id": "m1", "outcome": "refused", "error": reason}]
    assert (report["refused"], report["failed"]) == (1, 0)
    script = subprocess.run(
        [sys.executable, "-c", RESUME_LATEST, "m1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert script.returncode == 0, script.stderr
    step = 1 if hang == "review" else 0
    assert script.stdout == f"IncompatibleDataError {step} {hang} Doc pages: Field required\n"
    assert _stored(tmp_path, env, "m1") == before  # still interrupted, nothing written
    ran = log.read_text().splitlines()

    flow.write_text(FLOW)  # the model as it was
    resumed = _nestegg(tmp_path, env, "resume", "m1", "--app", "docs:clutch")

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.startswith("run m1 completed: 2 steps (was interrupted at step"), resumed
    assert '"title":"t drafted reviewed"' in resumed.stdout
    assert log.read_text().splitlines()[len(ran) :] == (
        ["review"] if hang == "review" else ["draft", "review"]
    )
