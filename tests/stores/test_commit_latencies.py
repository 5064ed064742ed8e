"""How long commits take to be written, as measured for the many-runs benchmark."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from nestegg.checkpoint.stores.group import commit_latencies
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.testing.builders import create, make_commit, make_step


async def test_every_commit_is_timed_until_written_while_measured(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"r{i}") for i in range(5)]
    waits: list[float] = []

    async def commit(seq: int, index: int) -> None:
        run = runs[index]
        started = time.perf_counter()
        await store.commit(make_commit(run, steps=[make_step(run.run_id, seq)]))
        waits.append(time.perf_counter() - started)

    with commit_latencies() as latencies:
        await asyncio.gather(*(commit(1, i) for i in range(5)))  # one alone, four batched
    assert len(latencies) == 5
    assert all(0 < seconds for seconds in latencies)
    assert sum(latencies) <= sum(waits)
    await commit(2, 0)  # no longer measured
    assert len(latencies) == 5
    await store.close()


async def test_only_the_commits_that_write_a_step_are_timed_when_asked(tmp_path: Path) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store, run_id="r")
    with commit_latencies(steps_only=True) as steps, commit_latencies() as every:
        await store.commit(make_commit(run))  # a run's opening: no step
        await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))
    assert (len(steps), len(every)) == (1, 2)
    await store.close()
