"""The SQLite store's hot path: one ``commit()`` per step, and what it leaves on disk.

Workload per step, as the checkpointer writes it: one step record (~1.2 KB sealed body),
3 events, one checkpoint, pruning to the newest 3 checkpoints, and the run row's lease,
step_seq, event_seq and updated_at. Each round uses a fresh database file; reported are
the medians over the rounds of: the per-commit median, mean and p99 (the mean includes
SQLite's WAL checkpoints every ~1000 pages), a read of the run row (``get_run``, the
floor of any call into the store), and the database + WAL size after a final WAL
checkpoint. Only the store's public API is used: a small commit with the write lock free
runs on the loop thread, so ``commit()`` is close to the commit's work alone.

    .venv/bin/python bench/sqlite_commit.py [--steps 1000] [--rounds 5]
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
from typing import Any

from harness import message

from nestegg.checkpoint.codec import seal_json
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    Owner,
    RunRecord,
    StepRecord,
    new_checkpoint_id,
)
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

KEEP_LATEST = 3
RUN_ID = "run-bench"
EVENT_KINDS = ("step_started", "step_completed", "checkpoint_saved")


def step_commit(fence: int, seq: int, kept: list[str]) -> Commit:
    """The commit of step ``seq``; ``kept`` holds the checkpoint ids not yet pruned."""
    now = time.time()
    checkpoint = CheckpointRecord(
        new_checkpoint_id(),
        RUN_ID,
        seq,
        now,
        "policy",
        seal_json({"seq": seq, "cursor": {"next": "agent", "index": 0}, "turn": seq}),
    )
    kept.append(checkpoint.checkpoint_id)
    prune = kept[:-KEEP_LATEST]
    del kept[:-KEEP_LATEST]
    usage = {"model": "gpt-4o-mini", "prompt_tokens": 812, "completion_tokens": 254}
    entry = {"agent": "agent", "entry": message(seq), "usage": usage, "outcome": "completed"}
    body = seal_json(entry)
    events = [
        EventRecord(RUN_ID, 3 * seq - 2 + i, now, kind, seal_json({"agent": "agent", "seq": seq}))
        for i, kind in enumerate(EVENT_KINDS)
    ]
    return Commit(
        run_id=RUN_ID,
        fence=fence,
        steps=[StepRecord(RUN_ID, seq, "agent", body)],
        events=events,
        checkpoints=[checkpoint],
        prune=prune,
        lease_until=now + 30,
        step_seq=seq,
        event_seq=3 * seq,
        updated_at=now,
    )


def percentile(values: list[float], fraction: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * fraction))]


async def one_round(steps: int, directory: Path) -> dict[str, float]:
    path = directory / "bench.db"
    store = SQLiteCheckpointStorage(path)
    now = time.time()
    await store.create_run(RunRecord(RUN_ID, "bench", "running", seal_json({}), now, now))
    run = await store.claim_run(RUN_ID, 1, Owner("bench", os.getpid(), "0"), now + 30, now)
    kept: list[str] = []
    commits = [step_commit(run.fence, seq, kept) for seq in range(1, steps + 1)]
    body_bytes = len(commits[0].steps[0].body)
    times = []
    for commit in commits:
        start = time.perf_counter_ns()
        await store.commit(commit)
        times.append((time.perf_counter_ns() - start) / 1000)
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = sum(f.stat().st_size for f in directory.iterdir() if f.name.startswith("bench.db"))
    reads = []
    for _ in range(steps):
        start = time.perf_counter_ns()
        await store.get_run(RUN_ID)
        reads.append((time.perf_counter_ns() - start) / 1000)
    await store.close()
    return {
        "median": statistics.median(times),
        "mean": statistics.mean(times),
        "p99": percentile(times, 0.99),
        "read": statistics.median(reads),
        "size_mb": size / 1e6,
        "body": body_bytes,
    }


async def main(steps: int, rounds: int) -> None:
    results: list[dict[str, Any]] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(await one_round(steps, Path(tmp)))

    def mid(key: str) -> float:
        return statistics.median(r[key] for r in results)

    print(f"{steps} steps x {rounds} rounds, step body {results[0]['body']} B (medians of rounds)")
    print(
        f"commit(): median {mid('median'):.0f} us, mean {mid('mean'):.0f} us, "
        f"p99 {mid('p99'):.0f} us ({1e6 / mid('mean'):.0f} commits/s)"
    )
    print(f"  get_run() of the run row {mid('read'):.0f} us")
    print(f"database + WAL after a WAL checkpoint: {mid('size_mb'):.2f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.rounds))
