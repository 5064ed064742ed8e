"""A process committing many runs at once (group commits) is SIGKILLed: every step whose
commit it had acknowledged is in the store afterwards, on every store."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.crash.harness import CrashReport
from tests.registry import StoreTarget

CHILD = Path(__file__).with_name("group_child.py")
RUNS = 60
MIN_ACKS = 300
TIMEOUT_S = 60.0

pytestmark = pytest.mark.crash


async def _kill_mid_group_commit(
    target: StoreTarget, tmp_path: Path, rng: random.Random, report: CrashReport
) -> dict[str, int]:
    """Start the child, SIGKILL it a random moment after MIN_ACKS acknowledged commits;
    the highest acknowledged step of every run."""
    log = tmp_path / "acks.log"
    command = [sys.executable, str(CHILD), *target.args(), "--runs", str(RUNS), "--log", str(log)]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wanted = MIN_ACKS + rng.randrange(MIN_ACKS)
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        while not log.exists() or log.read_bytes().count(b"\n") < wanted:
            assert child.poll() is None, child.communicate()[1].decode()
            assert asyncio.get_running_loop().time() < deadline, "the child made no progress"
            await asyncio.sleep(0.002)
        await asyncio.sleep(rng.uniform(0, 0.01))
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    acked: dict[str, int] = defaultdict(int)
    for line in log.read_text().splitlines():
        if line.count(" ") == 1:  # a line cut by the kill is not an acknowledgement
            run_id, seq = line.split()
            acked[run_id] = max(acked[run_id], int(seq))
    report.note(f"killed after {sum(acked.values())} acknowledged commits of {len(acked)} runs")
    return acked


async def _every_acknowledged_step_is_stored(
    target: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    rng, report = crash_rng
    acked = await _kill_mid_group_commit(target, tmp_path, rng, report)
    assert len(acked) >= RUNS // 2, f"too few runs committed at once; {report}"
    store = target.open()
    try:
        await store.setup()
        for run_id, seq in acked.items():
            steps = [s.seq for s in await store.load_steps(run_id)]
            assert steps[:seq] == list(range(1, seq + 1)), f"{run_id} lost steps; {report}"
            run = await store.get_run(run_id)
            assert run is not None and run.step_seq >= seq, f"{run_id}: {report}"
    finally:
        await store.close()


async def test_group_commit_killed_keeps_every_acknowledged_step_embedded(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await _every_acknowledged_step_is_stored(embedded_store, tmp_path, crash_rng)


async def test_group_commit_killed_keeps_every_acknowledged_step_on_servers(
    server_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await _every_acknowledged_step_is_stored(server_store, tmp_path, crash_rng)
