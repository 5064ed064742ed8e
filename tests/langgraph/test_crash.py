"""A process SIGKILLed mid-graph resumes from the last checkpoint (real subprocesses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from nestegg.langgraph import NestEggSaver
from tests.langgraph.crash_child import open_store
from tests.servers import delete_redis_keys, drop_postgres_tables

CHILD = Path(__file__).with_name("crash_child.py")
STEPS = 40


def _location(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return str(tmp_path / "graph.db")
    if kind == "postgres":
        return f"{request.getfixturevalue('pg_url')}|t{uuid.uuid4().hex[:12]}_"
    return f"{request.getfixturevalue('redis_url')}|nestegg-test:{uuid.uuid4().hex[:12]}:"


def _executions(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@pytest.mark.crash
@pytest.mark.parametrize(
    "kind",
    [
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.server),
        pytest.param("redis", marks=pytest.mark.server),
    ],
)
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
        if kind == "postgres":
            await drop_postgres_tables(*location.split("|"))
        elif kind == "redis":
            await delete_redis_keys(*location.split("|"))
