"""A cancellation a library loses still stops nestegg's loops and runs.

On Python 3.11, ``asyncio.wait_for`` (which redis-py sends every command through) may
return its result to a task whose cancellation arrived in the same turn of the loop, and
the cancellation is gone. The doubles here lose one cancellation on purpose, the way it
does: they catch the ``CancelledError`` and return as if the call had ended normally.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from nestegg import Clutch
from nestegg.cancellation import (
    CancelWatch,
    cancel,
    cancel_requested,
    raise_if_cancel_requested,
)
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.constants import CANCELLED

WAIT_S = 5.0
"""Upper bound for what happens at once (never reached when green)."""


async def lose_one_cancellation(forever: asyncio.Event) -> None:
    """Wait on ``forever`` and return normally when cancelled, as a lost cancellation."""
    try:
        await forever.wait()
    except asyncio.CancelledError:
        pass


async def a_task_group_whose_child_failed() -> None:
    """An ``asyncio.TaskGroup`` whose child failed, its failure handled."""

    async def fails() -> None:
        raise ValueError("a child failed")

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(fails())
            await asyncio.Event().wait()
    except* ValueError:
        pass


async def test_a_task_whose_cancellation_was_lost_knows_it_should_stop() -> None:
    checked: list[bool] = []

    async def loses_then_checks() -> None:
        checked.append(cancel_requested())
        await lose_one_cancellation(asyncio.Event())
        checked.append(cancel_requested())
        raise_if_cancel_requested()

    task = asyncio.ensure_future(loses_then_checks())
    await asyncio.sleep(0)
    assert cancel(task)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert checked == [False, True]
    assert not cancel(task)  # done: nothing to cancel


async def test_cancellations_nestegg_did_not_ask_for_are_no_stop() -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await asyncio.Event().wait()
    assert not cancel_requested()
    raise_if_cancel_requested()

    async def waits_in_a_task_group() -> None:
        await a_task_group_whose_child_failed()
        # Python 3.11 and 3.12 leave the task counted as cancelled here
        raise_if_cancel_requested()

    await asyncio.wait_for(asyncio.ensure_future(waits_in_a_task_group()), WAIT_S)


class LosesTheRenewalsCancellation(MemoryCheckpointStorage):
    """Its first lease renewal (a commit of a lease and nothing else) waits until it is
    cancelled, then loses the cancellation and writes the renewal."""

    def __init__(self) -> None:
        super().__init__()
        self.renewing = asyncio.Event()
        self.lost = False

    async def commit(self, commit: Commit) -> None:
        renewal = commit.lease_until is not None and not (commit.steps or commit.events)
        if renewal and not self.lost:
            self.renewing.set()
            await lose_one_cancellation(asyncio.Event())
            self.lost = True
        await super().commit(commit)


async def test_a_heartbeat_whose_cancellation_a_store_lost_still_stops() -> None:
    store = LosesTheRenewalsCancellation()
    config = CheckpointConfig(storage=store, lease=timedelta(seconds=0.06))
    clutch = Clutch("beat", checkpoint=config)

    @clutch.agent()
    async def waits_for_a_renewal(data: dict[str, Any]) -> dict[str, Any]:
        await store.renewing.wait()  # the heartbeat now waits in its renewal
        return {"done": True}

    # The run's end cancels its heartbeat, which the store's renewal loses: the run
    # returns only once the heartbeat has stopped all the same.
    assert await asyncio.wait_for(clutch.run({}, run_id="r1"), WAIT_S) == {"done": True}
    assert store.lost
    assert (await store.get_run("r1")).status == "completed"  # type: ignore[union-attr]


async def test_a_run_whose_agent_used_a_task_group_that_failed_goes_on() -> None:
    clutch = Clutch("grouped", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))

    async def fails() -> None:
        raise ValueError("a child failed")

    @clutch.agent()
    async def fans_out(data: dict[str, Any]) -> dict[str, Any]:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(fails())
                await asyncio.sleep(1)
        except* ValueError:
            pass
        return {"fanned": True}

    @clutch.agent()
    async def after(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "after": True}

    assert await clutch.run({}, run_id="r1", timeout=WAIT_S) == {"fanned": True, "after": True}


async def test_a_run_whose_cancellation_an_agent_lost_stops_before_its_next_step() -> None:
    store = MemoryCheckpointStorage()
    policy = CheckpointPolicy(every_n_steps=1)
    clutch = Clutch("lost", checkpoint=CheckpointConfig(storage=store, policy=policy))
    started = asyncio.Event()
    later: list[Any] = []

    @clutch.agent()
    async def loses(data: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await lose_one_cancellation(asyncio.Event())
        return {"first": True}

    @clutch.agent()
    async def after(data: dict[str, Any]) -> dict[str, Any]:
        later.append(data)
        return data

    task = await clutch.submit({}, run_id="r1")
    await asyncio.wait_for(started.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task.result(timeout=WAIT_S)
    assert later == []
    run = await store.get_run("r1")
    assert run is not None and run.status == CANCELLED and run.step_seq == 1


class LosesOneCancellationInGetRun(MemoryCheckpointStorage):
    """Its first ``get_run`` after ``arm`` waits until cancelled, then loses the
    cancellation and answers as if nothing happened."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.reading = asyncio.Event()

    async def get_run(self, run_id: str) -> Any:
        if self.armed:
            self.armed = False
            self.reading.set()
            await lose_one_cancellation(asyncio.Event())
        return await super().get_run(run_id)


async def test_a_callers_wait_stops_when_anyones_cancellation_of_it_was_lost() -> None:
    # asyncio.run cancels every task at its end with task.cancel() (not nestegg's cancel)
    # and waits for them: a wait that ran on would hang the process's exit.
    from nestegg.checkpoint.records import RunRecord
    from nestegg.transport.caller import wait_result

    store = LosesOneCancellationInGetRun()
    await store.create_run(
        RunRecord(
            run_id="r1", pipeline="p", status="running", input=b"{}", created_at=0.0, updated_at=0.0
        )
    )
    task = asyncio.ensure_future(wait_result(store, "r1", None))
    await asyncio.sleep(0.05)
    store.armed = True
    await asyncio.wait_for(store.reading.wait(), WAIT_S)
    task.cancel()  # lost by the store's read
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)


async def test_a_watch_counts_only_the_cancellations_made_after_it_began() -> None:
    async def watches_after_a_handled_task_group_failure() -> bool:
        await a_task_group_whose_child_failed()
        return CancelWatch().requested()  # what the TaskGroup left counted is not a stop

    assert await asyncio.wait_for(watches_after_a_handled_task_group_failure(), WAIT_S) is False
