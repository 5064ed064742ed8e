"""Distributed mode: per-step overhead against local mode, throughput of 1 and 2 worker
processes, and the time from a worker's SIGKILL to its run's next committed step.

    .venv/bin/python bench/distributed.py [--steps 200] [--runs 200] [--run-steps 20]
        [--reps 3] [--broker redis|amqp://guest:guest@127.0.0.1/]

Runs against the Redis store (and Redis Streams, or RabbitMQ with an amqp:// --broker)
on BENCH_REDIS_URL (default redis://127.0.0.1:6379/0), under a fresh key prefix that is
deleted afterwards. Workers are ``nestegg worker distributed_app:bench`` processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distributed_app import REDIS_URL, make
from harness import START_INPUT, Table, median, print_tables, progress

from nestegg.transport.caller import publish_first, wait_result

BENCH_DIR = Path(__file__).resolve().parent
STEP_SECONDS = 0.2
"""How long each step of the recovery runs takes."""
ROOT = BENCH_DIR.parent


class Deployment:
    """Settings of one measurement (environment of its workers) and its worker processes."""

    def __init__(self, broker: str, **settings: Any) -> None:
        self.env = dict(os.environ)
        self.env.update(
            BENCH_PREFIX=f"nestegg-bench-{uuid.uuid4().hex[:8]}:",
            BENCH_TRANSPORT=REDIS_URL if broker == "redis" else broker,
            PYTHONPATH=os.pathsep.join([str(BENCH_DIR), str(ROOT)]),
        )
        self.env.update({f"BENCH_{k.upper()}": str(v) for k, v in settings.items()})
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_worker(self, concurrency: int) -> subprocess.Popen[bytes]:
        """A worker process."""
        command = [sys.executable, "-m", "nestegg", "worker", "distributed_app:bench"]
        worker = subprocess.Popen(
            [*command, "--concurrency", str(concurrency)], env=self.env, cwd=BENCH_DIR
        )
        self.workers.append(worker)
        return worker

    @contextmanager
    def applied(self) -> Iterator[None]:
        """This deployment's settings in this process's environment for the duration."""
        saved = dict(os.environ)
        os.environ.update({k: v for k, v in self.env.items() if k.startswith("BENCH_")})
        try:
            yield
        finally:
            os.environ.clear()
            os.environ.update(saved)

    async def close(self) -> None:
        """Kill the workers and delete the keys (and queues) of the prefix."""
        for worker in self.workers:
            worker.kill()
            worker.wait()
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(REDIS_URL)
        prefix = self.env["BENCH_PREFIX"]
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.unlink(*keys)
        await client.aclose()
        if not self.env["BENCH_TRANSPORT"].startswith("redis"):
            from nestegg.transport.rabbitmq import RabbitMQTransport

            rabbit = RabbitMQTransport(self.env["BENCH_TRANSPORT"], prefix=prefix)
            channels = ["nestegg.bench", "nestegg.bench.left", "nestegg.bench.right"]
            await rabbit.delete_channels(channels)
            await rabbit.close()


async def warm_up(clutch: Any) -> None:
    """One run, so that workers are up and connections open before timing."""
    await clutch.run(START_INPUT, timeout=120)


async def redis_round_trip(ops: int = 300) -> float:
    """ms of one Redis SET of ~1 KB, the mean of ``ops`` (the machine's floor, as in
    floors.py)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(REDIS_URL)
    key, value = f"nestegg-bench-floor-{uuid.uuid4().hex[:8]}", b"x" * 1000
    try:
        await client.set(key, value)
        started = time.perf_counter()
        for _ in range(ops):
            await client.set(key, value)
        return (time.perf_counter() - started) * 1000 / ops
    finally:
        await client.delete(key)
        await client.aclose()


async def overhead(broker: str, steps: int, reps: int) -> Table:
    """ms per step of one run, local mode and through one worker (concurrency 1)."""
    deployment = Deployment(broker, steps=steps)
    deployment.start_worker(1)
    local_ms, remote_ms, floor_ms = [], [], []
    try:
        with deployment.applied():
            local, remote = make(transport=False), make()
        await warm_up(remote)
        await local.run(START_INPUT, timeout=None)
        for rep in range(reps):
            progress(f"overhead rep {rep + 1}/{reps}")
            started = time.perf_counter()
            await local.run(START_INPUT, timeout=None)
            local_ms.append((time.perf_counter() - started) * 1000 / steps)
            started = time.perf_counter()
            await remote.run(START_INPUT, timeout=None)
            remote_ms.append((time.perf_counter() - started) * 1000 / steps)
            floor_ms.append(await redis_round_trip())
        await local.stop()
        await remote.stop()
    finally:
        await deployment.close()
    table = Table(
        f"Per-step overhead of distributed mode ({broker_name(broker)}, Redis store)",
        ["mode", "ms per step (median)"],
    )
    table.rows.append(["local (run() in the caller)", f"{median(local_ms):.3f}"])
    table.rows.append(["distributed (1 worker process)", f"{median(remote_ms):.3f}"])
    extra = median(remote_ms) - median(local_ms)
    floor = median(floor_ms)
    table.rows.append(["overhead", f"{extra:.3f}"])
    table.rows.append(["a Redis SET of ~1 KB (the machine's round trip)", f"{floor:.3f}"])
    table.rows.append(["overhead in such round trips", f"{extra / floor:.1f}"])
    table.notes.append(
        f"one run of {steps} steps of ~1 KB, {reps} repetitions interleaved; the distributed "
        "time is end to end in the caller (store the run, publish, the worker's steps, the "
        "caller seeing the result)"
    )
    return table


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RedisMeter:
    """The Redis server's CPU time (from /proc, when it runs on this host) and its
    commands (``INFO commandstats``: calls and microseconds by command) so far; every
    client of the server counts, the benchmark's and any other's."""

    def __init__(self) -> None:
        import redis

        self.client = redis.Redis.from_url(REDIS_URL)
        pid = int(self.client.info("server")["process_id"])
        self.pid = pid if Path(f"/proc/{pid}/stat").exists() else None

    def read(self) -> tuple[float | None, dict[str, tuple[int, int]]]:
        """CPU seconds (None: not on this host) and command -> (calls, usec)."""
        stats = self.client.info("commandstats")
        commands = {k.removeprefix("cmdstat_"): (v["calls"], v["usec"]) for k, v in stats.items()}
        return (cpu_seconds(self.pid) if self.pid else None), commands


@dataclass
class Measured:
    """One throughput run: steps/s and CPU ms per step of the workers, the Redis server
    (None: not on this host) and the caller; Redis commands per step (calls, usec)."""

    rate: float
    worker_ms: float
    redis_ms: float | None
    caller_ms: float
    commands: dict[str, tuple[float, float]]


async def throughput(broker: str, runs: int, run_steps: int, workers: int, work: float) -> Measured:
    """Aggregate committed steps per second of ``runs`` concurrent runs on ``workers``
    (each step spending ``work`` CPU milliseconds in its agent), and the CPU per step of
    the workers, of Redis and of this process (the caller: it creates, publishes and
    waits for the runs)."""
    deployment = Deployment(broker, steps=run_steps, work=work)
    processes = [deployment.start_worker(64) for _ in range(workers)]
    meter = RedisMeter()
    try:
        with deployment.applied():
            caller = make()
        await warm_up(caller)
        book = caller.checkpointed_runs()
        store = await book.ready()
        assert caller.transport is not None
        cpu_before = sum(cpu_seconds(p.pid) for p in processes)
        redis_before, commands_before = meter.read()
        caller_before = time.process_time()
        started = time.perf_counter()
        run_ids = []
        for _ in range(runs):  # what submit() does, without a waiting task per run
            run = await book.create_queued(START_INPUT, None)
            await publish_first(caller, caller.transport, run)
            run_ids.append(run.run_id)
        for run_id in run_ids:  # in order: the poll of each is cheap, most are done
            await wait_result(store, run_id, None)
        elapsed = time.perf_counter() - started
        caller_cpu = time.process_time() - caller_before
        redis_after, commands_after = meter.read()
        cpu = sum(cpu_seconds(p.pid) for p in processes) - cpu_before
        await caller.stop()
    finally:
        meter.client.close()
        await deployment.close()
    steps = runs * run_steps
    per_step = {
        name: (
            (calls - commands_before.get(name, (0, 0))[0]) / steps,
            (usec - commands_before.get(name, (0, 0))[1]) / steps,
        )
        for name, (calls, usec) in commands_after.items()
    }
    redis_ms = None
    if redis_before is not None and redis_after is not None:
        redis_ms = (redis_after - redis_before) * 1000 / steps
    return Measured(
        steps / elapsed, cpu * 1000 / steps, redis_ms, caller_cpu * 1000 / steps, per_step
    )


def ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


async def scaling(broker: str, runs: int, run_steps: int, reps: int, work: float) -> list[Table]:
    """Steps per second of 1 and 2 worker processes (agents spending ``work`` CPU ms a
    step), the CPU per step of workers, Redis and caller, and Redis's commands per step
    with 1 worker."""
    measured: dict[int, list[Measured]] = {1: [], 2: []}
    for rep in range(reps):
        for workers in (1, 2) if rep % 2 == 0 else (2, 1):
            progress(f"throughput rep {rep + 1}/{reps}, {workers} workers")
            measured[workers].append(await throughput(broker, runs, run_steps, workers, work))
    one, two = (median([m.rate for m in measured[n]]) for n in (1, 2))
    table = Table(
        f"Throughput of {runs} concurrent {run_steps}-step runs "
        f"({broker_name(broker)}, Redis store, agents spending {work:g} CPU ms a step)",
        [
            "workers",
            "steps/s (median)",
            "vs 1 worker",
            "CPU ms per step (median): workers",
            "Redis server",
            "caller",
        ],
    )
    for workers, rate in ((1, one), (2, two)):
        runs_of = measured[workers]
        redis = [m.redis_ms for m in runs_of if m.redis_ms is not None]
        table.rows.append(
            [
                f"{workers} process{'es' if workers > 1 else ''}",
                f"{rate:,.0f}",
                f"{rate / one:.2f}x",
                f"{median([m.worker_ms for m in runs_of]):.3f}",
                ms(median(redis) if redis else None),
                f"{median([m.caller_ms for m in runs_of]):.3f}",
            ]
        )
    table.notes.append(
        f"concurrency 64 per worker; from the first publish to the last run completed; "
        f"{reps} repetitions; the machine's other load shares its {os.cpu_count()} cores; "
        "CPU: user + system time (/proc) over the steps, of the worker processes, of the "
        "Redis server (any other client's use of it included) and of the benchmark's own "
        "process, the caller"
    )
    commands = Table(
        f"Redis commands per step with 1 worker (agents spending {work:g} CPU ms a step, "
        "last repetition; a script's commands count in it and on their own)",
        ["command", "calls per step", "µs per step"],
    )
    last = measured[1][-1].commands
    for name, (calls, usec) in sorted(last.items(), key=lambda kv: -kv[1][1])[:12]:
        if calls > 0:
            commands.rows.append([name, f"{calls:.3f}", f"{usec:.2f}"])
    return [table, commands]


async def recovery(broker: str, lease: float, reps: int) -> Table:
    """Seconds from a worker's SIGKILL mid-step to the run's next committed step."""
    times = []
    for rep in range(reps):
        progress(f"recovery rep {rep + 1}/{reps}")
        deployment = Deployment(broker, steps=4, lease=lease, slow=STEP_SECONDS)
        try:
            with deployment.applied():
                caller = make()
            store = await caller.checkpointed_runs().ready()
            deployment.start_worker(1)
            await warm_up(caller)
            deployment.start_worker(1)
            task = await caller.submit(START_INPUT, run_id="victim")
            run = await store.get_run("victim")
            while run is None or run.step_seq < 1 or (run.lease_until or 0) < time.time():
                await asyncio.sleep(0.005)
                run = await store.get_run("victim")
            # a step after the first is under way, held by one of the two workers: kill it
            assert run.owner is not None
            seq = run.step_seq
            await asyncio.sleep(STEP_SECONDS / 2)
            os.kill(run.owner.pid, signal.SIGKILL)
            killed = time.perf_counter()
            while (await store.get_run("victim")).step_seq <= seq:  # type: ignore[union-attr]
                await asyncio.sleep(0.01)
            times.append(time.perf_counter() - killed)
            await task.result(timeout=60)
            await caller.stop()
        finally:
            await deployment.close()
    table = Table(
        f"From a worker's SIGKILL to its run's next committed step ({broker_name(broker)})",
        ["lease", "seconds (median)", "max", "target"],
    )
    table.rows.append(
        [f"{lease:g} s", f"{median(times):.2f}", f"{max(times):.2f}", f"<= {lease + 1:g} s"]
    )
    table.notes.append(
        f"{reps} kills, each {STEP_SECONDS / 2:g} s into a {STEP_SECONDS:g} s step, the other "
        f"worker idle; the time includes that step run again from its start ({STEP_SECONDS:g} s)"
    )
    return table


def broker_name(broker: str) -> str:
    return "Redis Streams" if broker == "redis" else "RabbitMQ"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="steps of the overhead run")
    parser.add_argument("--runs", type=int, default=200, help="concurrent runs (throughput)")
    parser.add_argument("--run-steps", type=int, default=20, help="steps of each such run")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--lease", type=float, default=2.0, help="lease of the recovery runs")
    parser.add_argument("--broker", default="redis", help="redis, or an amqp:// URL")
    parser.add_argument("--only", nargs="*", default=["overhead", "scaling", "recovery"])
    parser.add_argument(
        "--agent-work",
        type=float,
        nargs="*",
        default=[0.0],
        help="CPU ms each agent spends per step in the throughput runs (one table each)",
    )
    args = parser.parse_args()
    tables = []
    if "overhead" in args.only:
        tables.append(await overhead(args.broker, args.steps, args.reps))
    if "scaling" in args.only:
        for work in args.agent_work:
            tables += await scaling(args.broker, args.runs, args.run_steps, args.reps, work)
    if "recovery" in args.only:
        tables.append(await recovery(args.broker, args.lease, args.reps))
    print_tables(tables)


if __name__ == "__main__":
    asyncio.run(main())
