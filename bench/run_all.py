"""Runs every benchmark, each in its own process, and prints the machine and the tables.

    make bench                                   # setup.sh, then this script
    .venv-bench/bin/python bench/run_all.py [--quick] [--only NAME ...]

The server benchmark runs only when PostgreSQL and Redis answer (see server_stores.py for
the URLs); otherwise it prints why it was left out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from harness import machine_markdown

BENCH_DIR = Path(__file__).resolve().parent

BENCHMARKS = {
    "floors": ("floors.py", ["--ops", "300", "--rounds", "3"]),
    "clutch": ("clutch_vs_eggai.py", ["--sizes", "100", "1000", "--reps", "3"]),
    "checkpoint": ("checkpoint_vs_langgraph.py", ["--sizes", "100", "1000", "--reps", "1"]),
    "server": ("server_stores.py", ["--sizes", "100", "1000", "--reps", "1"]),
    "journal": ("journal_call.py", ["--calls", "200", "--reps", "1"]),
    "distributed": ("distributed.py", ["--steps", "50", "--runs", "40", "--reps", "1"]),
    "langgraph": (
        "langgraph_saver.py",
        ["--steps", "200", "--reps", "1", "--linear", "100", "1000"],
    ),
    "concurrent": (
        "concurrent_runs.py",
        ["--runs", "1", "100", "1000", "--total", "5000", "--idle", "1000", "--reps", "1"],
    ),
}
"""name -> (script, the arguments of a quick run)."""


async def servers_reachable() -> str | None:
    """None if PostgreSQL and Redis both answer, else why not."""
    import psycopg
    import redis.asyncio as aioredis
    from server_stores import PG_URL, REDIS_URL

    try:
        conn = await psycopg.AsyncConnection.connect(PG_URL, connect_timeout=3)
        await conn.close()
    except Exception as exc:
        return f"PostgreSQL at {PG_URL} does not answer: {exc}"
    client = aioredis.from_url(REDIS_URL, socket_connect_timeout=3)
    try:
        await client.ping()
    except Exception as exc:
        return f"Redis at {REDIS_URL} does not answer: {exc}"
    finally:
        await client.aclose()
    return None


def load_average() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def run_benchmark(script: str, args: list[str]) -> int:
    command = [sys.executable, str(BENCH_DIR / script), *args]
    shown = " ".join([".venv-bench/bin/python", f"bench/{script}", *args])
    print(f"## `{shown}`\n", flush=True)
    load_before = load_average()
    start = time.perf_counter()
    code = subprocess.run(command, check=False).returncode
    elapsed = time.perf_counter() - start
    print(
        f"({elapsed:.0f} s, exit code {code}; 1-minute load average {load_before} before, "
        f"{load_average()} after, on {os.cpu_count()} CPUs)\n",
        flush=True,
    )
    return code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions, small sizes")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), default=list(BENCHMARKS))
    args = parser.parse_args()

    print("# nestegg benchmarks\n")
    print(machine_markdown())
    failures = 0
    for name in args.only:
        script, quick_args = BENCHMARKS[name]
        if not (BENCH_DIR / script).exists():
            print(f"## {script}: not present, left out\n")
            continue
        if name in ("server", "distributed"):  # floors.py notes an absent server itself
            why = asyncio.run(servers_reachable())
            if why:
                print(f"## {script}: left out: {why}\n")
                continue
        failures += run_benchmark(script, quick_args if args.quick else []) != 0
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
