"""nestegg's Clutch against eggai-clutch 0.2.2 on the same in-memory workload.

A ROUND_ROBIN loop of one agent that returns a ~1 KB message, ``max_turns`` = 100, 1000
and 10,000. Both libraries run in this one process, interleaved repetition by
repetition; the table shows median steps/s, the ratio and the median cost of one step.

    .venv-bench/bin/python bench/clutch_vs_eggai.py [--sizes 100 1000 10000] [--reps N]
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import eggai_clutch
from harness import (
    LARGE_TIMEOUT,
    START_INPUT,
    Table,
    fmt_int,
    fmt_ratio,
    fmt_us,
    interleaved,
    median,
    next_message,
    print_tables,
    timed,
)

import nestegg

DEFAULT_SIZES = (100, 1000, 10_000)
DEFAULT_REPS = {100: 31, 1000: 11, 10_000: 3}
"""Repetitions per size; eggai-clutch needs ~25 s for one 10,000-turn run (quadratic)."""

NESTEGG = "nestegg"
EGGAI = "eggai-clutch 0.2.2"


def nestegg_loop(turns: int) -> Callable[[], Awaitable[Any]]:
    clutch = nestegg.Clutch("bench", strategy=nestegg.Strategy.ROUND_ROBIN, max_turns=turns)

    @clutch.agent()
    async def step(data):  # untyped: eggai-clutch cannot isinstance() a dict[str, Any]
        return next_message(data)

    return lambda: clutch.run(START_INPUT, timeout=LARGE_TIMEOUT)


def eggai_loop(turns: int) -> Callable[[], Awaitable[Any]]:
    clutch = eggai_clutch.Clutch(
        "bench", strategy=eggai_clutch.Strategy.ROUND_ROBIN, max_turns=turns
    )

    @clutch.agent()
    async def step(data):  # untyped: eggai-clutch cannot isinstance() a dict[str, Any]
        return next_message(data)

    return lambda: clutch.run(START_INPUT, timeout=LARGE_TIMEOUT)


BUILDERS = {NESTEGG: nestegg_loop, EGGAI: eggai_loop}


async def measure_size(turns: int, reps: int) -> dict[str, list[float]]:
    """Seconds per run of each library, ``reps`` times, interleaved."""
    seconds: dict[str, list[float]] = {name: [] for name in BUILDERS}
    for rep in range(reps):
        for name in interleaved(list(BUILDERS), rep):
            run = BUILDERS[name](turns)
            elapsed, result = await timed(run)
            if result["turn"] != turns:
                raise AssertionError(f"{name} ran {result['turn']} turns, not {turns}")
            seconds[name].append(elapsed)
    return seconds


async def run(sizes: Sequence[int], reps: int | None) -> list[Table]:
    table = Table(
        title="Clutch: nestegg vs eggai-clutch (ROUND_ROBIN, one agent, ~1 KB message/step)",
        headers=[
            "turns",
            "nestegg steps/s",
            "eggai-clutch steps/s",
            "ratio",
            "nestegg µs/step",
            "eggai-clutch µs/step",
            "reps",
        ],
    )
    for turns in sizes:
        n = reps or DEFAULT_REPS.get(turns, 5)
        seconds = await measure_size(turns, n)
        ours = turns / median(seconds[NESTEGG])
        theirs = turns / median(seconds[EGGAI])
        table.rows.append(
            [
                fmt_int(turns),
                fmt_int(ours),
                fmt_int(theirs),
                fmt_ratio(ours / theirs),
                fmt_us(1 / ours),
                fmt_us(1 / theirs),
                str(n),
            ]
        )
    table.notes.append(
        "Median over the repetitions, the two libraries interleaved in one process; "
        "a run is `await clutch.run(input, timeout=1e9)` on a new Clutch."
    )
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--reps", type=int, default=None, help="repetitions for every size")
    args = parser.parse_args()
    print_tables(asyncio.run(run(args.sizes, args.reps)))


if __name__ == "__main__":
    main()
