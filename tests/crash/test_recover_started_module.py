"""A pipeline started as a script or with ``python -m``, SIGKILLed mid-step, is recovered by
``nestegg recover --app module:clutch`` in another process: its journaled calls replay
(the functions have the same names in both processes), nothing is paid twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from nestegg.constants import HOME_ENV, STORE_ENV

pytestmark = pytest.mark.crash

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60
HANG_ENV = "FLOW_HANG"
LOG_ENV = "FLOW_LOG"

FLOW = """
import asyncio, enum, os, sys
from pathlib import Path

import nestegg
from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig

clutch = Clutch("flow", checkpoint=CheckpointConfig())


class Kind(enum.Enum):
    BILLING = "billing"


def paid(what):
    with Path(os.environ["FLOW_LOG"]).open("a") as log:
        log.write(what + "\\n")


@nestegg.durable
async def expensive(x):
    paid(f"expensive {x}")
    return f"e-{x}"


async def lookup(x):
    paid(f"lookup {x}")
    return f"l-{x}"


@clutch.agent()
async def first(data):
    a, b = await expensive(data["n"]), await nestegg.call(lookup, data["n"])
    return {**data, "a": a, "b": b, "kind": Kind.BILLING}


@clutch.agent()
async def second(data):
    c = await expensive(data["a"])
    if os.environ.get("FLOW_HANG"):
        paid("hang")
        await asyncio.sleep(60)
    return {**data, "c": c, "kind_is_a_member": data["kind"] is Kind.BILLING}


if __name__ == "__main__":
    asyncio.run(clutch.run({"n": 1}, run_id=sys.argv[1], timeout=None))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, HANG_ENV, "PYTHONPATH")}
    return {**env, HOME_ENV: str(tmp_path / "home"), **extra}


def _nestegg(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nestegg.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _kill_when(process: subprocess.Popen[bytes], log: Path, line: str) -> None:
    """SIGKILL ``process`` as soon as ``log`` holds ``line``."""
    deadline = time.monotonic() + TIMEOUT
    while line not in _lines(log):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "the pipeline never got to the kill point"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=TIMEOUT)
    assert process.returncode == -signal.SIGKILL


def _killed_at(cwd: Path, env: dict[str, str], args: list[str], log: Path, line: str) -> None:
    """Start ``python *args`` in ``cwd`` and SIGKILL it as soon as ``log`` holds ``line``."""
    child = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _kill_when(child, log, line)


def _recovered(cwd: Path, env: dict[str, str], app: str, run_id: str) -> dict[str, object]:
    """Recover through the command; the run's row as ``nestegg runs --json`` gives it."""
    recovered = _nestegg(cwd, env, "recover", "--app", app)
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert recovered.stdout.splitlines()[-1] == (
        "recovered 1 of 1 run; 0 failed, 0 taken by another process"
    ), recovered.stdout
    listed = _nestegg(cwd, env, "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in orjson.loads(listed.stdout) if r["run_id"] == run_id]
    return dict(row)


@pytest.mark.parametrize("start", [["-m", "flows.mod"], ["flows/mod.py"]], ids=["-m", "path"])
def test_a_killed_run_started_as_a_module_or_a_file_is_recovered_by_the_command(
    tmp_path: Path, start: list[str]
) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "mod.py").write_text(FLOW)
    log = tmp_path / "paid.log"
    env = _env(tmp_path, **{LOG_ENV: str(log)})
    _killed_at(tmp_path, {**env, HANG_ENV: "1"}, [*start, "flow-1"], log, "hang")
    assert _lines(log) == ["expensive 1", "lookup 1", "expensive e-1", "hang"]

    row = _recovered(tmp_path, env, "flows.mod:clutch", "flow-1")

    assert row["status"] == "completed" and row["steps"] == 2
    shown = _nestegg(tmp_path, env, "show", "flow-1", "--json")
    result = orjson.loads(shown.stdout)["result"]
    # The Enum the killed process stored came back as the member the module defines.
    assert result["c"] == "e-e-1" and result["kind_is_a_member"] is True
    # The resumed step replayed its journaled call; nothing was paid again.
    assert _lines(log) == ["expensive 1", "lookup 1", "expensive e-1", "hang"]


def test_the_readme_recover_command_resumes_a_crashed_demo_run(tmp_path: Path) -> None:
    calls = tmp_path / "demo-calls.log"
    env = _env(tmp_path, DEMO_CALL_LOG=str(calls))
    crashed = subprocess.run(
        [sys.executable, "examples/demo.py", "--child", "demo-crashed"],
        cwd=ROOT,
        env={**env, "DEMO_CRASH": "1"},
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    before = len(_lines(calls))
    assert before == 4  # fetch, summarize, two of classify's four

    row = _recovered(ROOT, env, "examples.demo:pipeline", "demo-crashed")

    assert row["status"] == "completed" and row["steps"] == 4
    assert len(_lines(calls)) - before == 3  # classify's last two, report's one


def test_a_run_resumed_with_its_module_named_otherwise_fails_and_says_how_to_go_on(
    tmp_path: Path,
) -> None:
    # A parent directory on PYTHONPATH names the script's module scratch.pipe in the
    # journal; --app pipe:clutch imports it as pipe: the same functions, named otherwise.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "__init__.py").write_text("")
    (scratch / "pipe.py").write_text(FLOW)
    log = tmp_path / "paid.log"
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    env[LOG_ENV] = str(log)
    _killed_at(scratch, {**env, HANG_ENV: "1"}, ["pipe.py", "k1"], log, "hang")
    paid = ["expensive 1", "lookup 1", "expensive e-1", "hang"]
    assert _lines(log) == paid

    misnamed = _nestegg(scratch, env, "resume", "k1", "--app", "pipe:clutch")

    assert misnamed.returncode == 1, misnamed.stdout + misnamed.stderr
    said = misnamed.stderr
    assert "recorded scratch.pipe.expensive(" in said and "now calls pipe.expensive(" in said
    assert "imported as 'pipe' but journaled as 'scratch.pipe'" in said
    assert said.rstrip().endswith(
        "run 'k1' failed: resume it with: nestegg resume k1 --app scratch.pipe:clutch"
    ), said
    listed = _nestegg(scratch, env, "runs", "--status", "failed", "--json")
    assert [row["run_id"] for row in orjson.loads(listed.stdout)] == ["k1"], listed.stderr
    assert _lines(log) == paid

    resumed = _nestegg(scratch, env, "resume", "k1", "--app", "scratch.pipe:clutch")

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.startswith("run k1 completed: 2 steps"), resumed.stdout
    assert _lines(log) == paid  # the journaled call replayed: nothing paid again
