"""Objects a run in flight keeps alive for Python's cyclic garbage collector.

Runs one row of ``bench/concurrent_runs.py`` (N runs of M steps at once on SQLite,
``max_pending_commits`` as given) and, once half of its step commits have arrived, counts
every object the collector tracks (``gc.get_objects()``), in all and by type, per run. The
objects a full collection visits, and those that reach its oldest generation as the runs
start: fewer of them, fewer and shorter pauses of the event loop.

Usage:
    .venv-bench/bin/python bench/objects_per_run.py [--runs 1000] [--steps 20] [--pending 64]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from collections import Counter
from typing import Any

import concurrent_runs

from nestegg.checkpoint.stores import group


def census(runs: int, top: int) -> None:
    """Print the objects the collector tracks now, in all and the ``top`` types, per run."""
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    total = sum(counts.values())
    print(f"objects tracked: {total:,}, {total / runs:.1f} per run")
    for name, count in counts.most_common(top):
        print(f"{count:10,} {count / runs:7.1f}  {name}")


async def main(runs: int, steps: int, pending: int | None, top: int) -> None:
    half = runs * steps // 2
    seen = [0]
    commit = group.GroupCommitter.commit

    async def counted(self: group.GroupCommitter, change: Any) -> None:
        seen[0] += 1
        if seen[0] == half:
            census(runs, top)
        await commit(self, change)

    group.GroupCommitter.commit = counted  # type: ignore[method-assign]
    try:
        await concurrent_runs.one_row("sqlite", runs, steps, 0, 0.0, pending=pending)
    finally:
        group.GroupCommitter.commit = commit  # type: ignore[method-assign]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pending", type=concurrent_runs.pending_setting, default=64)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.steps, args.pending, args.top))
