"""A process SIGKILLed mid-graph resumes from the last checkpoint (real subprocesses)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from nestegg.langgraph import NestEggSaver
from tests.langgraph.crash_child import open_store
from tests.servers import delete_redis_keys, drop_postgres_tables

CHILD = Path(__file__).with_name("crash_child.py")
STEPS = 40
KINDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.server),
    pytest.param("redis", marks=pytest.mark.server),
]


def _location(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return str(tmp_path / "graph.db")
    if kind == "postgres":
        return f"{request.getfixturevalue('pg_url')}|t{uuid.uuid4().hex[:12]}_"
    return f"{request.getfixturevalue('redis_url')}|nestegg-test:{uuid.uuid4().hex[:12]}:"


async def _drop(kind: str, location: str) -> None:
    if kind == "postgres":
        await drop_postgres_tables(*location.split("|"))
    elif kind == "redis":
        await delete_redis_keys(*location.split("|"))


def _executions(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.mark.crash
@pytest.mark.parametrize("kind", KINDS)
async def test_a_killed_graph_resumes_from_its_last_checkpoint(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    location = _location(kind, tmp_path, request)
    log = tmp_path / "executions.log"
    args = [sys.executable, str(CHILD), kind, location, "thread-1", str(STEPS), str(log)]
    try:
        child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while len(_executions(log)) < 12 and child.poll() is None:
            assert time.monotonic() < deadline, "the child made no progress"
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL
        before = _executions(log)
        assert 12 <= len(before) < STEPS

        done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(STEPS), str(STEPS)]
        after = _executions(log)[len(before) :]
        # The second process started from the last committed checkpoint: at most the
        # step in flight when the kill landed runs again, nothing before it.
        assert after[0] >= before[-1] - 1 and after == list(range(after[0], STEPS + 1))

        with NestEggSaver(open_store(kind, location), close_storage=True) as saver:
            items = saver.get_tuple({"configurable": {"thread_id": "thread-1"}})
            assert items is not None
            values = items.checkpoint["channel_values"]["items"]
            assert values == [f"item-{turn}" for turn in range(1, STEPS + 1)]
    finally:
        await _drop(kind, location)


PARALLEL_CHILD = Path(__file__).with_name("parallel_child.py")


def _parallel(saver: str, location: str, log: Path, mode: str) -> Any:
    args = [sys.executable, str(PARALLEL_CHILD), saver, location, str(log), mode]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _killed_while_p2_runs(saver: str, location: str, log: Path) -> Any:
    """Run the parallel graph, SIGKILL it well after p1 ended while p2 runs, and return
    what the thread holds then."""
    args = [sys.executable, str(PARALLEL_CHILD), saver, location, str(log), "run"]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not log.exists() and child.poll() is None:
        assert time.monotonic() < deadline, "the child made no progress"
        time.sleep(0.002)
    time.sleep(0.5)  # ten times DEFERRED_WRITES_DELAY after p1 ended; p2 sleeps a minute
    os.kill(child.pid, signal.SIGKILL)
    _, stderr = child.communicate()
    assert child.returncode == -signal.SIGKILL, stderr
    return _parallel(saver, location, log, "state")


@pytest.mark.crash
@pytest.mark.parametrize("kind", KINDS)
async def test_a_task_that_ended_while_its_sibling_runs_is_not_run_again_after_a_kill(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    theirs = _killed_while_p2_runs("langgraph", str(tmp_path / "lg.db"), tmp_path / "lg.log")
    assert theirs["next"] == ["p2"]
    location = _location(kind, tmp_path, request)
    log = tmp_path / "p1.log"
    try:
        ours = _killed_while_p2_runs(kind, location, log)
        # As on LangGraph's SqliteSaver: p1's writes were committed before the kill.
        assert ours == theirs
        result = _parallel(kind, location, log, "resume")
        assert result["log"] == ["a", "p1", "p2", "c"]
        assert log.read_text().split() == ["p1"]  # p1 was not called again
    finally:
        await _drop(kind, location)
