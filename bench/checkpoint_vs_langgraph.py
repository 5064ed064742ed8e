"""Durable checkpoints, embedded: nestegg's SQLite store against LangGraph's SqliteSaver.

The workload: one agent loop, a ~1 KB message per step, a durable checkpoint after every
step. nestegg: ``SQLiteCheckpointStorage`` with its default settings (WAL,
synchronous=NORMAL) and ``CheckpointPolicy(every_n_steps=1, keep_latest=3,
durability="sync")``. LangGraph: ``SqliteSaver`` (it sets WAL itself; the connection is
given synchronous=NORMAL too, the same durability class) with ``durability="sync"``.
Both run in this one process, interleaved; every measurement uses a fresh temporary
directory, removed afterwards. Also measured: bytes stored (database plus WAL after a
``wal_checkpoint(TRUNCATE)``) and the resume of an interrupted 10,000-step run, each in a
new process, as a worker restarted after a crash would do it.

    .venv-bench/bin/python bench/checkpoint_vs_langgraph.py [--sizes 100 1000 10000] [--reps N]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from harness import (
    LARGE_TIMEOUT,
    START_INPUT,
    Table,
    directory_bytes,
    fmt_bytes,
    fmt_int,
    fmt_ms,
    fmt_ratio,
    fmt_us,
    interleaved,
    median,
    next_message,
    print_tables,
    timed,
)
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph_workload import build_loop, run_loop

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy, SQLiteCheckpointStorage

DEFAULT_SIZES = (100, 1000, 10_000)
DEFAULT_REPS = {100: 21, 1000: 5, 10_000: 3}
LANGGRAPH_MAX_STEPS = 1000
"""LangGraph stores the whole message list at every step: 10,000 steps would write ~50 GB."""

RESUME_STEPS = 10_000
RESUME_REPS = 7

NESTEGG = "nestegg"
LANGGRAPH = "LangGraph"

POLICY = CheckpointPolicy(every_n_steps=1, keep_latest=3, durability="sync")


@dataclass
class Sample:
    seconds: float
    stored_bytes: int


def truncate_wal(db_path: Path) -> None:
    """Fold the WAL into the database so that the bytes on disk are what is stored."""
    conn = sqlite3.connect(db_path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def nestegg_clutch(
    storage: SQLiteCheckpointStorage, steps: int, run_id: str, fail_at: int | None = None
) -> Clutch:
    """The loop on nestegg; ``fail_at``: the step whose agent raises (once)."""
    clutch = Clutch(
        "bench",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=storage, policy=POLICY, run_id=run_id),
    )
    failing = {"armed": fail_at is not None}

    @clutch.agent()
    async def step(data):  # untyped, like the agents of clutch_vs_eggai.py
        if failing["armed"] and data["turn"] + 1 == fail_at:
            failing["armed"] = False
            raise RuntimeError(f"injected failure at step {fail_at}")
        return next_message(data)

    return clutch


async def measure_nestegg(steps: int, rep: int) -> Sample:
    with tempfile.TemporaryDirectory(prefix="nestegg-bench-") as tmp:
        db_path = Path(tmp) / "nestegg.db"
        storage = SQLiteCheckpointStorage(db_path)
        clutch = nestegg_clutch(storage, steps, run_id=f"loop-{steps}-{rep}")
        elapsed, result = await timed(lambda: clutch.run(START_INPUT, timeout=LARGE_TIMEOUT))
        await storage.close()
        if result["turn"] != steps:
            raise AssertionError(f"nestegg ran {result['turn']} steps, not {steps}")
        truncate_wal(db_path)
        return Sample(elapsed, directory_bytes(Path(tmp)))


async def measure_langgraph(steps: int, rep: int) -> Sample:
    with tempfile.TemporaryDirectory(prefix="langgraph-bench-") as tmp:
        db_path = Path(tmp) / "langgraph.db"
        conn = sqlite3.connect(db_path, check_same_thread=False)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            saver = SqliteSaver(conn)
            saver.setup()
            app = build_loop(saver, steps)

            async def invoke() -> dict[str, Any]:
                return run_loop(app, f"loop-{steps}-{rep}", steps)

            elapsed, _ = await timed(invoke)
        finally:
            conn.close()
        truncate_wal(db_path)
        return Sample(elapsed, directory_bytes(Path(tmp)))


MEASURES = {NESTEGG: measure_nestegg, LANGGRAPH: measure_langgraph}


async def measure_size(steps: int, reps: int) -> dict[str, list[Sample]]:
    contenders = [NESTEGG] if steps > LANGGRAPH_MAX_STEPS else [NESTEGG, LANGGRAPH]
    samples: dict[str, list[Sample]] = {name: [] for name in contenders}
    for rep in range(reps):
        for name in interleaved(contenders, rep):
            samples[name].append(await MEASURES[name](steps, rep))
    return samples


async def prepare_failed_run(directory: Path, steps: int, run_id: str) -> Path:
    """A database holding a run whose agent failed at its last step; returns its path."""
    db_path = directory / "failed.db"
    storage = SQLiteCheckpointStorage(db_path)
    clutch = nestegg_clutch(storage, steps, run_id, fail_at=steps)
    try:
        await clutch.run(START_INPUT, timeout=LARGE_TIMEOUT)
    except Exception:
        pass
    else:
        raise AssertionError("the injected failure did not fail the run")
    finally:
        await storage.close()
    truncate_wal(db_path)
    return db_path


async def measure_resume(steps: int, reps: int) -> list[float]:
    """Seconds of ``resume_latest`` of a failed ``steps``-step run, each in a new process.

    Each repetition resumes a fresh copy of the same failed run in a new Python process
    (as a restarted worker would): open the store, load the newest checkpoint, re-run the
    failed last step, commit the completion. Only ``resume_latest`` is timed.
    """
    run_id = f"resume-{steps}"
    seconds = []
    byte_compile_nestegg()
    with tempfile.TemporaryDirectory(prefix="nestegg-resume-") as tmp:
        template = await prepare_failed_run(Path(tmp), steps, run_id)
        for rep in range(reps):
            copy = Path(tmp) / f"copy-{rep}.db"
            copy_to_disk(template, copy)
            child = [sys.executable, __file__, "--resume-child", str(copy), run_id, str(steps)]
            done = subprocess.run(child, capture_output=True, text=True, check=True)
            seconds.append(float(done.stdout))
    return seconds


def copy_to_disk(source: Path, target: Path) -> None:
    """Copy ``source`` and sync the copy, as a database a worker restarts on has long been
    written back: otherwise the first sync of the resume (SQLite's, of the WAL header when
    it starts a new WAL) waits for the kernel to write the whole fresh copy to the disk."""
    shutil.copyfile(source, target)
    fd = os.open(target, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def byte_compile_nestegg() -> None:
    """Write nestegg's byte code, as installing the package does: a restarted worker does
    not compile its modules again (here they may be a source checkout, never compiled)."""
    compileall.compile_dir(Path(nestegg.__file__).parent, quiet=1)


async def resume_in_this_process(path: Path, run_id: str, steps: int) -> float:
    """Seconds of one ``resume_latest`` of the failed run in ``path`` (a child's work)."""
    storage = SQLiteCheckpointStorage(path)
    clutch = nestegg_clutch(storage, steps, run_id)
    elapsed, result = await timed(partial(clutch.resume_latest, run_id))
    await storage.close()
    if result["turn"] != steps:
        raise AssertionError(f"resume ended at turn {result['turn']}, not {steps}")
    return elapsed


def throughput_table(results: dict[int, dict[str, list[Sample]]], reps: dict[int, int]) -> Table:
    table = Table(
        title="Durable checkpoint every step: nestegg SQLite store vs LangGraph SqliteSaver",
        headers=[
            "steps",
            "nestegg steps/s",
            "LangGraph steps/s",
            "ratio",
            "nestegg µs/step",
            "LangGraph µs/step",
            "nestegg stored",
            "LangGraph stored",
            "reps",
        ],
    )
    for steps, samples in results.items():
        ours = steps / median([s.seconds for s in samples[NESTEGG]])
        row = [fmt_int(steps), fmt_int(ours)]
        theirs_samples = samples.get(LANGGRAPH)
        if theirs_samples:
            theirs = steps / median([s.seconds for s in theirs_samples])
            row += [fmt_int(theirs), fmt_ratio(ours / theirs), fmt_us(1 / ours), fmt_us(1 / theirs)]
        else:
            row += ["not run", "", fmt_us(1 / ours), ""]
        row.append(fmt_bytes(median([s.stored_bytes for s in samples[NESTEGG]])))
        row.append(
            fmt_bytes(median([s.stored_bytes for s in theirs_samples])) if theirs_samples else ""
        )
        row.append(str(reps[steps]))
        table.rows.append(row)
    table.notes += [
        "Median over the repetitions, nestegg and LangGraph interleaved in one process; "
        "a fresh temporary directory per measurement.",
        "Stored: database + WAL file after `PRAGMA wal_checkpoint(TRUNCATE)`.",
        f"LangGraph is not run beyond {LANGGRAPH_MAX_STEPS:,} steps: it stores the whole "
        "message list at every step (quadratic), ~50 GB at 10,000 steps.",
    ]
    return table


def resume_table(seconds: list[float], steps: int) -> Table:
    table = Table(
        title=f"Resume of an interrupted {steps:,}-step run (nestegg SQLite store)",
        headers=["steps in the run", "median", "min", "max", "reps"],
    )
    table.rows.append(
        [
            fmt_int(steps),
            fmt_ms(median(seconds)),
            fmt_ms(min(seconds)),
            fmt_ms(max(seconds)),
            str(len(seconds)),
        ]
    )
    table.notes.append(
        "The run's agent raised at its last step, so the run is failed; timed: "
        "`await clutch.resume_latest(run_id)` in a new process (as after a restart) on a new "
        "store object and a new Clutch, which loads the newest checkpoint, re-runs the "
        "failed step and commits the completion."
    )
    return table


async def run(sizes: Sequence[int], reps: int | None) -> list[Table]:
    results: dict[int, dict[str, list[Sample]]] = {}
    used_reps: dict[int, int] = {}
    for steps in sizes:
        used_reps[steps] = reps or DEFAULT_REPS.get(steps, 3)
        results[steps] = await measure_size(steps, used_reps[steps])
    resume_seconds = await measure_resume(RESUME_STEPS, reps or RESUME_REPS)
    return [throughput_table(results, used_reps), resume_table(resume_seconds, RESUME_STEPS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--reps", type=int, default=None, help="repetitions for every size")
    parser.add_argument("--resume-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.resume_child:
        path, run_id, steps = args.resume_child
        print(asyncio.run(resume_in_this_process(Path(path), run_id, int(steps))))
        return
    print_tables(asyncio.run(run(args.sizes, args.reps)))


if __name__ == "__main__":
    main()
