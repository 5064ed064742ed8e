"""A run that waits in distributed mode: the worker stores it as waiting and acks its
message, the caller gets RunWaiting, and signal() hands it back to the workers (see
test_handback_waits.py)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import nestegg
from nestegg import Clutch, RunWaiting, get_context
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.testing.builders import OTHER_OWNER, T0, commit_steps, create, make_commit
from nestegg.transport.worker import Worker
from tests.cli.conftest import damage_newest_event_batch, stored_as_is, tear
from tests.transport.apps import config, counter, prefix, side_effect, transport
from tests.transport.conftest import Deployment
from tests.transport.test_caller import serving
from tests.transport.test_workers import event_log
from tests.ui.pipelines import SIGNAL, start_waiting


def make_approvals(*, local: bool = False) -> Clutch:
    """Pipeline ``approvals`` on the workers, or run in this process (``local``)."""
    clutch = Clutch("approvals", transport=None if local else transport(), checkpoint=config())

    @clutch.agent()
    async def review(data: dict[str, Any]) -> dict[str, Any]:
        paid = await side_effect(get_context().run_id, 1)
        approval = await nestegg.wait_for("approval")
        return {**data, "paid": paid, "approval": approval}

    return clutch


def make_napper() -> Clutch:
    clutch = Clutch("napper", transport=transport(), checkpoint=config())

    @clutch.agent()
    async def nap(data: dict[str, Any]) -> dict[str, Any]:
        await nestegg.sleep(timedelta(hours=6))
        return data

    return clutch


@pytest.mark.server
async def test_a_run_waiting_on_its_timer_on_workers_is_said_to_be_resumed_by_a_sweep(
    deployment: Deployment,
) -> None:
    caller, worker = make_napper(), make_napper()
    try:
        async with serving(worker):
            with pytest.raises(RunWaiting) as waiting:
                await caller.run({}, run_id="napping", timeout=30)
        with pytest.raises(RunWaiting) as asked:
            await caller.result("napping")
    finally:
        await caller.stop()
        await worker.stop()
    assert waiting.value.deadline is not None
    due = datetime.fromtimestamp(waiting.value.deadline, UTC).isoformat(timespec="seconds")
    told = f"run 'napping' waits for its timer until {due}: a worker's sweep resumes it when due"
    assert str(waiting.value) == str(asked.value) == told


@pytest.mark.server
async def test_a_waiting_run_is_resumed_by_its_signal(deployment: Deployment) -> None:
    caller, worker = make_approvals(), make_approvals()
    try:
        async with serving(worker):
            with pytest.raises(RunWaiting) as waiting:
                await caller.run({}, run_id="approve-me", timeout=30)
            assert waiting.value.signal == "approval"
            result = await caller.signal("approve-me", "approval", "yes", timeout=30)
    finally:
        await caller.stop()
        await worker.stop()
    assert result == {"paid": 1, "approval": "yes"}
    effects = await counter().hget(f"{prefix()}effects", "approve-me:1")
    assert int(effects) == 1


@pytest.mark.server
async def test_the_sweeper_resumes_a_waiting_run_once_its_signal_is_stored(
    deployment: Deployment,
) -> None:
    caller, worker = make_approvals(), make_approvals()
    try:
        async with serving(worker, sweep_interval=0.2):
            with pytest.raises(RunWaiting):
                await caller.run({}, run_id="swept", timeout=30)
            await asyncio.sleep(0.5)  # sweeps pass it by: it waits
            assert (await caller.list_runs("waiting"))[0].run_id == "swept"
            assert await caller.signal("swept", "approval", "ok", resume=False) is None
            for _ in range(200):  # the next sweep points a worker at it
                if not await caller.list_runs("waiting"):
                    break
                await asyncio.sleep(0.1)
            result = await caller.result("swept", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()
    assert result == {"paid": 1, "approval": "ok"}
    assert int(await counter().hget(f"{prefix()}effects", "swept:1")) == 1


@pytest.mark.server
async def test_a_sweep_resuming_a_waiting_run_writes_run_resumed_as_a_local_resume(
    deployment: Deployment, store: RedisCheckpointStorage
) -> None:
    caller, worker, local = make_approvals(), make_approvals(), make_approvals(local=True)
    try:
        async with serving(worker, sweep_interval=0.2):
            with pytest.raises(RunWaiting):
                await caller.run({}, run_id="swept", timeout=30)
            await caller.signal("swept", "approval", "ok", resume=False)
            await caller.result("swept", timeout=20)
        with pytest.raises(RunWaiting):
            await local.run({}, run_id="local")
        await local.signal("local", "approval", "ok")
    finally:
        await caller.stop()
        await worker.stop()
    swept, local = [await event_log(store, run_id) for run_id in ("swept", "local")]
    assert [kind for kind, _ in swept] == [kind for kind, _ in local]
    kinds = [kind for kind, _ in swept]
    resumed = kinds.index("run_resumed")
    assert kinds[resumed - 1 : resumed + 1] == ["run_waiting", "run_resumed"]
    assert swept[resumed][1]["previous"] == local[resumed][1]["previous"] == "waiting"
    assert swept[resumed][1]["seq"] == local[resumed][1]["seq"] == 0


@pytest.mark.server
async def test_result_waits_for_a_run_whose_signal_is_stored_until_a_worker_resumes_it(
    deployment: Deployment,
) -> None:
    caller, worker = make_approvals(), make_approvals()
    try:
        async with serving(worker, sweep_interval=0.2):
            with pytest.raises(RunWaiting):
                await caller.run({}, run_id="stored", timeout=30)
            await caller.signal("stored", "approval", "ok", resume=False)
            # still stored as waiting until a sweep points a worker at it: not a RunWaiting
            # that says to send the signal it has
            result = await caller.result("stored", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()
    assert result == {"paid": 1, "approval": "ok"}


@pytest.mark.server
async def test_a_sweep_refuses_a_waiting_run_whose_event_log_is_torn_and_sweeps_the_others(
    deployment: Deployment, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the sweep failed as a whole at it, every time: the others were never swept
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = open_store(url)
    for run_id in ("torn", "fine"):
        await start_waiting(store, run_id, nap=False)
    damage_newest_event_batch(url, "torn", tear)
    worker = Clutch("waiting", transport=transport(), checkpoint=config(store=store))

    @worker.agent()
    async def approve(data: dict[str, Any]) -> dict[str, Any]:  # its agent, not run here
        return data

    try:
        await worker.signal("fine", SIGNAL, "yes", resume=False)
        await worker.signal("torn", SIGNAL, "yes", resume=False)  # due, if it could be read
        before = stored_as_is(url, "torn")
        sweeper = Worker(worker, worker.transport)
        with caplog.at_level(logging.DEBUG, logger="nestegg"):
            assert await sweeper.sweep() == ["fine"]
            assert await sweeper.sweep() == ["fine"]  # still waiting: no worker consumes
    finally:
        await worker.stop()
        await store.close()
    told = [r for r in caplog.records if "run 'torn' is refused" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.WARNING, logging.DEBUG]  # told once
    assert "the event log of run 'torn' is damaged (a torn batch)" in told[0].getMessage()
    assert stored_as_is(url, "torn") == before


@pytest.mark.server
async def test_a_sweep_points_at_a_running_run_whose_last_event_is_torn_and_at_the_others(
    deployment: Deployment, tmp_path: Path
) -> None:
    # a sweep asks a released run's last event whether a drain gave it back: a torn one
    # failed the sweep as a whole, every time, and the runs after it were never pointed at
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = open_store(url)
    await store.setup()
    for run_id in ("torn", "fine"):
        run = await create(
            store, run_id=run_id, pipeline="waiting", fence=2, owner=OTHER_OWNER,
            lease_until=T0 + 1, updated_at=T0 + 1,
        )  # fmt: skip
        await commit_steps(store, run, range(1, 3))
        await store.commit(make_commit(run, lease_until=T0 + 2000, updated_at=T0 + 2000))
    damage_newest_event_batch(url, "torn", tear)
    worker = Clutch("waiting", transport=transport(), checkpoint=config(store=store))

    @worker.agent()
    async def approve(data: dict[str, Any]) -> dict[str, Any]:  # its agent, not run here
        return data

    try:
        assert sorted(await Worker(worker, worker.transport).sweep()) == ["fine", "torn"]
    finally:
        await worker.stop()
        await store.close()
