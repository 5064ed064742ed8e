"""Where a checkpointed step's time goes: a breakdown and cProfile listings (not a benchmark).

Breakdown (µs per step, medians): the same loop with no checkpointing, with the memory
store, and with the SQLite store, whose SQL transactions are timed apart (wherever they
run: on the loop thread, or on the store's worker thread when the write lock is taken);
what remains of the SQLite figure is the store's own overhead around them. Then cProfile
of one checkpointed run (event-loop thread and SQLite worker thread separately) and of
the resume of a failed 10,000-step run.

    .venv-bench/bin/python bench/profile_step.py [--steps 2000] [--top 25]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from checkpoint_vs_langgraph import POLICY, nestegg_clutch, prepare_failed_run
from harness import (
    LARGE_TIMEOUT,
    START_INPUT,
    Table,
    fmt_us,
    median,
    next_message,
    print_tables,
    timed,
)

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage, SQLiteCheckpointStorage
from nestegg.checkpoint.stores.sqlite import store as sqlite_store


def loop_clutch(steps: int, storage: Any | None, run_id: str) -> Clutch:
    checkpoint = None
    if storage is not None:
        checkpoint = CheckpointConfig(storage=storage, policy=POLICY, run_id=run_id)
    clutch = Clutch("bench", strategy=Strategy.ROUND_ROBIN, max_turns=steps, checkpoint=checkpoint)

    @clutch.agent()
    async def step(data):  # untyped, like the agents of clutch_vs_eggai.py
        return next_message(data)

    return clutch


class CommitClock:
    """Adds up the time the SQLite store spends in its commit transactions.

    Wraps the store module's ``_commit(connection, commit, run_keys)``, looked up by name at every
    commit, so the transaction is timed on whichever thread it runs.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._inner = sqlite_store.commit_alone

    def __enter__(self) -> CommitClock:
        def timed_commit(conn: Any, commit: Any, run_keys: Any) -> None:
            start = time.perf_counter()
            try:
                self._inner(conn, commit, run_keys)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        sqlite_store.commit_alone = timed_commit  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        sqlite_store.commit_alone = self._inner  # type: ignore[assignment]


def on_worker(storage: SQLiteCheckpointStorage, work: Any) -> Any:
    """Run ``work(connection)`` on the store's worker thread."""
    return storage._connection.call(work)


async def breakdown(steps: int, reps: int) -> Table:
    columns: dict[str, list[float]] = {
        "no checkpoint": [],
        "memory store": [],
        "SQLite store": [],
        "SQLite transaction": [],
    }
    for rep in range(reps):
        with tempfile.TemporaryDirectory(prefix="nestegg-profile-") as tmp:
            plain = loop_clutch(steps, None, f"plain-{rep}")
            seconds, _ = await timed(partial(plain.run, START_INPUT, timeout=LARGE_TIMEOUT))
            columns["no checkpoint"].append(seconds / steps)

            memory = loop_clutch(steps, MemoryCheckpointStorage(), f"memory-{rep}")
            seconds, _ = await timed(partial(memory.run, START_INPUT, timeout=LARGE_TIMEOUT))
            columns["memory store"].append(seconds / steps)

            storage = SQLiteCheckpointStorage(Path(tmp) / "profile.db")
            await storage.setup()
            sqlite = loop_clutch(steps, storage, f"sqlite-{rep}")
            with CommitClock() as clock:
                run = partial(sqlite.run, START_INPUT, timeout=LARGE_TIMEOUT)
                seconds, _ = await timed(run)
            await storage.close()
            columns["SQLite store"].append(seconds / steps)
            columns["SQLite transaction"].append(clock.seconds / steps)
    table = Table(
        title=f"Per-step cost breakdown, {steps:,} steps (µs/step, median of {reps})",
        headers=["configuration", "µs/step"],
    )
    for name, values in columns.items():
        table.rows.append([name, fmt_us(median(values))])
    hop = (
        median(columns["SQLite store"])
        - median(columns["memory store"])
        - median(columns["SQLite transaction"])
    )
    table.rows.append(["rest: SQLite - memory - transaction (the store around it)", fmt_us(hop)])
    pages = await wal_pages_per_step()
    table.notes.append(
        f"One checkpointed step writes {pages:.1f} WAL frames (4 KiB database pages) to the "
        f"SQLite store (a {WAL_STEPS}-step run, shorter than the spacing of WAL checkpoints)."
    )
    return table


WAL_STEPS = 200


async def wal_pages_per_step() -> float:
    """WAL frames (database pages) one checkpointed step writes, autocheckpoint held off."""
    with tempfile.TemporaryDirectory(prefix="nestegg-profile-") as tmp:
        storage = SQLiteCheckpointStorage(Path(tmp) / "wal.db")
        await storage.setup()
        await on_worker(storage, lambda conn: conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
        clutch = loop_clutch(WAL_STEPS, storage, "wal")
        await clutch.run(START_INPUT, timeout=LARGE_TIMEOUT)
        _busy, frames, _ = await on_worker(
            storage, lambda conn: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        )
        await storage.close()
    return float(frames) / WAL_STEPS


def listing(profile: cProfile.Profile, title: str, top: int) -> str:
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    return f"#### {title}\n\n```\n{out.getvalue().strip()}\n```\n"


async def profile_run(steps: int, top: int) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="nestegg-profile-") as tmp:
        storage = SQLiteCheckpointStorage(Path(tmp) / "profile.db")
        await storage.setup()
        worker = cProfile.Profile()
        await on_worker(storage, lambda conn: worker.enable())
        clutch = loop_clutch(steps, storage, "profiled")
        main = cProfile.Profile()
        main.enable()
        await clutch.run(START_INPUT, timeout=LARGE_TIMEOUT)
        main.disable()
        await on_worker(storage, lambda conn: worker.disable())
        await storage.close()
    return [
        listing(main, f"Event-loop thread, {steps:,}-step checkpointed run", top),
        listing(worker, f"SQLite worker thread, {steps:,}-step checkpointed run", top),
    ]


async def profile_resume(steps: int, top: int) -> list[str]:
    run_id = f"resume-{steps}"
    with tempfile.TemporaryDirectory(prefix="nestegg-profile-") as tmp:
        db_path = await prepare_failed_run(Path(tmp), steps, run_id)
        storage = SQLiteCheckpointStorage(db_path)
        await storage.setup()
        worker = cProfile.Profile()
        await on_worker(storage, lambda conn: worker.enable())
        clutch = nestegg_clutch(storage, steps, run_id)
        main = cProfile.Profile()
        start = time.perf_counter()
        main.enable()
        await clutch.resume_latest(run_id)
        main.disable()
        elapsed = time.perf_counter() - start
        await on_worker(storage, lambda conn: worker.disable())
        await storage.close()
    title = f"resume_latest of a failed {steps:,}-step run ({elapsed * 1e3:.1f} ms under cProfile)"
    return [
        listing(main, f"Event-loop thread, {title}", top),
        listing(worker, f"SQLite worker thread, {title}", top),
    ]


async def run(steps: int, reps: int, top: int) -> None:
    print_tables([await breakdown(steps, reps)])
    for text in await profile_run(steps, top):
        print(text)
    for text in await profile_resume(10_000, top):
        print(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    asyncio.run(run(args.steps, args.reps, args.top))


if __name__ == "__main__":
    main()
