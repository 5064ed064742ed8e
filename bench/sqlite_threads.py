"""Where a SQLite step's CPU goes, by thread, with and without ``max_pending_commits``.

The rows of ``bench/concurrent_runs.py`` (N runs of M steps at once, a ~1 KB message a
step, every step checkpointed with ``durability="sync"``) on SQLite, the settings of
``--pending`` alternated in each repetition, with the process's CPU split between its two
busy threads: the event loop's (the orchestrator, the checkpointer, the group commit's
batching; the row's whole life, the store's opening and closing included) and SQLite's
writer thread, which writes every batch of more than ``SQLITE_INLINE_BATCH_COMMITS``
commits (``commit_batch``, timed there with ``time.thread_time()``). Per row: steps/s,
the process's CPU a step (all threads, as ``concurrent_runs.py`` counts it), the loop
thread's CPU a step, the batches the writer wrote and their mean size, the writer's CPU a
commit, the median wall time of a batch (more than its CPU: the time it waited for the
GIL), and the p99 step commit. Medians of ``--reps``.

    .venv-bench/bin/python bench/sqlite_threads.py [--runs 1000] [--total 20000]
        [--reps 3] [--pending 64 none] [--gc-threshold 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from concurrent_runs import one_row, pending_setting, percentile, positive
from harness import Table, fmt_int, fmt_ms, median, print_tables, progress

import nestegg.checkpoint.stores.sqlite.store as sqlite_store


@dataclass
class Batch:
    commits: int
    wall: float
    cpu: float


@contextmanager
def writer_batches() -> Iterator[list[Batch]]:
    """The batches written on SQLite's writer thread while open (appended as written)."""
    batches: list[Batch] = []
    write = sqlite_store.commit_batch

    def timed(conn: Any, commits: Any, *args: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return write(conn, commits, *args)
        finally:
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            if threading.current_thread() is not threading.main_thread():
                batches.append(Batch(len(commits), wall, cpu))

    sqlite_store.commit_batch = timed
    try:
        yield batches
    finally:
        sqlite_store.commit_batch = write


@dataclass
class Measured:
    steps_per_s: float
    cpu_per_step: float
    loop_cpu_per_step: float
    batches: int
    batch_size: float
    writer_cpu_per_commit: float
    wall_per_batch: float
    p99: float


async def measure(
    runs: int, steps: int, rep: int, pending: int | None, threshold: int | None
) -> Measured:
    with writer_batches() as batches:
        loop_cpu = time.thread_time()
        row = await one_row("sqlite", runs, steps, rep, 0.0, threshold=threshold, pending=pending)
        loop_cpu = time.thread_time() - loop_cpu
    commits = sum(b.commits for b in batches) or 1
    return Measured(
        row.steps / row.seconds,
        row.cpu / row.steps,
        loop_cpu / row.steps,
        len(batches),
        commits / (len(batches) or 1),
        sum(b.cpu for b in batches) / commits,
        median([b.wall for b in batches]) if batches else 0.0,
        percentile(row.latencies, 0.99),
    )


async def main(args: argparse.Namespace) -> None:
    table = Table(
        f"SQLite: {args.runs:,} runs at once, {args.total:,} steps per row, CPU by thread"
        + (f", the collector's first threshold {args.gc_threshold:,}" if args.gc_threshold else ""),
        [
            "max pending commits",
            "steps/s",
            "CPU µs/step",
            "loop thread µs/step",
            "writer batches",
            "commits a batch",
            "writer CPU µs/commit",
            "writer wall ms/batch",
            "p99 step commit",
        ],
    )
    steps = max(1, args.total // args.runs)
    by_setting: dict[int | None, list[Measured]] = {p: [] for p in args.pending}
    for rep in range(args.reps):
        for pending in args.pending:  # side by side, alternated
            progress(f"SQLite: max pending commits {pending}, repetition {rep + 1}")
            by_setting[pending].append(
                await measure(args.runs, steps, rep, pending, args.gc_threshold)
            )
    for pending, rows in by_setting.items():

        def mid(field: str, rows: list[Measured] = rows) -> float:
            return median([getattr(r, field) for r in rows])

        table.rows.append(
            [
                "no limit" if pending is None else str(pending),
                fmt_int(mid("steps_per_s")),
                f"{mid('cpu_per_step') * 1e6:.1f}",
                f"{mid('loop_cpu_per_step') * 1e6:.1f}",
                fmt_int(mid("batches")),
                f"{mid('batch_size'):.1f}",
                f"{mid('writer_cpu_per_commit') * 1e6:.1f}",
                f"{mid('wall_per_batch') * 1e3:.2f}",
                fmt_ms(mid("p99")),
            ]
        )
    table.notes.append(f"medians of {args.reps} repetitions")
    print_tables([table])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=positive, default=1000)
    parser.add_argument("--total", type=positive, default=20_000)
    parser.add_argument("--reps", type=positive, default=3)
    parser.add_argument("--pending", nargs="+", type=pending_setting, default=[64, None])
    parser.add_argument("--gc-threshold", type=positive, default=None)
    asyncio.run(main(parser.parse_args()))
