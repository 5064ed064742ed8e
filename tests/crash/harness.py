"""Starting, killing and restarting the crash-test child, and checking what it left.

A kill lands at a random moment: either at a random time after the child started
(imports, store setup, loading the checkpoint, claiming the run) or a random few
milliseconds after the child logged a random number of new agent executions (mid-step,
mid-commit). Every random choice comes from one seeded ``random.Random``; the seed is
printed, and ``NESTEGG_CRASH_SEED`` replays it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nestegg import Clutch
from nestegg.checkpoint import MemoryCheckpointStorage
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import COMPLETED, RUN_COMPLETED, RUN_RESUMED, RUN_STARTED, STEP_COMPLETED
from tests.crash.child import (
    EXIT_LOCKED,
    EXIT_RUN_FAILED,
    PIPELINE_NAME,
    Workload,
    build_pipeline,
    checkpoint_config,
    initial_input,
)
from tests.registry import StoreTarget

CHILD = Path(__file__).with_name("child.py")
CRASH_SEED_ENV = "NESTEGG_CRASH_SEED"
POLL_S = 0.001
CHILD_TIMEOUT_S = 60.0
STARTUP_KILL_WINDOW_S = 0.6
"""Kills timed from the child's start land within this window (imports, setup, resume)."""
STARTUP_KILL_SHARE = 0.2
MAX_LINES_BEFORE_KILL = 4
MAX_KILL_DELAY_S = 0.02


@dataclass
class CrashReport:
    """The seed and everything random that happened, printed when a test fails."""

    seed: str
    events: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        """Remember (and print) one line of what happened."""
        self.events.append(line)
        print(line)

    def __str__(self) -> str:
        return f"replay with {CRASH_SEED_ENV}={self.seed}\n  " + "\n  ".join(self.events)


def new_rng(node_id: str) -> tuple[random.Random, CrashReport]:
    """A random generator for one test, seeded from ``NESTEGG_CRASH_SEED`` (or fresh)."""
    base = os.environ.get(CRASH_SEED_ENV) or str(random.SystemRandom().randrange(2**32))
    report = CrashReport(base)
    report.note(f"crash seed {CRASH_SEED_ENV}={base} ({node_id})")
    return random.Random(f"{base}:{node_id}"), report


def child_command(
    target: StoreTarget, strategy: str, run_id: str, steps: int, log: Path, *extra: str
) -> list[str]:
    """The command line that starts the child on ``target``."""
    return [
        sys.executable,
        str(CHILD),
        *target.args(),
        "--strategy", strategy,
        "--run-id", run_id,
        "--steps", str(steps),
        "--log", str(log),
        *extra,
    ]  # fmt: skip


def spawn(command: list[str]) -> subprocess.Popen[str]:
    """Start the child with its output captured."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def log_lines(log: Path, run_id: str | None = None) -> list[str]:
    """The lines of the execution log (of one run, or of every run)."""
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return []
    if run_id is None:
        return lines
    return [line for line in lines if line.split("/", 1)[0] == run_id]


def finish(process: subprocess.Popen[str], report: CrashReport) -> tuple[int, Any]:
    """Wait for the child; its exit code and the JSON it printed."""
    try:
        out, err = process.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the child hung; stderr:\n{err}\n{report}") from None
    if process.returncode not in (0, EXIT_LOCKED, EXIT_RUN_FAILED):
        raise AssertionError(f"the child exited {process.returncode}; stderr:\n{err}\n{report}")
    try:
        return process.returncode, json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise AssertionError(f"the child printed no JSON: {out!r}\n{err}\n{report}") from None


async def wait_for(condition: Any, *processes: subprocess.Popen[str]) -> bool:
    """Poll ``condition()`` until true (True) or until all ``processes`` exited (False)."""
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while not condition():
        if processes and all(process.poll() is not None for process in processes):
            return False
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the child")
        await asyncio.sleep(POLL_S)
    return True


def kill(process: subprocess.Popen[str]) -> bool:
    """SIGKILL the child if it still runs; True if it was killed."""
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.communicate()
    return process.returncode == -signal.SIGKILL


async def kill_at_random_moment(
    command: list[str], log: Path, rng: random.Random, report: CrashReport, mid_run: bool = False
) -> bool:
    """Start the child and SIGKILL it at a random moment; False if it finished first.

    With ``mid_run``, only after it executed at least one agent (so the run exists).
    """
    before = len(log_lines(log))
    process = spawn(command)
    if not mid_run and rng.random() < STARTUP_KILL_SHARE:
        # While it starts up, sets up the store, loads and claims the run: the kill comes
        # at a random time, or at the first execution, whichever is first.
        window = rng.uniform(0, STARTUP_KILL_WINDOW_S)
        lines, deadline, delay = 0, time.monotonic() + window, 0.0
        await wait_for(
            lambda: time.monotonic() >= deadline or len(log_lines(log)) > before, process
        )
    else:
        window, lines = 0.0, rng.randint(1, MAX_LINES_BEFORE_KILL)
        delay = rng.uniform(0, MAX_KILL_DELAY_S)
        await wait_for(lambda: len(log_lines(log)) >= before + lines, process)
        await asyncio.sleep(delay)
    killed = kill(process)
    if not killed:
        finish(process, report)
    after = len(log_lines(log))
    outcome = "killed" if killed else "finished first"
    if window:
        when = f"within {window * 1000:.0f} ms of the start"
    else:
        when = f"{delay * 1000:.1f} ms after {lines} new executions"
    report.note(f"kill {when}: {outcome}, {after - before} executions")
    return killed


async def crash_and_resume(
    command: list[str], log: Path, rng: random.Random, kills: int, report: CrashReport
) -> tuple[Any, int]:
    """Kill the child ``kills`` times at random moments, then let it finish.

    Returns:
        The result the last child printed, and how many times a child was killed.
    """
    killed = 0
    for _ in range(kills):
        if not await kill_at_random_moment(command, log, rng, report):
            break
        killed += 1
    code, result = finish(spawn(command), report)
    assert code == 0, f"the last child exited {code}: {result}\n{report}"
    return result, killed


@dataclass(frozen=True)
class Reference:
    """An uninterrupted run of the pipeline (``strategy``, ``length``): its result and how
    many steps it took."""

    strategy: str
    length: int
    result: Any
    steps: int
    seed: int = 0
    """The run's input is ``initial_input(seed)``."""

    def pipeline(self, store: CheckpointStorage) -> Clutch:
        """The same pipeline on ``store``, counting nothing."""
        return build_pipeline(self.strategy, self.length, Workload(), checkpoint_config(store))


_references: dict[tuple[str, int, int, int], Reference] = {}


async def reference_run(strategy: str, steps: int, seed: int = 0, calls: int = 0) -> Reference:
    """The uninterrupted run of the pipeline, in this process on the memory store."""
    key = (strategy, steps, seed, calls)
    if key not in _references:
        store = MemoryCheckpointStorage()
        work = Workload(calls=calls)
        clutch = build_pipeline(strategy, steps, work, checkpoint_config(store))
        result = await clutch.run(initial_input(seed), timeout=None, run_id="reference")
        (info,) = await clutch.list_runs()
        _references[key] = Reference(strategy, steps, result, info.steps, seed)
    return _references[key]


def expected_calls(run_id: str, reference: Reference, calls: int) -> set[str]:
    """The calls an uninterrupted run makes: ``run_id/agent/turn/position``."""
    trail = reference.result["trail"]
    return {f"{run_id}/{a}/{turn}/{p}" for turn, a in enumerate(trail) for p in range(calls)}


def calls_made(calls_log: Path, run_id: str) -> Counter[str]:
    """How many times each call was really made (``run_id/agent/turn/position``)."""
    return Counter(line.rsplit("/", 1)[0] for line in log_lines(calls_log, run_id))


async def run_status(target: StoreTarget, run_id: str) -> str | None:
    """The stored status of a run (None if there is no such run)."""
    store = target.open()
    try:
        await store.setup()
        run = await store.get_run(run_id)
    finally:
        await store.close()
    return run.status if run is not None else None


async def stored_event_kinds(target: StoreTarget, run_id: str) -> list[str]:
    """The kinds of a run's stored events, in order."""
    store = target.open()
    try:
        await store.setup()
        return [record.kind for record in await store.read_events(run_id)]
    finally:
        await store.close()


async def check_run(
    target: StoreTarget,
    run_id: str,
    reference: Reference,
    executions: int,
    kills: int,
    report: CrashReport,
) -> None:
    """Check a run that was killed ``kills`` times and then finished.

    It completed with the reference's steps; at most one step per kill ran twice; the
    event log has strictly increasing seqs without gaps, one run_started first, one
    run_completed last, one step_completed per step and at most one run_resumed per kill;
    and run() of the same id returns the stored result without recording anything.
    """
    assert reference.steps <= executions <= reference.steps + kills, (
        f"{executions} executions for {reference.steps} steps and {kills} kills\n{report}"
    )
    store = target.open()
    try:
        clutch = reference.pipeline(store)
        (info,) = [r for r in await clutch.list_runs() if r.run_id == run_id]
        assert info.status == COMPLETED, f"{info}\n{report}"
        assert info.pipeline == PIPELINE_NAME
        assert info.steps == reference.steps, f"{info}\n{report}"
        events = await clutch.events(run_id)
        check_events(events, reference.steps, kills, report)
        again = await clutch.run(initial_input(reference.seed), timeout=None, run_id=run_id)
        assert again == reference.result, f"stored result differs\n{report}"
        assert len(await clutch.events(run_id)) == len(events), "run() executed again"
    finally:
        await store.close()


def check_events(events: list[Any], steps: int, kills: int, report: CrashReport) -> None:
    """The event log of a completed run that was resumed after at most ``kills`` kills."""
    seqs = [event.seq for event in events]
    assert seqs == list(range(1, len(events) + 1)), f"event seqs {seqs}\n{report}"
    kinds = Counter(event.kind for event in events)
    assert events[0].kind == RUN_STARTED and kinds[RUN_STARTED] == 1, f"{kinds}\n{report}"
    assert events[-1].kind == RUN_COMPLETED and kinds[RUN_COMPLETED] == 1, f"{kinds}\n{report}"
    assert kinds[RUN_RESUMED] <= kills, f"{kinds[RUN_RESUMED]} resumes, {kills} kills\n{report}"
    completed = [event.data["seq"] for event in events if event.kind == STEP_COMPLETED]
    assert completed == list(range(1, steps + 1)), f"step_completed seqs {completed}\n{report}"
