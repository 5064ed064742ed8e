"""clutch.cancel(run_id): a stored run cancelled from outside the process that runs it,
on every store: each status it may find, a live owner that loses the run, a waiting run
whose timer then resumes nothing, and a cancelled run resumed on purpose."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from typing import Any

import pytest

import nestegg
from nestegg import Clutch
from nestegg.checkpoint.codec import encode_value, seal
from nestegg.checkpoint.formats import parse_event
from nestegg.checkpoint.ownership import host_id
from nestegg.checkpoint.records import Owner, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import (
    CANCELLED,
    COMPLETED,
    FAILED,
    RUN_CANCELLED,
    RUN_STARTED,
    RUNNING,
    WAITING,
)
from nestegg.errors import (
    ConfigurationError,
    InvalidIdentifierError,
    RunFinishedError,
    RunNotFoundError,
    RunWaiting,
    StaleOwnerError,
)
from nestegg.testing import fixtures

from .conftest import Flaky, Pipeline, config, stored_view, wait_for

store_name = fixtures.store_name
store_factory = fixtures.store_factory
store = fixtures.store


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    fixtures.parametrize_stores(metafunc)


FOREIGN = Owner(host="elsewhere#00000000", pid=4242, started="1")


async def cancel_event(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    """The payload of the run's last event, which must be ``run_cancelled``."""
    events = await store.read_events(run_id)
    assert events[-1].kind == RUN_CANCELLED
    return parse_event(events[-1].body, "run_cancelled")


def me() -> dict[str, Any]:
    """This process as a ``run_cancelled`` event names its canceller (start token aside)."""
    return {"host": host_id(), "pid": os.getpid()}


async def test_completed_and_failed_runs_are_refused_with_their_status(
    store: CheckpointStorage,
) -> None:
    pipe = Pipeline(store, ("a",))
    await pipe.clutch.run([], run_id="done")
    pipe.fail.add("a")
    with pytest.raises(Flaky):
        await pipe.clutch.run([], run_id="broken")
    for run_id, status in (("done", COMPLETED), ("broken", FAILED)):
        before = await stored_view(store, run_id)
        with pytest.raises(RunFinishedError) as refused:
            await pipe.clutch.cancel(run_id)
        assert str(refused.value) == (
            f"run {run_id!r} is {status}: only a running or waiting run can be cancelled; "
            "nothing was changed"
        )
        assert await stored_view(store, run_id) == before


async def test_an_unknown_or_bad_id_or_another_pipelines_run_changes_nothing(
    store: CheckpointStorage,
) -> None:
    pipe = Pipeline(store, ("a",))
    with pytest.raises(RunNotFoundError, match="no run 'ghost' in the store"):
        await pipe.clutch.cancel("ghost")
    with pytest.raises(InvalidIdentifierError):
        await pipe.clutch.cancel("../x")
    await store.create_run(_running("theirs", owner=None, pipeline="other"))
    before = await stored_view(store, "theirs")
    with pytest.raises(ConfigurationError, match="belongs to pipeline 'other', not 'pipeline'"):
        await pipe.clutch.cancel("theirs")
    assert await stored_view(store, "theirs") == before


def _running(run_id: str, owner: Owner | None, pipeline: str = "pipeline") -> RunRecord:
    """A running run of input ``[]``: interrupted (``owner`` gone, its lease over) or
    queued for workers (no owner)."""
    now = time.time()
    return RunRecord(
        run_id=run_id,
        pipeline=pipeline,
        status=RUNNING,
        input=seal(encode_value([], "input")),
        created_at=now,
        updated_at=now,
        fence=1,
        owner=owner,
        lease_until=now - 1 if owner else None,
    )


async def test_an_interrupted_run_is_cancelled_and_no_recover_takes_it_up_again(
    store: CheckpointStorage,
) -> None:
    pipe = Pipeline(store, ("a", "b"))
    await store.create_run(_running("lost", FOREIGN))
    assert [r.run_id for r in await pipe.clutch.list_resumable()] == ["lost"]
    assert await pipe.clutch.cancel("lost") is True
    run = await store.get_run("lost")
    assert run is not None and run.status == CANCELLED and run.fence == 2
    event = await cancel_event(store, "lost")
    assert event["outside"] is True and event["previous"] == "interrupted"
    assert {k: event["by"][k] for k in ("host", "pid")} == me()
    assert event["previous_owner"] == {"host": FOREIGN.host, "pid": 4242, "started": "1"}
    assert event["steps"] == 0
    assert await pipe.clutch.list_resumable() == []
    assert await pipe.clutch.recover() == {}
    assert pipe.calls == []
    # already cancelled: nothing to do, nothing written
    before = await stored_view(store, "lost")
    assert await pipe.clutch.cancel("lost") is False
    assert await stored_view(store, "lost") == before
    # resumed on purpose, as any cancelled run
    assert await pipe.clutch.resume_latest("lost") == ["a", "b"]


async def test_a_queued_run_gets_its_opening_event_and_is_cancelled(
    store: CheckpointStorage,
) -> None:
    pipe = Pipeline(store, ("a",))
    await store.create_run(_running("queued", owner=None))
    assert await pipe.clutch.cancel("queued") is True
    events = await store.read_events("queued")
    assert [e.kind for e in events] == [RUN_STARTED, RUN_CANCELLED]
    assert (await cancel_event(store, "queued"))["previous"] == "queued"
    run = await store.get_run("queued")
    assert run is not None and run.status == CANCELLED and run.event_seq == 2


async def test_a_queued_run_cancelled_does_not_await_on_request_again_when_resumed(
    store: CheckpointStorage,
) -> None:
    """A caller on workers stores its run once the hook passed; an interrupted run with no
    step recorded may not have passed it (awaited again)."""
    requests: list[object] = []

    async def hook(request: dict[str, object]) -> None:
        requests.append(request["clutch_id"])

    clutch = Clutch("pipeline", checkpoint=config(store), on_request=hook)

    @clutch.agent()
    async def a(data: list[str]) -> list[str]:
        return [*data, "a"]

    await store.create_run(_running("queued", owner=None))
    await store.create_run(_running("lost", FOREIGN))
    for run_id in ("queued", "lost"):
        assert await clutch.cancel(run_id) is True
        assert await clutch.resume_latest(run_id) == ["a"]
    assert requests == ["lost"]


async def test_a_waiting_run_is_cancelled_and_its_timer_resumes_nothing(
    store: CheckpointStorage,
) -> None:
    now = [time.time()]
    clutch = Clutch("sleeper", checkpoint=config(store, clock=lambda: now[0]))
    woke: list[int] = []

    @clutch.agent()
    async def nap(data: int) -> int:
        await nestegg.sleep(60)
        woke.append(data)
        return data + 1

    with pytest.raises(RunWaiting):
        await clutch.run(1, run_id="nap")
    run = await store.get_run("nap")
    assert run is not None and run.status == WAITING
    assert await clutch.cancel("nap") is True
    assert (await cancel_event(store, "nap"))["previous"] == "waiting"
    now[0] += 120  # the timer is due: nothing takes the run up
    assert await clutch.list_interrupted() == []
    assert await clutch.list_resumable() == []
    assert await clutch.recover() == {}
    run = await store.get_run("nap")
    assert run is not None and run.status == CANCELLED and woke == []
    assert await clutch.resume_latest("nap") == 2


async def test_a_live_owner_loses_the_run_at_its_next_commit_and_says_it_was_cancelled(
    store: CheckpointStorage, store_factory: fixtures.StoreFactory
) -> None:
    pipe = Pipeline(store, ("a", "b"))
    gate = pipe.gate("a")
    task = asyncio.ensure_future(pipe.clutch.run([], run_id="live"))
    await wait_for(pipe.entered["a"])
    other = Pipeline(await store_factory(), ("a", "b"))  # another handle: the canceller
    assert await other.clutch.cancel("live") is True
    assert (await cancel_event(store, "live"))["previous"] == "running"
    gate.set()  # the step under way ends; its commit fails
    with pytest.raises(StaleOwnerError) as lost:
        await task
    assert str(lost.value) == (
        f"run 'live' was cancelled from outside (by pid {os.getpid()} on {host_id()}); "
        "this process stopped it, the step under way not recorded: "
        "resume_latest('live') continues it"
    )
    run = await store.get_run("live")
    assert run is not None and run.status == CANCELLED and run.step_seq == 0
    assert pipe.calls == ["a"]
    assert (await store.read_events("live"))[-1].kind == RUN_CANCELLED


async def test_a_live_owner_with_durability_exit_stops_at_its_next_step_boundary(
    store: CheckpointStorage, store_factory: fixtures.StoreFactory
) -> None:
    # It commits nothing until the run ends: its lease renewal (a third of the lease)
    # finds the run taken, and the step under way is the last that runs.
    lease = timedelta(seconds=0.3)
    pipe = Pipeline(store, ("a", "b", "c", "d"), lease=lease, durability="exit")
    gate = pipe.gate("a")
    task = asyncio.ensure_future(pipe.clutch.run([], run_id="quiet"))
    await wait_for(pipe.entered["a"])
    other = Pipeline(await store_factory(), ("a", "b", "c", "d"))
    assert await other.clutch.cancel("quiet") is True
    await asyncio.sleep(lease.total_seconds())  # a renewal or more is due meanwhile
    gate.set()
    with pytest.raises(StaleOwnerError, match=r"^run 'quiet' was cancelled from outside"):
        await task
    assert pipe.calls == ["a"]
    run = await store.get_run("quiet")
    assert run is not None and run.status == CANCELLED and run.step_seq == 0
    assert (await store.read_events("quiet"))[-1].kind == RUN_CANCELLED


async def test_a_claim_made_at_the_same_moment_loses_or_is_taken_again(
    store: CheckpointStorage,
) -> None:
    pipe = Pipeline(store, ("a",))
    await store.create_run(_running("raced", FOREIGN))
    claim = store.claim_run
    raced: list[int] = []

    async def racing(run_id: str, expected_fence: int, *args: Any, **kwargs: Any) -> RunRecord:
        if not raced:  # another process claims it between the read and this claim
            now = time.time()
            taken = await claim(run_id, expected_fence, FOREIGN, now + 30, now)
            raced.append(taken.fence)
        return await claim(run_id, expected_fence, *args, **kwargs)

    store.claim_run = racing  # type: ignore[method-assign]
    assert await pipe.clutch.cancel("raced") is True
    run = await store.get_run("raced")
    assert raced == [2] and run is not None and run.status == CANCELLED and run.fence == 3
    assert (await cancel_event(store, "raced"))["previous_owner"]["pid"] == 4242
