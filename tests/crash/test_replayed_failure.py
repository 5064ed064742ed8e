"""A run SIGKILLed after its agent caught a journaled call's failure (``except NotFound``,
``except KeyError``) and fell back, then resumed by ``nestegg resume``: the replayed
failures are caught by the same clauses, so the run completes with the fallbacks as the
uninterrupted run does, and the failed calls are not made again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.crash.test_recover_started_module import (
    HANG_ENV,
    LOG_ENV,
    ROOT,
    TIMEOUT,
    _env,
    _killed_at,
    _lines,
    _nestegg,
)

pytestmark = pytest.mark.crash

FLOW = """
import asyncio, os, sys
from pathlib import Path

import nestegg
from nestegg import Clutch, RetryPolicy
from nestegg.checkpoint import CheckpointConfig

clutch = Clutch("fallbacks", checkpoint=CheckpointConfig())


def paid(what):
    with Path(os.environ["FLOW_LOG"]).open("a") as log:
        log.write(what + "\\n")


class NotFound(LookupError):
    def __init__(self, key, where):
        super().__init__(f"{key} not in {where}")


@nestegg.durable(retry=RetryPolicy(attempts=1))
async def lookup(key):
    paid(f"lookup {key}")
    raise NotFound(key, "the index")


@nestegg.durable
async def cached(key):
    paid(f"cached {key}")
    raise KeyError(key)


@nestegg.durable
async def slow(key):
    paid(f"slow {key}")
    if os.environ.get("FLOW_HANG"):
        await asyncio.sleep(60)
    return f"slow-{key}"


@clutch.agent()
async def answer(data):
    try:
        found = await lookup("x")
    except NotFound:
        found = "fallback"
    try:
        hit = await cached("y")
    except KeyError:
        hit = "miss"
    return {**data, "found": found, "hit": hit, "slow": await slow("z")}


if __name__ == "__main__":
    print(asyncio.run(clutch.run({"n": 1}, run_id=sys.argv[1], timeout=None)))
"""

PAID = ["lookup x", "cached y", "slow z"]
RESULT = {"n": 1, "found": "fallback", "hit": "miss", "slow": "slow-z"}


def test_a_killed_run_whose_agent_caught_failures_resumes_to_the_same_fallbacks(
    tmp_path: Path,
) -> None:
    (tmp_path / "flow.py").write_text(FLOW)
    log = tmp_path / "paid.log"
    env = _env(tmp_path, **{LOG_ENV: str(log)})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    uninterrupted = subprocess.run(
        [sys.executable, "flow.py", "whole"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    assert _lines(log) == PAID
    log.unlink()
    # A real kill, in the step, after both failures were journaled.
    _killed_at(tmp_path, {**env, HANG_ENV: "1"}, ["flow.py", "k3"], log, "slow z")

    resumed = _nestegg(tmp_path, env, "resume", "k3", "--app", "flow:clutch")

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.startswith("run k3 completed: 1 step"), resumed.stdout
    shown = _nestegg(tmp_path, env, "show", "k3", "--json")
    assert orjson.loads(shown.stdout)["result"] == RESULT
    whole = _nestegg(tmp_path, env, "show", "whole", "--json")
    assert orjson.loads(whole.stdout)["result"] == RESULT  # as if it was never killed
    assert _lines(log) == [*PAID, "slow z"]  # the failed calls were replayed, not made


OUTAGE = """
import asyncio, os, sys
from pathlib import Path

import nestegg
from nestegg import Clutch, RetryPolicy
from nestegg.checkpoint import CheckpointConfig

clutch = Clutch("outage", checkpoint=CheckpointConfig())


def paid(what):
    with Path(os.environ["FLOW_LOG"]).open("a") as log:
        log.write(what + "\\n")


@nestegg.durable(retry=RetryPolicy(attempts=1))
async def call(key):
    paid(key)
    if key == "b" and os.environ.get("FLOW_DOWN"):
        raise ConnectionError("b is down")
    if key == "slow x" and os.environ.get("FLOW_HANG"):
        await asyncio.sleep(60)
    return key


@clutch.agent()
async def answer(data):
    first = await call("a")
    try:
        second = await call("b")
    except ConnectionError:
        await call("c")  # the failed attempt's way on: then it fails the run
        raise
    return {**data, "got": [first, second, await call("slow x")]}


if __name__ == "__main__":
    print(asyncio.run(clutch.run({"n": 1}, run_id=sys.argv[1], timeout=None)))
"""


def test_a_failed_run_resumed_then_killed_on_another_way_resumes_again(tmp_path: Path) -> None:
    # The killed resume had made the failed call again, which took the step another way;
    # the next resume met the failed attempt's entry after it ("c" where "slow x" now is)
    # and failed the run with a NonDeterminismError.
    (tmp_path / "outage.py").write_text(OUTAGE)
    log = tmp_path / "paid.log"
    env = _env(tmp_path, **{LOG_ENV: str(log)})
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    failed = subprocess.run(
        [sys.executable, "outage.py", "o1"],
        cwd=tmp_path,
        env={**env, "FLOW_DOWN": "1"},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )
    assert failed.returncode == 1 and "b is down" in failed.stderr, failed.stderr
    assert _lines(log) == ["a", "b", "c"]
    resume = [sys.executable, "-m", "nestegg.cli", "resume", "o1", "--app", "outage:clutch"]
    _killed_at(tmp_path, {**env, HANG_ENV: "1"}, resume[1:], log, "slow x")

    resumed = _nestegg(tmp_path, env, "resume", "o1", "--app", "outage:clutch")

    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    shown = _nestegg(tmp_path, env, "show", "o1", "--json")
    assert orjson.loads(shown.stdout)["result"] == {"n": 1, "got": ["a", "b", "slow x"]}
    # "a" replayed throughout; the new "b" replayed after the kill; "slow x" was in flight
    assert _lines(log) == ["a", "b", "c", "b", "slow x", "slow x"]
