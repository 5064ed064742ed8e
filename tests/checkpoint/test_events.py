"""The event log of a run and the on_checkpoint hook."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

import nestegg
from nestegg import Clutch
from nestegg.checkpoint import CheckpointInfo, Event
from nestegg.checkpoint.formats import parse_failure
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import FAILED
from nestegg.errors import ConfigurationError, RunNotFoundError

from .conftest import Flaky, Pipeline, config, wait_for


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


def assert_well_ordered(events: list[Event], run_id: str) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(e.run_id == run_id for e in events)
    assert all(a.at <= b.at for a, b in itertools.pairwise(events))


async def test_events_of_a_simple_run(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b"), keep_latest=None)
    await pipeline.clutch.run(["in"], run_id="simple")
    events = await pipeline.clutch.events("simple")

    assert kinds(events) == [
        "run_started",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "run_completed",
    ]
    assert_well_ordered(events, "simple")
    assert events[1].data == {"seq": 1, "agent": "a"}
    assert events[2].data["seq"] == 1 and events[2].data["agent"] == "a"
    assert events[2].data["outcome"] == "completed"
    assert events[2].data["duration"] >= 0
    checkpoints = await pipeline.clutch.list_checkpoints("simple")
    saved = [e.data for e in events if e.kind == "checkpoint_saved"]
    assert saved == [
        {"checkpoint_id": c.checkpoint_id, "seq": c.seq, "reason": c.reason} for c in checkpoints
    ]
    assert events[-1].data == {"steps": 2}


async def test_events_of_a_failed_run(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c"))
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="failed")
    events = await pipeline.clutch.events("failed")

    assert kinds(events) == [
        "run_started",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "step_started",
        "step_failed",
        "run_failed",
    ]
    assert_well_ordered(events, "failed")
    assert events[4].data == {"seq": 2, "agent": "b"}
    failure = events[5].data
    assert failure["seq"] == 2 and failure["agent"] == "b"
    assert failure["type"] == "Flaky" and failure["message"] == "b failed on purpose"


async def test_events_of_a_failed_run_with_a_final_checkpoint(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c"), every_n_steps=10)
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="failed-final")
    events = await pipeline.clutch.events("failed-final")
    assert kinds(events) == [
        "run_started",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "step_started",
        "step_failed",
        "checkpoint_saved",
        "run_failed",
    ]
    assert events[7].data["seq"] == 2 and events[7].data["reason"] == "final"


async def test_events_of_a_resumed_run(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c"))
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="resumed")
    before = await pipeline.clutch.events("resumed")
    [checkpoint] = await pipeline.clutch.list_checkpoints("resumed")
    pipeline.fail.clear()
    await pipeline.clutch.resume_latest("resumed")
    events = await pipeline.clutch.events("resumed")

    assert events[: len(before)] == before
    assert kinds(events[len(before) :]) == [
        "run_resumed",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "run_completed",
    ]
    assert_well_ordered(events, "resumed")
    resumed = events[len(before)].data
    assert resumed == {"checkpoint_id": checkpoint.checkpoint_id, "seq": 1, "previous": "failed"}
    assert events[len(before) + 1].data == {"seq": 2, "agent": "b"}
    assert events[-1].data == {"steps": 3}


async def test_events_of_a_cancelled_run(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c"))
    pipeline.gate("b")
    task = await pipeline.clutch.submit([], run_id="cancelled")
    await wait_for(pipeline.entered["b"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.done

    events = await pipeline.clutch.events("cancelled")
    assert kinds(events) == [
        "run_started",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "step_started",  # b's, cancelled before its start was written on its own
        "run_cancelled",
    ]
    assert_well_ordered(events, "cancelled")
    [info] = await pipeline.clutch.list_runs()
    assert info.status == "cancelled" and info.steps == 1

    pipeline.gates.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("cancelled") == ["a", "b", "c"]
    assert pipeline.calls == ["b", "c"]
    after = await pipeline.clutch.events("cancelled")
    assert after[len(events)].kind == "run_resumed"
    assert after[len(events)].data["previous"] == "cancelled"


async def test_events_of_pruned_checkpoints(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c"), keep_latest=1)
    await pipeline.clutch.run([], run_id="pruning")
    events = await pipeline.clutch.events("pruning")
    assert kinds(events) == [
        "run_started",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "checkpoint_pruned",
        "step_started",
        "step_completed",
        "checkpoint_saved",
        "checkpoint_pruned",
        "run_completed",
    ]
    saved = [e.data["checkpoint_id"] for e in events if e.kind == "checkpoint_saved"]
    pruned = [e.data["checkpoint_ids"] for e in events if e.kind == "checkpoint_pruned"]
    assert pruned == [[saved[0]], [saved[1]]]
    assert [c.checkpoint_id for c in await pipeline.clutch.list_checkpoints("pruning")] == [
        saved[2]
    ]


async def test_events_since_seq_returns_the_later_ones(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="since")
    events = await pipeline.clutch.events("since")
    for since in range(len(events) + 2):
        assert await pipeline.clutch.events("since", since) == events[since:]
    assert await pipeline.clutch.events("since", since_seq=len(events)) == []
    with pytest.raises(RunNotFoundError, match=r"^no run 'no-such-run' in the store$"):
        await pipeline.clutch.events("no-such-run")


@pytest.mark.parametrize("since", ["2", -1, True, 1.5, None])
async def test_events_refuse_a_since_seq_that_is_no_count(
    checkpoint_store: CheckpointStorage, since: object
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="since-bad")
    events = await pipeline.clutch.events("since-bad")
    with pytest.raises(ConfigurationError, match=r"^events\(\) takes since_seq= an int >= 0, got "):
        await pipeline.clutch.events("since-bad", since)  # type: ignore[arg-type]
    assert await pipeline.clutch.events("since-bad") == events


async def test_events_keep_their_order_across_runs_of_one_store(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await asyncio.gather(*(pipeline.clutch.run([str(i)], run_id=f"r{i}") for i in range(4)))
    for index in range(4):
        events = await pipeline.clutch.events(f"r{index}")
        assert_well_ordered(events, f"r{index}")
        assert kinds(events).count("step_completed") == 3


# ------------------------------------------------------------------ on_checkpoint


async def test_on_checkpoint_receives_every_stored_checkpoint(
    checkpoint_store: CheckpointStorage,
) -> None:
    received: list[CheckpointInfo] = []

    async def on_checkpoint(info: CheckpointInfo) -> None:
        received.append(info)

    pipeline = Pipeline(
        checkpoint_store,
        ("a", "b", "c", "d", "e"),
        every_n_steps=2,
        keep_latest=None,
        on_checkpoint=on_checkpoint,
    )
    pipeline.fail.add("e")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="hooked")
    pipeline.fail.clear()
    await pipeline.clutch.resume_latest("hooked")

    assert all(isinstance(info, CheckpointInfo) for info in received)
    assert [(i.seq, i.reason) for i in received] == [
        (2, "policy"),
        (4, "policy"),
        (5, "final"),
    ]
    assert received == await pipeline.clutch.list_checkpoints("hooked")


async def test_on_checkpoint_sees_manual_checkpoints(checkpoint_store: CheckpointStorage) -> None:
    received: list[CheckpointInfo] = []
    taken: list[str] = []

    async def on_checkpoint(info: CheckpointInfo) -> None:
        received.append(info)

    clutch = Clutch(
        "hooks",
        checkpoint=config(checkpoint_store, every_n_steps=100),
        on_checkpoint=on_checkpoint,
    )

    @clutch.agent()
    async def only(data: str) -> str:
        taken.append(await clutch.checkpoint())
        return data

    await clutch.run("x", run_id="manual-hook")
    assert [(i.checkpoint_id, i.reason) for i in received][:1] == [(taken[0], "agent")]
    assert [i.reason for i in received] == ["agent", "final"]


async def stored_failure(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    """The stored error of the failed run ``run_id``."""
    run = await store.get_run(run_id)
    assert run is not None and run.status == FAILED and run.error is not None
    return parse_failure(run.error, "error")


@pytest.mark.parametrize("durability", ["sync", "async"])
@pytest.mark.parametrize("at", [2, 4])
async def test_an_on_checkpoint_that_raises_fails_the_run_with_its_error(
    checkpoint_store: CheckpointStorage, durability: str, at: int
) -> None:
    async def on_checkpoint(info: CheckpointInfo) -> None:
        if info.seq == at:
            raise Flaky(f"hook broke at {info.seq}")

    names = ("a", "b", "c", "d")
    pipeline = Pipeline(checkpoint_store, names, durability=durability, on_checkpoint=on_checkpoint)
    with pytest.raises(Flaky, match=f"hook broke at {at}"):
        await pipeline.clutch.run([], run_id="hooked")
    failure = await stored_failure(checkpoint_store, "hooked")
    assert (failure["type"], failure["message"]) == ("Flaky", f"hook broke at {at}")
    assert kinds(await pipeline.clutch.events("hooked"))[-1] == "run_failed"
    assert await pipeline.clutch.recover() == {}


async def test_an_on_checkpoint_that_raises_for_a_checkpoint_asked_from_outside_fails_the_run(
    checkpoint_store: CheckpointStorage,
) -> None:
    async def on_checkpoint(info: CheckpointInfo) -> None:
        if info.reason == "manual":
            raise Flaky("hook broke")

    pipeline = Pipeline(
        checkpoint_store, ("a", "b"), every_n_steps=100, on_checkpoint=on_checkpoint
    )
    release = pipeline.gate("a")
    task = await pipeline.clutch.submit([], run_id="asked")
    await wait_for(pipeline.entered["a"])
    request = asyncio.ensure_future(pipeline.clutch.checkpoint())
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(Flaky, match="hook broke"):
        await asyncio.wait_for(request, 5)
    with pytest.raises(Flaky, match="hook broke"):
        await task.result(timeout=5)
    failure = await stored_failure(checkpoint_store, "asked")
    assert (failure["agent"], failure["hook"]) == (None, "on_checkpoint")
    assert kinds(await pipeline.clutch.events("asked"))[-1] == "run_failed"
    assert pipeline.calls == ["a"] and await pipeline.clutch.recover() == {}


def test_on_checkpoint_must_be_async(checkpoint_store: CheckpointStorage) -> None:
    def not_async(info: CheckpointInfo) -> None:
        return None

    with pytest.raises(ConfigurationError, match="on_checkpoint"):
        Clutch("p", checkpoint=config(checkpoint_store), on_checkpoint=not_async)  # type: ignore[arg-type]


# ------------------------------------------------- a fresh run's opening, not written alone


def commits_written(store: CheckpointStorage) -> list[list[str]]:
    """The event kinds of every commit written through ``store`` from now on, once written,
    and ``"journal"`` for a commit that writes a journal entry."""
    written: list[list[str]] = []
    commit = store.commit

    async def recording(change: Any) -> None:
        await commit(change)
        written.append([e.kind for e in change.events] + ["journal"] * bool(change.journal))

    store.commit = recording  # type: ignore[method-assign]
    return written


async def test_a_fresh_runs_opening_goes_with_its_first_steps_commit(
    checkpoint_store: CheckpointStorage,
) -> None:
    written = commits_written(checkpoint_store)
    pipeline = Pipeline(checkpoint_store, ("a", "b"), keep_latest=None)
    await pipeline.clutch.run(["in"], run_id="opened")

    assert written[0][:3] == ["run_started", "step_started", "step_completed"]
    assert len(written) == 3  # one commit per step, then the run's end
    assert_well_ordered(await pipeline.clutch.events("opened"), "opened")


async def test_a_long_first_step_shows_the_run_and_the_step_started_in_one_commit(
    checkpoint_store: CheckpointStorage,
) -> None:
    written = commits_written(checkpoint_store)
    pipeline = Pipeline(checkpoint_store, ("a",))
    gate = pipeline.gate("a")
    run = asyncio.create_task(pipeline.clutch.run([], run_id="long"))
    await wait_for(pipeline.entered["a"])
    for _ in range(100):  # published LIVE_STEP_DELAY (50 ms) after the step started
        if written:
            break
        await asyncio.sleep(0.01)
    assert written == [["run_started", "step_started"]]
    assert kinds(await pipeline.clutch.events("long")) == ["run_started", "step_started"]
    gate.set()
    await run
    assert_well_ordered(await pipeline.clutch.events("long"), "long")


async def test_a_first_journaled_call_writes_the_runs_opening_with_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    written = commits_written(checkpoint_store)
    clutch = Clutch("journaled", checkpoint=config(checkpoint_store))

    async def look_up(topic: str) -> str:
        return topic.upper()

    @clutch.agent()
    async def research(data: str) -> str:
        return await nestegg.call(look_up, data)

    assert await clutch.run("x", run_id="calls") == "X"
    assert written[0] == ["run_started", "step_started", "journal"]
    assert_well_ordered(await clutch.events("calls"), "calls")


async def test_a_resumed_run_writes_its_opening_before_its_steps_run_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b"))
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="again")
    pipeline.fail.clear()
    gate = pipeline.gate("b")
    written = commits_written(checkpoint_store)
    resumed = asyncio.create_task(pipeline.clutch.resume_latest("again"))
    await wait_for(pipeline.entered["b"])
    assert written[0][0] == "run_resumed"  # the truncation is written before b runs again
    gate.set()
    await resumed


async def test_a_journaled_call_whose_commit_lands_as_the_run_is_cancelled_writes_each_event_once(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch = Clutch("landed", checkpoint=config(checkpoint_store))
    commit = checkpoint_store.commit
    landed = asyncio.Event()

    async def reply_late(change: Any) -> None:  # written, its reply not read yet
        await commit(change)
        if change.journal:
            landed.set()
            await asyncio.sleep(0.5)

    checkpoint_store.commit = reply_late  # type: ignore[method-assign]

    async def look_up(topic: str) -> str:
        return topic.upper()

    @clutch.agent()
    async def research(data: str) -> str:
        return await nestegg.call(look_up, data)

    task = await clutch.submit("x", run_id="landed")
    await wait_for(landed)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r.status for r in await clutch.list_runs()] == ["cancelled"]
    events = await clutch.events("landed")
    assert kinds(events)[:2] == ["run_started", "step_started"]
    assert_well_ordered(events, "landed")
