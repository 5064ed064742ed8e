"""The SQLite store's group commit alone: what a batch of many runs' step commits costs the
writer, by batch size, with no event loop beside it.

N runs are created and claimed through the store's API; then their step commits (the
workload of ``sqlite_commit.py``: one ~1.2 KB step record, 3 events, one checkpoint,
pruning to the newest 3, the run row's fields), M steps of each run, are written in
batches of B commits by the function the store's writer thread runs for a batch
(``commit_batch``), on a connection of the store's settings (WAL, ``synchronous=NORMAL``),
in this thread. Printed per batch size: the wall and CPU time a commit, medians of the
rounds. Beside ``concurrent_runs.py --pending``: whether a smaller batch costs SQLite more
a commit, or the process around it.

    .venv-bench/bin/python bench/sqlite_batches.py [--runs 1000] [--steps 20]
        [--batches 32 64 384] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import sqlite_commit

from nestegg.checkpoint.codec import seal_json
from nestegg.checkpoint.records import Commit, Owner, RunRecord
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.sqlite.commits import commit_batch


async def _created(path: Path, runs: int) -> dict[str, int]:
    """Create and claim ``runs`` runs in a new store at ``path``: their fences by id."""
    store = SQLiteCheckpointStorage(path)
    now = time.time()
    fences = {}
    owner = Owner("bench", os.getpid(), "0")
    for index in range(runs):
        run_id = f"run-{index}"
        await store.create_run(RunRecord(run_id, "bench", "running", seal_json({}), now, now))
        fences[run_id] = (await store.claim_run(run_id, 1, owner, now + 3600, now)).fence
    await store.close()
    return fences


def _commits(fences: dict[str, int], steps: int) -> list[Commit]:
    """Every run's step commits, step by step (each batch holds one commit of a run)."""
    kept: dict[str, list[str]] = {run_id: [] for run_id in fences}
    commits = []
    for seq in range(1, steps + 1):
        for run_id, fence in fences.items():
            sqlite_commit.RUN_ID = run_id  # the id its step_commit writes
            commits.append(sqlite_commit.step_commit(fence, seq, kept[run_id]))
    return commits


def one_round(runs: int, steps: int, batch: int) -> tuple[float, float]:
    """Wall and CPU µs a commit, for batches of ``batch`` commits."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "bench.db"
        fences = asyncio.run(_created(path, runs))
        commits = _commits(fences, steps)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA synchronous = NORMAL")
        run_keys: dict[str, int] = {}
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(commits), batch):
            outcomes = commit_batch(conn, commits[start : start + batch], run_keys, str(path))
            if any(outcomes):
                raise SystemExit(f"a commit failed: {next(o for o in outcomes if o)}")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        conn.close()
    return wall / len(commits) * 1e6, cpu / len(commits) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 64, 384])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.runs:,} runs x {args.steps} steps, medians of {args.rounds} rounds")
    print("| commits a batch | wall µs a commit | CPU µs a commit |")
    print("|---:|---:|---:|")
    results: dict[int, list[tuple[float, float]]] = {size: [] for size in args.batches}
    for _ in range(args.rounds):
        for size in args.batches:  # alternated, round by round
            results[size].append(one_round(args.runs, args.steps, size))
    for size, rounds in results.items():
        wall = statistics.median(r[0] for r in rounds)
        cpu = statistics.median(r[1] for r in rounds)
        print(f"| {size} | {wall:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
