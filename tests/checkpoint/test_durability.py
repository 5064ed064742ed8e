"""Durability: "sync" commits each step before the next starts, "async" writes behind and
flushes before run() returns, "exit" writes only when the run ends, fails or is cancelled.

What is stored is read through a second handle on the same store (for memory: the same
object), the way another process would see it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from nestegg import get_context
from nestegg.checkpoint import CheckpointInfo
from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.base import CheckpointStorage

from .conftest import Flaky, Pipeline, replace_agent, wait_for

Reopen = Callable[[], Awaitable[CheckpointStorage]]
NAMES = ("a", "b", "c", "d", "e")


class SlowCommits:
    """A store whose commits take ``delay`` seconds longer."""

    def __init__(self, inner: CheckpointStorage, delay: float) -> None:
        self.inner = inner
        self.delay = delay
        self.commits = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def commit(self, commit: Commit) -> None:
        await asyncio.sleep(self.delay)
        await self.inner.commit(commit)
        self.commits += 1


async def what_is_stored(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    run = await store.get_run(run_id)
    return {
        "status": run.status if run else None,
        "step_seq": run.step_seq if run else None,
        "steps": [s.seq for s in await store.load_steps(run_id)],
        "checkpoints": [c.seq for c in await store.list_checkpoints(run_id)],
        "events": [e.kind for e in await store.read_events(run_id)],
    }


def observing(pipeline: Pipeline, reader: CheckpointStorage, seen: list[dict[str, Any]]) -> None:
    """Make every agent of ``pipeline`` record what ``reader`` sees of the run first."""
    for name in pipeline.clutch.agent_names:
        inner = pipeline.appender(name)

        async def agent(data: list[str], inner: Any = inner) -> list[str]:
            seen.append(await what_is_stored(reader, get_context().run_id))
            result: list[str] = await inner(data)
            return result

        agent.__name__ = name
        replace_agent(pipeline.clutch, agent)


# -------------------------------------------------------------------------- sync


async def test_sync_commits_each_step_before_the_next_starts(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, durability="sync", keep_latest=None)
    seen: list[dict[str, Any]] = []
    observing(pipeline, await reopen_store(), seen)
    await pipeline.clutch.run([], run_id="sync")

    for index, view in enumerate(seen):
        done = list(range(1, index + 1))
        assert view["status"] == "running"
        assert view["step_seq"] == index
        assert view["steps"] == done, f"before step {index + 1}"
        assert view["checkpoints"] == done, f"before step {index + 1}"
        assert view["events"].count("step_completed") == index
    final = await what_is_stored(await reopen_store(), "sync")
    assert final["status"] == "completed" and final["steps"] == [1, 2, 3, 4, 5]


async def test_sync_commits_a_step_even_when_no_checkpoint_is_due(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, every_n_steps=100)
    seen: list[dict[str, Any]] = []
    observing(pipeline, await reopen_store(), seen)
    await pipeline.clutch.run([], run_id="steps-only")
    assert [v["steps"] for v in seen] == [[], [1], [1, 2], [1, 2, 3], [1, 2, 3, 4]]
    assert all(v["checkpoints"] == [] for v in seen)


# ------------------------------------------------------------------------- async


async def test_async_writes_behind_and_flushes_before_run_returns(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    hooked: list[tuple[CheckpointInfo, bool]] = []
    reader = await reopen_store()

    async def on_checkpoint(info: CheckpointInfo) -> None:
        stored = await reader.get_checkpoint(info.checkpoint_id)
        hooked.append((info, stored is not None))

    slow = SlowCommits(checkpoint_store, delay=0.05)
    pipeline = Pipeline(
        slow,  # type: ignore[arg-type]
        NAMES,
        durability="async",
        keep_latest=None,
        on_checkpoint=on_checkpoint,
    )
    seen: list[dict[str, Any]] = []
    observing(pipeline, reader, seen)
    assert await pipeline.clutch.run([], run_id="async") == list(NAMES)

    # The agents did not wait for the store: a later step started before the earlier
    # ones were stored.
    assert any(len(v["steps"]) < index for index, v in enumerate(seen))
    stored = await what_is_stored(reader, "async")
    assert stored["status"] == "completed"
    assert stored["steps"] == [1, 2, 3, 4, 5]
    assert stored["checkpoints"] == [1, 2, 3, 4, 5]
    assert stored["events"][-1] == "run_completed"
    # Each hook ran after its checkpoint was stored, in order, all before run() returned.
    assert [info.seq for info, _ in hooked] == [1, 2, 3, 4, 5]
    assert all(was_stored for _, was_stored in hooked)
    assert [info for info, _ in hooked] == await pipeline.clutch.list_checkpoints("async")


async def test_async_failure_is_flushed_and_resumes_after_the_last_good_step(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    slow = SlowCommits(checkpoint_store, delay=0.02)
    pipeline = Pipeline(slow, NAMES, durability="async", keep_latest=None)  # type: ignore[arg-type]
    pipeline.fail.add("d")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="async-failed")
    stored = await what_is_stored(await reopen_store(), "async-failed")
    assert stored["status"] == "failed"
    assert stored["steps"] == [1, 2, 3] and stored["checkpoints"] == [1, 2, 3]
    assert stored["events"][-2:] == ["step_failed", "run_failed"]

    restarted = Pipeline(await reopen_store(), NAMES, durability="async")
    assert await restarted.clutch.resume_latest("async-failed") == list(NAMES)
    assert restarted.calls == ["d", "e"]


# -------------------------------------------------------------------------- exit


async def test_exit_writes_nothing_but_the_run_until_the_end(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, durability="exit", keep_latest=None)
    seen: list[dict[str, Any]] = []
    observing(pipeline, await reopen_store(), seen)
    assert await pipeline.clutch.run([], run_id="exit") == list(NAMES)

    for view in seen:
        assert view["status"] == "running" and view["step_seq"] == 0
        assert view["steps"] == [] and view["checkpoints"] == []
        assert view["events"] == ["run_started"]
    stored = await what_is_stored(await reopen_store(), "exit")
    assert stored["status"] == "completed" and stored["step_seq"] == 5
    assert stored["steps"] == [1, 2, 3, 4, 5]
    assert stored["checkpoints"] == [5]
    [checkpoint] = await pipeline.clutch.list_checkpoints("exit")
    assert checkpoint.reason == "final"
    assert stored["events"].count("step_completed") == 5
    assert stored["events"][-1] == "run_completed"


async def test_exit_failure_writes_the_steps_and_a_final_checkpoint(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, durability="exit")
    pipeline.fail.add("d")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="exit-failed")
    stored = await what_is_stored(await reopen_store(), "exit-failed")
    assert stored["status"] == "failed"
    assert stored["steps"] == [1, 2, 3] and stored["checkpoints"] == [3]

    restarted = Pipeline(await reopen_store(), NAMES, durability="exit")
    assert await restarted.clutch.resume_latest("exit-failed") == list(NAMES)
    assert restarted.calls == ["d", "e"]


async def test_exit_cancellation_writes_the_steps_and_a_final_checkpoint(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, durability="exit")
    pipeline.gate("c")
    task = await pipeline.clutch.submit([], run_id="exit-cancelled")
    await wait_for(pipeline.entered["c"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stored = await what_is_stored(await reopen_store(), "exit-cancelled")
    assert stored["status"] == "cancelled"
    assert stored["steps"] == [1, 2] and stored["checkpoints"] == [2]

    restarted = Pipeline(await reopen_store(), NAMES, durability="exit")
    assert await restarted.clutch.resume_latest("exit-cancelled") == list(NAMES)
    assert restarted.calls == ["c", "d", "e"]
