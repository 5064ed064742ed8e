"""Waits across real processes, on every store that processes share: a run waits and its
process exits; another process signals it and gets the result; SIGKILLs before the wait
and during the signal's resume lose nothing and pay for the quote once."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

from tests.registry import StoreTarget
from tests.waits.pipeline import KILL_ENV, quotes

TIMEOUT_S = 60


def _command(target: StoreTarget, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.waits.child", *target.args(), *args]


def _run(target: StoreTarget, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        _command(target, *args), capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stderr
    outcome: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return outcome


async def _killed_at(target: StoreTarget, where: str, ledger: Path, *args: str) -> None:
    """Start the child with the kill point ``where``, SIGKILL it once it is there."""
    env = {**os.environ, KILL_ENV: where}
    child = subprocess.Popen(
        _command(target, *args), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        for _ in range(TIMEOUT_S * 20):
            if ledger.exists() and f"paused {where}" in ledger.read_text():
                break
            assert child.poll() is None, child.communicate()[1]
            await asyncio.sleep(0.05)
    finally:
        child.kill()
        child.communicate()


def _result(outcome: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = outcome["result"]
    return result


async def test_a_signal_from_another_process_resumes_the_run(
    target: StoreTarget, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    assert _run(target, "start", "p1", str(ledger)) == {"waiting": "approval", "run_id": "p1"}
    result = _result(_run(target, "signal", "p1"))
    assert (result["status"], result["by"], result["settled"]) == ("approved", "ann", True)
    assert quotes(ledger) == 1


async def test_a_kill_before_the_wait_and_one_during_the_resume_pay_once(
    target: StoreTarget, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger"
    await _killed_at(target, "before-wait", ledger, "start", "p2", str(ledger))
    waiting = _result(_run(target, "recover"))["p2"]
    assert waiting.startswith("RunWaiting(") and "waits for signal 'approval'" in waiting
    assert quotes(ledger) == 1
    await _killed_at(target, "after-signal", ledger, "signal", "p2")
    recovered = _result(_run(target, "recover"))
    assert "'status': 'approved'" in recovered["p2"] and "'settled': True" in recovered["p2"]
    assert quotes(ledger) == 1
