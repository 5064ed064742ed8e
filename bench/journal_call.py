"""The cost of one journaled call (``await nestegg.call(fn, ...)``) on the default store.

A checkpointed run (SQLite store, ``durability="sync"``, a checkpoint every step) whose
agent makes ``--calls`` calls per step to an async fake LLM that answers ~1 KB. Measured
side by side: the same run calling the function directly, and calling it through
``nestegg.call``; the difference per call is what journaling costs. Then the replay: a
step that made its calls and then failed is resumed, and its calls come back from the
journal (``steps x calls`` of them, in one step); the resume is compared with one of a
step that made no calls.

    .venv-bench/bin/python bench/journal_call.py [--calls 100] [--steps 10] [--reps N]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

from harness import (
    LARGE_TIMEOUT,
    START_INPUT,
    Table,
    fmt_us,
    interleaved,
    median,
    message,
    print_tables,
    timed,
)

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy, SQLiteCheckpointStorage

POLICY = CheckpointPolicy(every_n_steps=1, keep_latest=3, durability="sync")
DIRECT = "direct call"
JOURNALED = "nestegg.call"


async def fake_llm(prompt: str, turn: int) -> dict[str, Any]:
    """Stands for a paid API call: answers a ~1 KB message at once."""
    return message(turn)


Caller = Callable[..., Awaitable[Any]]


async def direct(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
    return await fn(*args)


CALLERS: dict[str, Caller] = {DIRECT: direct, JOURNALED: nestegg.call}


def calling_clutch(
    storage: SQLiteCheckpointStorage,
    steps: int,
    calls: int,
    caller: Caller,
    run_id: str,
    fail_once: bool = False,
) -> Clutch:
    clutch = Clutch(
        "bench",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=storage, policy=POLICY, run_id=run_id),
    )
    failing = {"armed": fail_once}

    @clutch.agent()
    async def step(data):  # untyped, like the agents of clutch_vs_eggai.py
        turn = data["turn"] + 1
        answer = data
        for position in range(calls):
            answer = await caller(fake_llm, f"prompt {turn}.{position}", turn)
        if failing["armed"] and turn == steps:
            failing["armed"] = False
            raise RuntimeError("injected failure after the calls")
        return answer if calls else message(turn)

    return clutch


async def measure_calls(steps: int, calls: int, reps: int) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {name: [] for name in CALLERS}
    for rep in range(reps):
        for name in interleaved(list(CALLERS), rep):
            with tempfile.TemporaryDirectory(prefix="nestegg-journal-") as tmp:
                storage = SQLiteCheckpointStorage(Path(tmp) / "nestegg.db")
                await storage.setup()
                clutch = calling_clutch(storage, steps, calls, CALLERS[name], f"calls-{rep}")
                elapsed, _ = await timed(partial(clutch.run, START_INPUT, timeout=LARGE_TIMEOUT))
                await storage.close()
                seconds[name].append(elapsed)
    return seconds


async def measure_replay(calls: int, reps: int) -> dict[int, list[float]]:
    """Seconds of resume_latest of a one-step run whose step failed after ``calls`` calls."""
    seconds: dict[int, list[float]] = {0: [], calls: []}
    for rep in range(reps):
        for made in interleaved([0, calls], rep):
            with tempfile.TemporaryDirectory(prefix="nestegg-journal-") as tmp:
                storage = SQLiteCheckpointStorage(Path(tmp) / "nestegg.db")
                await storage.setup()
                run_id = f"replay-{made}"
                failing = calling_clutch(storage, 1, made, nestegg.call, run_id, fail_once=True)
                try:
                    await failing.run(START_INPUT, timeout=LARGE_TIMEOUT)
                except Exception:
                    pass
                else:
                    raise AssertionError("the injected failure did not fail the run")
                clutch = calling_clutch(storage, 1, made, nestegg.call, run_id)
                elapsed, _ = await timed(partial(clutch.resume_latest, run_id))
                await storage.close()
                seconds[made].append(elapsed)
    return seconds


async def run(steps: int, calls: int, reps: int) -> list[Table]:
    timings = await measure_calls(steps, calls, reps)
    total_calls = steps * calls
    direct_s = median(timings[DIRECT])
    journaled_s = median(timings[JOURNALED])
    table = Table(
        title="Journaled calls on the default store (SQLite, durability sync)",
        headers=["measure", "µs per call", "reps"],
    )
    table.rows.append(
        ["run with direct calls (per call)", fmt_us(direct_s / total_calls), str(reps)]
    )
    table.rows.append(
        ["run with `nestegg.call` (per call)", fmt_us(journaled_s / total_calls), str(reps)]
    )
    table.rows.append(
        [
            "journaling cost of one call (difference)",
            fmt_us((journaled_s - direct_s) / total_calls),
            str(reps),
        ]
    )
    replay_calls = total_calls
    replay = await measure_replay(replay_calls, reps)
    table.rows.append(
        [
            f"replay of one recorded call (resume of a step that made {replay_calls:,} "
            "calls, minus that of one that made none)",
            fmt_us((median(replay[replay_calls]) - median(replay[0])) / replay_calls),
            str(reps),
        ]
    )
    table.notes.append(
        f"{steps} steps x {calls} calls per step to an async fake LLM answering ~1 KB; a "
        "checkpoint after every step; the two runs interleaved, medians."
    )
    return [table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="journaled calls per step")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    print_tables(asyncio.run(run(args.steps, args.calls, args.reps)))


if __name__ == "__main__":
    main()
