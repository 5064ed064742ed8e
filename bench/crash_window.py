"""What a SIGKILL costs in journaled calls paid twice, with many runs in one process.

A child process runs N runs at once on one SQLite store, each of M steps of one agent
that makes two journaled calls a step (``nestegg.call``), each call waiting about
``--think`` ms (0.5 to 1.5 times), as a call to a model waits. Each call appends a line
when it starts and when it returns to a log (the process's pid, the call's key, the
time). The parent SIGKILLs the child ``--kill-after`` seconds in, then recovers every run
in its own process (``clutch.recover()``), its calls logged the same way, and counts:

- the calls the child started and that returned before the kill;
- of those, the ones made again after it (paid twice): their result had returned but its
  commit had not been written (a journal entry waits in the store's commit queue, which
  grows with the runs a process holds);
- the calls in flight at the kill (started, not returned), which a resume makes again
  whatever the store does;
- for the calls paid twice, how long before the kill they had returned (p50, max).

Each row runs with the store's ``max_pending_commits`` as given (``--pending 64 none``:
with a limit of 64 and with none), alternated in each repetition. nestegg makes the
calls of a resumed step again only from the first whose journal entry is missing, and
never one whose entry was written.

Usage:
    .venv-bench/bin/python bench/crash_window.py [--runs 2000] [--steps 4] [--think 500]
        [--kill-after 6] [--pending 64 none] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage

LOG_ENV = "CRASH_WINDOW_LOG"
THINK_ENV = "CRASH_WINDOW_THINK"


def _log(kind: str, key: str) -> None:
    line = f"{os.getpid()} {kind} {key} {time.time():.6f}\n"
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def model(key: str) -> str:
    """Stands in for a paid call to a model: it waits, and logs its start and return."""
    _log("start", key)
    think = float(os.environ.get(THINK_ENV, "500")) / 1000
    await asyncio.sleep(think * random.uniform(0.5, 1.5))
    _log("done", key)
    return "answer " * 40


def build(path: Path, pending: int | None, steps: int) -> Clutch:
    store = SQLiteCheckpointStorage(path, max_pending_commits=pending)
    clutch = Clutch(
        "window",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=store),
    )

    @clutch.agent()
    async def ask(data: dict[str, Any]) -> dict[str, Any]:
        key = f"{data['run']}/{data['turn']}"
        first = await nestegg.call(model, f"{key}/0")
        second = await nestegg.call(model, f"{key}/1")
        return {**data, "turn": data["turn"] + 1, "last": first[:10] + second[:10]}

    return clutch


async def child(path: Path, runs: int, pending: int | None, steps: int) -> None:
    clutch = build(path, pending, steps)
    await asyncio.gather(
        *(clutch.run({"run": f"r{i}", "turn": 0}, run_id=f"r{i}") for i in range(runs))
    )


async def recover(path: Path, pending: int | None, steps: int) -> int:
    clutch = build(path, pending, steps)
    try:
        outcomes = await clutch.recover()
    finally:
        await clutch.stop()
    return sum(not isinstance(o, BaseException) for o in outcomes.values())


def one_row(args: argparse.Namespace, pending: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        path, log = Path(scratch) / "runs.db", Path(scratch) / "calls.log"
        env = {**os.environ, LOG_ENV: str(log), THINK_ENV: str(args.think)}
        command = [sys.executable, __file__, "--child", str(path), "--runs", str(args.runs)]
        command += [
            "--steps",
            str(args.steps),
            "--pending",
            "none" if pending is None else str(pending),
        ]
        process = subprocess.Popen(command, env=env)
        time.sleep(args.kill_after)
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = time.time()
        os.environ[LOG_ENV], os.environ[THINK_ENV] = str(log), str(args.think)
        recovered = asyncio.run(recover(path, pending, args.steps))
        started: set[str] = set()
        returned: dict[str, float] = {}
        again: set[str] = set()
        for line in log.read_text().splitlines():
            pid, kind, key, at = line.split()
            if int(pid) == process.pid:
                if kind == "start":
                    started.add(key)
                else:
                    returned[key] = float(at)
            elif kind == "start":
                again.add(key)
        twice = sorted(killed_at - returned[key] for key in again if key in returned)
        return {
            "pending": "none" if pending is None else str(pending),
            "returned": len(returned),
            "twice": len(twice),
            "in_flight": len(started - set(returned)),
            "p50": statistics.median(twice) * 1000 if twice else 0.0,
            "max": twice[-1] * 1000 if twice else 0.0,
            "recovered": recovered,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=Path)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--think", type=float, default=500)
    parser.add_argument("--kill-after", type=float, default=6.0)
    parser.add_argument("--pending", nargs="+", default=["64", "none"])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    limits = [None if p == "none" else int(p) for p in args.pending]
    if args.child is not None:
        asyncio.run(child(args.child, args.runs, limits[0], args.steps))
        return
    rows: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        for pending in limits:
            print(f"{args.runs} runs, max pending commits {pending}, repetition {rep + 1}")
            row = one_row(args, pending)
            rows.setdefault(row["pending"], []).append(row)
    print(f"\n### SIGKILL after {args.kill_after:g} s: {args.runs} runs of {args.steps} steps,")
    print(f"two journaled calls a step, each waiting ~{args.think:g} ms (medians of {args.reps})\n")
    print(
        "| max pending | calls returned before the kill | of them paid again | in flight "
        "(made again) | paid again: returned before the kill, p50 / max | runs recovered |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, reps in rows.items():
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if k != "pending"}
        print(
            f"| {name} | {med['returned']:,.0f} | {med['twice']:,.0f} | {med['in_flight']:,.0f} "
            f"| {med['p50']:.0f} / {med['max']:.0f} ms | {med['recovered']:,.0f} |"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n- load averages at the end {load}")


if __name__ == "__main__":
    main()
