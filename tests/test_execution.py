"""The step loop does O(1) work per step beyond the agent, checked by counting.

Three deterministic measures, each compared between a short and a long ROUND_ROBIN loop:
the history is one list that grows by one entry per turn, which each step's new context
shares (no copy);
the number of Python and C function calls per turn is the same at turn 200 and turn 4000;
and the memory a step allocates and frees again does not grow with the history.
"""

from __future__ import annotations

import gc
import statistics
import sys
import tracemalloc
from collections.abc import Callable
from types import FrameType
from typing import Any

from nestegg import Clutch, ClutchContext, Strategy, get_context

SHORT_RUN = 200
LONG_RUN = 4000
MESSAGE = "x" * 1024
CALL_SLACK = 8
"""Calls a run may differ by besides the per-turn count (one-off event-loop work)."""
TRANSIENT_SLACK_BYTES = 256
"""How much more a late step may allocate temporarily than an early one (a copy of a
4000-entry history alone would be 32 KB)."""


def loop_clutch(turns: int, on_step: Any = None) -> Clutch:
    """Two agents taking turns; each returns the ~1 KB message it got."""
    clutch = Clutch("loop", strategy=Strategy.ROUND_ROBIN, max_turns=turns, on_step=on_step)

    @clutch.agent
    async def ping(data: str) -> str:
        return data

    @clutch.agent
    async def pong(data: str) -> str:
        return data

    return clutch


async def test_history_is_one_list_growing_by_one_entry_per_turn() -> None:
    contexts: list[ClutchContext] = []
    seen: list[tuple[int, int]] = []

    async def on_step(name: str, input_data: Any, output: Any) -> None:
        ctx = get_context()
        contexts.append(ctx)  # kept alive, so that no two share an id
        seen.append((id(ctx.state.history), len(ctx.state.history)))

    assert await loop_clutch(SHORT_RUN, on_step).run(MESSAGE) == MESSAGE
    assert len({id(ctx) for ctx in contexts}) == len({id(c.state) for c in contexts}) == SHORT_RUN
    assert len({history for history, _ in seen}) == 1
    assert [length for _, length in seen] == list(range(SHORT_RUN))


async def count_calls(turns: int) -> tuple[int, int]:
    """Python-level and C-level function calls made while a run of ``turns`` executes."""
    counts = {"call": 0, "c_call": 0}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event in counts:
            counts[event] += 1

    task = await loop_clutch(turns).submit(MESSAGE)
    previous: Callable[..., Any] | None = sys.getprofile()
    gc_was_enabled = gc.isenabled()
    gc.disable()  # finalizers run by a collection would add calls at random points
    sys.setprofile(profile)
    try:
        await task
    finally:
        sys.setprofile(previous)
        if gc_was_enabled:
            gc.enable()
    return counts["call"], counts["c_call"]


async def test_calls_per_turn_do_not_grow_with_the_history() -> None:
    await count_calls(SHORT_RUN)  # warm-up: first-use work (lazy imports, caches) not counted
    short = await count_calls(SHORT_RUN)
    middle = await count_calls(SHORT_RUN + LONG_RUN // 2)
    long = await count_calls(SHORT_RUN + LONG_RUN)
    for kind in range(2):
        first_half = middle[kind] - short[kind]
        second_half = long[kind] - middle[kind]
        assert abs(second_half - first_half) <= CALL_SLACK, (kind, short, middle, long)
    per_turn = (long[0] - short[0]) / LONG_RUN
    assert per_turn < 100, f"{per_turn} Python calls per turn"


async def transient_bytes_per_step(turns: int) -> list[int]:
    """Per step: the peak of traced memory above what stays allocated after the step."""
    transients: list[int] = []

    async def on_step(name: str, input_data: Any, output: Any) -> None:
        current, peak = tracemalloc.get_traced_memory()
        transients.append(peak - current)
        tracemalloc.reset_peak()

    clutch = loop_clutch(turns, on_step)
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        await clutch.run(MESSAGE)
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return transients


async def test_step_allocations_do_not_grow_with_the_history() -> None:
    await transient_bytes_per_step(SHORT_RUN)  # warm-up
    early = statistics.median((await transient_bytes_per_step(SHORT_RUN))[SHORT_RUN // 2 :])
    late = statistics.median((await transient_bytes_per_step(LONG_RUN))[-SHORT_RUN // 2 :])
    assert late <= early + TRANSIENT_SLACK_BYTES, (early, late)
