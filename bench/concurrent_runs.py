"""Many runs in one process: does the aggregate grow with concurrency?

N runs of M steps at once on one Clutch (``asyncio.gather`` of ``clutch.run(...,
run_id=...)``), a ~1 KB message per step, a checkpoint after every step
(``every_n_steps=1, keep_latest=3, durability="sync"``: each step's commit is durable
before its run goes on), with N = 1, 100, 1,000 and 10,000 and M = total / N, so every
row commits the same number of steps. Per row: aggregate steps/s (all steps over the wall
time, the creation and claim of the runs included), the process's CPU time (user + system,
all threads) per step, which a machine shared with other work changes less than the wall
time, p50 and p99 of one step commit (a commit that writes a step, which its run waits
for before it goes on), from its arrival at the store until it is written (durable, its
outcome known: ``nestegg.checkpoint.stores.group.commit_latencies``), the p99 of any
commit (also a run's opening commit and a step's start, which a step that runs longer than
50 ms publishes on its own while it runs), the p99 of the wait of the run itself from
the commit's start until it goes on (as the checkpointer awaits ``store.commit``; it also
waits for its turn on the event loop), the full collections of Python's cyclic garbage
collector during the row (how many, the median pause and the longest: the event loop
stops meanwhile), and the process's RSS at the end. ``uptime``'s load averages are
printed with each table.

With N runs and no wait between steps, every run spends nearly all its time waiting on
its commit: by Little's law the wait of a run is about N / (steps/s), 100 ms for 1,000
runs at 10,000 steps/s, however fast the store writes. The commit latency is the store's
part of it. ``--think MS`` makes every step first wait about MS milliseconds (uniformly
0.5 to 1.5 times MS), as a step waits on a model: the rows then show the commit latency
of a process that is not saturated. ``--held N`` fills each row's store first with N finished
runs of one step each, as a store in use holds them: the rows then show whether a commit
costs more in a store that holds more. ``--no-gc`` times the rows with Python's cyclic
garbage collector off (``gc.disable()``, which a service would not do): beside the same rows
with it on, it shows what the collector's pauses add to the commit latency's tail.
``--gc-freeze`` moves what is alive before each row (modules, the store, the Clutch) out of
the collector's reach first (``gc.freeze()``, as a service may do once it has started);
``--gc-threshold N`` sets the collector's first threshold to N allocations
(``gc.set_threshold``; Python's default is 700), so that fewer objects of the steps under way
live through a young collection and reach the oldest generation. ``--switch-interval MS``
sets the interpreter's switch interval (``sys.setswitchinterval``; Python's default is 5 ms):
how long a thread that waits for the GIL, as SQLite's writer thread does after each
statement while the event loop runs, waits before it asks the loop's thread to let go.

``--pending N none`` runs each row with the stores' ``max_pending_commits`` at N and with no
limit (the default), side by side, alternated in each repetition: a row then also shows the
p99 of the wait of a step held back before it started, where the run waits instead of inside
its commit.

Then the memory of idle runs: N runs each stopped in its first step, waiting (as a run
waits on a model); RSS grown per waiting run, measured once all of them wait.

Stores: SQLite (a temporary directory), PostgreSQL and Redis (own table or key prefix,
dropped afterwards). Servers: ``NESTEGG_TEST_PG_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), ``NESTEGG_TEST_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``). Medians of ``--reps`` repetitions.

    .venv-bench/bin/python bench/concurrent_runs.py [--stores sqlite postgres redis]
        [--runs 1 100 1000 10000] [--total 20000] [--idle 10000] [--reps 3] [--think 0]
        [--held 0] [--no-gc | --gc-freeze] [--gc-threshold N] [--switch-interval MS]
        [--pending none 64]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    LARGE_TIMEOUT,
    START_INPUT,
    Table,
    dump_tasks_on_sigusr1,
    fmt_int,
    fmt_ms,
    fmt_us,
    median,
    next_message,
    print_tables,
    progress,
)

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy, SQLiteCheckpointStorage
from nestegg.checkpoint.bulk import collector_paused
from nestegg.checkpoint.stores.group import commit_latencies
from nestegg.errors import NestEggError

PG_URL = os.environ.get("NESTEGG_TEST_PG_URL") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("NESTEGG_TEST_REDIS_URL") or "redis://127.0.0.1:6379/0"
POLICY = CheckpointPolicy(every_n_steps=1, keep_latest=3, durability="sync")
DEFAULT_RUNS = (1, 100, 1000, 10_000)
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """The process's resident set now (not its peak)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


@dataclass
class Row:
    seconds: float
    cpu: float
    steps: int
    latencies: list[float]
    """Of the step commits."""
    any_latencies: list[float]
    """Of all commits."""
    waits: list[float]
    held: list[float]
    """Of the steps: how long each was held back before it started."""
    rss: int
    full_collections: list[float]


@asynccontextmanager
async def sqlite_store(**options: Any) -> AsyncIterator[Any]:
    with tempfile.TemporaryDirectory(prefix="nestegg-bench-") as tmp:
        store = SQLiteCheckpointStorage(Path(tmp) / "nestegg.db", **options)
        try:
            await store.setup()
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def server_store(store: Any) -> AsyncIterator[Any]:
    """``store`` set up, then dropped and closed."""
    try:
        await store.setup()
        yield store
    finally:
        await store.drop()
        await store.close()


def postgres_store(**options: Any) -> Any:
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    prefix = f"bench_conc_{uuid.uuid4().hex[:8]}_"
    return server_store(PostgresCheckpointStorage(PG_URL, table_prefix=prefix, **options))


def redis_store(**options: Any) -> Any:
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    prefix = f"bench-conc-{uuid.uuid4().hex[:8]}:"
    return server_store(RedisCheckpointStorage(REDIS_URL, prefix=prefix, **options))


STORES: dict[str, Callable[..., Any]] = {
    "sqlite": sqlite_store,
    "postgres": postgres_store,
    "redis": redis_store,
}
NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "redis": "Redis"}


def time_waits(store: Any) -> list[float]:
    """Record the seconds every ``store.commit`` keeps its caller waiting from now on (on
    this instance): the commit, then the wait for the caller's turn on the event loop."""
    latencies: list[float] = []
    commit = store.commit
    clock = time.perf_counter

    async def timed_commit(change: Any) -> None:
        start = clock()
        await commit(change)
        latencies.append(clock() - start)

    store.commit = timed_commit
    return latencies


def time_held(store: Any) -> list[float]:
    """Record the seconds every step of a run on ``store`` is held back before it starts
    (``store.step_admission()``, while the store's commits pile up; 0 for a step that was
    not) from now on (on this instance)."""
    held: list[float] = []
    admission = store.step_admission
    clock = time.perf_counter

    async def timed(wait: Any) -> None:
        start = clock()
        await wait
        held.append(clock() - start)

    def timed_admission() -> Any:
        wait = admission()
        if wait is None:
            held.append(0.0)
            return None
        return timed(wait)

    store.step_admission = timed_admission
    return held


@contextmanager
def full_collections() -> Iterator[list[float]]:
    """The seconds each full collection of the cyclic garbage collector (generation 2)
    takes while open: the event loop stops for as long."""
    paused: list[float] = []
    started = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            paused.append(time.perf_counter() - started[0])

    gc.callbacks.append(timed)
    try:
        yield paused
    finally:
        gc.callbacks.remove(timed)


def loop_clutch(
    store: Any, steps: int, gate: asyncio.Event | None = None, think: float = 0.0
) -> Clutch:
    clutch = Clutch(
        "bench",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=store, policy=POLICY),
    )
    waiting = [0]

    @clutch.agent()
    async def step(data):  # untyped, like the agents of the other benchmarks
        if gate is not None:
            waiting[0] += 1
            await gate.wait()
        if think:
            await asyncio.sleep(think * random.uniform(0.5, 1.5))
        return next_message(data)

    clutch.waiting = waiting  # type: ignore[attr-defined]
    return clutch


@contextmanager
def collector_frozen() -> Iterator[None]:
    """The objects alive now (modules, the store, the Clutch) moved out of the collector's
    reach for the block (``gc.freeze()``): a full collection then visits only the objects
    made since."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def young_threshold(allocations: int | None) -> Iterator[None]:
    """The collector's first threshold (``gc.set_threshold``: allocations between two
    collections of the youngest generation) set to ``allocations`` for the block (None:
    unchanged)."""
    kept = gc.get_threshold()
    if allocations is not None:
        gc.set_threshold(allocations, *kept[1:])
    try:
        yield
    finally:
        gc.set_threshold(*kept)


COLLECTOR: dict[str, Callable[[], AbstractContextManager[None]]] = {
    "on": nullcontext,
    "off": collector_paused,
    "freeze": collector_frozen,
}
COLLECTOR_TITLES = {
    "on": "",
    "off": ", the garbage collector off",
    "freeze": ", what was alive before frozen (gc.freeze())",
}


async def hold_runs(store: Any, count: int) -> None:
    """Fill ``store`` with ``count`` finished runs of one step each, 1,000 at a time."""
    clutch = loop_clutch(store, 1)
    for start in range(0, count, 1000):
        await asyncio.gather(
            *(
                clutch.run(START_INPUT, run_id=f"held-{i}", timeout=LARGE_TIMEOUT)
                for i in range(start, min(count, start + 1000))
            )
        )


async def one_row(
    store_name: str,
    runs: int,
    steps: int,
    rep: int,
    think: float,
    held: int = 0,
    collector: str = "on",
    threshold: int | None = None,
    pending: int | None = None,
) -> Row:
    async with STORES[store_name](max_pending_commits=pending) as store:
        await hold_runs(store, held)
        waits = time_waits(store)
        held_back = time_held(store)
        clutch = loop_clutch(store, steps, think=think)
        gc.collect()
        with (
            commit_latencies(steps_only=True) as latencies,
            commit_latencies() as any_latencies,
            full_collections() as paused,
            COLLECTOR[collector](),
            young_threshold(threshold),
        ):
            start, cpu = time.perf_counter(), time.process_time()
            results = await asyncio.gather(
                *(
                    clutch.run(START_INPUT, run_id=f"r{rep}-{i}", timeout=LARGE_TIMEOUT)
                    for i in range(runs)
                )
            )
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        if any(r["turn"] != steps for r in results):
            raise AssertionError("a run did not complete all its steps")
        return Row(
            seconds,
            cpu,
            runs * steps,
            list(latencies),
            list(any_latencies),
            waits,
            held_back,
            rss_bytes(),
            paused,
        )


async def idle_runs(store_name: str, runs: int) -> float:
    """RSS grown per run while ``runs`` runs wait in their first step."""
    async with STORES[store_name]() as store:
        gate = asyncio.Event()
        await loop_clutch(store, 1).run(START_INPUT, run_id="warm-up", timeout=LARGE_TIMEOUT)
        clutch = loop_clutch(store, 1, gate)
        gc.collect()
        before = rss_bytes()
        tasks = [
            asyncio.ensure_future(clutch.run(START_INPUT, run_id=f"idle-{i}", timeout=None))
            for i in range(runs)
        ]
        while clutch.waiting[0] < runs:  # type: ignore[attr-defined]
            failed = [t for t in tasks if t.done()]
            if failed:  # a run that could not start: its error
                failed[0].result()
            await asyncio.sleep(0.05)
        gc.collect()
        grown = rss_bytes() - before
        gate.set()
        await asyncio.gather(*tasks)
        return grown / runs


def idle_in_child(store_name: str, runs: int) -> float:
    """:func:`idle_runs` in a new process, whose memory no earlier row has grown."""
    child = [sys.executable, __file__, "--idle-child", store_name, str(runs)]
    done = subprocess.run(child, capture_output=True, text=True, check=True)
    return float(done.stdout)


def collections_text(rows: list[Row]) -> str:
    """``count x median (longest)`` of the full collections of a row, medians of rows."""
    counts = [len(r.full_collections) for r in rows]
    if not any(counts):
        return "none"
    typical = median([median(r.full_collections) for r in rows if r.full_collections])
    longest = median([max(r.full_collections) for r in rows if r.full_collections])
    return f"{median(counts):g} x {fmt_ms(typical)} ({fmt_ms(longest)})"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))]


def add_row(table: Table, shape: str, pending: int | None, rows: list[Row]) -> None:
    """The medians of ``rows`` (one setting of one row) as a row of ``table``."""
    table.rows.append(
        [
            shape,
            "no limit" if pending is None else f"{pending:,}",
            fmt_int(median([r.steps / r.seconds for r in rows])),
            fmt_us(median([r.cpu / r.steps for r in rows])),
            fmt_ms(median([percentile(r.latencies, 0.5) for r in rows])),
            fmt_ms(median([percentile(r.latencies, 0.99) for r in rows])),
            fmt_ms(median([percentile(r.any_latencies, 0.99) for r in rows])),
            fmt_ms(median([percentile(r.waits, 0.99) for r in rows])),
            fmt_ms(median([percentile(r.held, 0.99) for r in rows])),
            collections_text(rows),
            f"{median([r.rss for r in rows]) / 2**20:,.0f} MB",
        ]
    )
    progress(" | ".join(table.rows[-1]))


def pending_setting(text: str) -> int | None:
    """A store's ``max_pending_commits`` to run the rows with: a number, or ``none`` (no
    limit, the stores' default)."""
    return None if text == "none" else positive(text)


async def main(args: argparse.Namespace) -> None:
    dump_tasks_on_sigusr1()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval / 1000)
    tables = []
    for store_name in args.stores:
        table = Table(
            f"{NAMES[store_name]}: N runs at once, {args.total:,} steps per row"
            + (f", each step waits ~{args.think:g} ms first" if args.think else "")
            + (f", the store holding {args.held:,} finished runs" if args.held else "")
            + COLLECTOR_TITLES[args.collector]
            + (
                f", the collector's first threshold {args.gc_threshold:,}"
                if args.gc_threshold is not None
                else ""
            )
            + (
                f", switch interval {args.switch_interval:g} ms"
                if args.switch_interval is not None
                else ""
            ),
            [
                "runs x steps",
                "max pending commits",
                "steps/s",
                "CPU µs/step",
                "p50 step commit",
                "p99 step commit",
                "p99 any commit",
                "p99 run waits",
                "p99 held back",
                "full collections",
                "RSS at end",
            ],
        )
        for runs in args.runs:
            steps = max(1, args.total // runs)
            by_setting: dict[int | None, list[Row]] = {p: [] for p in args.pending}
            try:
                for rep in range(args.reps):
                    for pending in args.pending:  # side by side, alternated
                        progress(
                            f"{NAMES[store_name]}: {runs} x {steps}, max pending commits "
                            f"{pending}, repetition {rep + 1}"
                        )
                        row = await one_row(
                            store_name,
                            runs,
                            steps,
                            rep,
                            args.think / 1e3,
                            args.held,
                            args.collector,
                            args.gc_threshold,
                            pending,
                        )
                        by_setting[pending].append(row)
            except NestEggError as error:  # a store that gives up under the load: say so
                table.rows.append(
                    [f"{runs:,} x {steps:,}", "", "failed: " + str(error).splitlines()[0]]
                    + [""] * 8
                )
                progress(table.rows[-1][2])
                continue
            for pending, rows in by_setting.items():
                add_row(table, f"{runs:,} x {steps:,}", pending, rows)

        if args.idle:
            progress(f"{NAMES[store_name]}: {args.idle} idle runs")
            try:
                per_run = median([idle_in_child(store_name, args.idle) for _ in range(args.reps)])
                idle = f"{per_run / 1e3:,.1f} kB RSS per run"
            except subprocess.CalledProcessError as error:
                idle = "failed: " + error.stderr.strip().splitlines()[-1]
            table.notes.append(f"{args.idle:,} runs waiting in their first step: {idle}")
            progress(table.notes[-1])
        table.notes.append(
            f"load averages at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
            f"medians of {args.reps} repetitions; peak RSS of the process "
            f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB"
        )
        tables.append(table)
        print_tables([table])


def positive(text: str) -> int:
    """An int of at least 1 (a threshold of 0 would switch the collector off)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", nargs="+", choices=list(STORES), default=list(STORES))
    parser.add_argument("--runs", nargs="+", type=int, default=list(DEFAULT_RUNS))
    parser.add_argument("--total", type=int, default=20_000)
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--think", type=float, default=0.0, help="ms a step waits first")
    parser.add_argument("--held", type=int, default=0, help="finished runs in the store first")
    parser.add_argument(
        "--pending",
        nargs="+",
        type=pending_setting,
        default=[None],
        help="the stores' max_pending_commits to run each row with, side by side: "
        "a number, or none (no limit, the default)",
    )
    collector = parser.add_mutually_exclusive_group()
    collector.add_argument(
        "--no-gc",
        dest="collector",
        action="store_const",
        const="off",
        default="on",
        help="the rows with gc.disable()",
    )
    parser.add_argument(
        "--gc-threshold",
        type=positive,
        help="the rows with gc.set_threshold(N): N allocations between young collections",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        help="the rows with sys.setswitchinterval(MS / 1000) (Python's default: 5 ms)",
    )
    collector.add_argument(
        "--gc-freeze",
        dest="collector",
        action="store_const",
        const="freeze",
        help="the rows with what was alive before them frozen (gc.freeze())",
    )
    parser.add_argument("--idle-child", nargs=2, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.idle_child:
        name, count = parsed.idle_child
        print(asyncio.run(idle_runs(name, int(count))))
    else:
        asyncio.run(main(parsed))
