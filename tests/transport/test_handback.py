"""A failed run of a pipeline served by workers, resumed by a Clutch with a transport
(``resume_latest``, ``nestegg resume --app``): handed back to the workers, which complete
it without running its completed steps or their journaled calls again. On a real broker
(Redis Streams, then RabbitMQ), the Redis store and worker processes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.errors import IncompatibleDataError, RunFailedError
from tests.transport.apps import make_flaky, make_outage, make_typed, make_typed_strict
from tests.transport.conftest import Deployment
from tests.transport.test_workers import _effects_sync, event_log

pytestmark = [pytest.mark.crash, pytest.mark.server]


def _flagged(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The flag file whose presence makes the test apps' agents and calls fail
    (``NESTEGG_TEST_FLAG``), made; the test removes it once the run may go on."""
    flag = tmp_path / "flag"
    flag.touch()
    monkeypatch.setenv("NESTEGG_TEST_FLAG", str(flag))
    return flag


async def _failed_on_a_worker(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run_id: str
) -> tuple[Path, int]:
    """A run of ``flaky`` failed at its step 2 on a worker (the flag file exists), that
    flag file (removed by the test: the run can go on) and the worker's pid."""
    flag = _flagged(monkeypatch, tmp_path)
    worker = deployment.start_worker("flaky")
    flaky = make_flaky()
    try:
        task = await flaky.submit({"q": 1}, run_id=run_id)
        with pytest.raises(RunFailedError) as failed:
            await task.result(timeout=30)
    finally:
        await flaky.stop()
    assert (failed.value.agent, failed.value.error_type) == ("judge", "RuntimeError")
    return flag, worker.process.pid


async def _check_completed_once(
    deployment: Deployment, store: RedisCheckpointStorage, run_id: str, result: dict[str, int]
) -> None:
    assert set(result) == {"q", "fetch", "judge", "report"}
    # step 1 ran once; the failed step's journaled call was replayed, not made again
    effects = _effects_sync(deployment)
    assert {key: n for key, n in effects.items() if key.startswith(f"{run_id}:")} == {
        f"{run_id}:1": 1,
        f"{run_id}:2": 1,
        f"{run_id}:3": 1,
    }
    log = [
        (kind, body) for kind, body in await event_log(store, run_id) if kind != "checkpoint_saved"
    ]
    kinds = [kind for kind, _ in log]
    failed_at = kinds.index("run_failed")
    assert kinds[failed_at + 1 :] == [
        "run_resumed",
        "step_started",
        "step_completed",
        "step_started",
        "step_completed",
        "run_completed",
    ], kinds
    resumed = log[failed_at + 1][1]
    assert (resumed["previous"], resumed["seq"]) == ("failed", 1)
    assert kinds.count("run_resumed") == 1 and kinds.count("step_completed") == 3


async def test_resume_latest_hands_a_failed_run_back_to_the_workers(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    flag, worker_pid = await _failed_on_a_worker(deployment, monkeypatch, tmp_path, "again")
    flag.unlink()
    flaky = make_flaky()
    try:
        result = await asyncio.wait_for(flaky.resume_latest("again"), 30)
    finally:
        await flaky.stop()
    assert result["judge"] == result["report"] == worker_pid  # run by the worker, not here
    await _check_completed_once(deployment, store, "again", result)


async def test_a_failed_run_handed_back_makes_its_failed_call_again_on_a_worker(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # a worker replayed the journaled failure: the run failed again at once, never called
    flag = _flagged(monkeypatch, tmp_path)
    worker = deployment.start_worker("outage")
    outage = make_outage()
    try:
        with pytest.raises(RunFailedError, match="model_call failed"):
            await outage.run({}, run_id="down", timeout=30)
        flag.unlink()  # the API is back
        result = await asyncio.wait_for(outage.resume_latest("down"), 30)
    finally:
        await outage.stop()
    assert result == {"answer": "answer", "by": worker.process.pid}
    effects = _effects_sync(deployment)
    # the failed call made again, the paid one before it replayed
    assert {key: n for key, n in effects.items() if key.startswith("down:")} == {
        "down:1": 1,
        "down:model": 2,
    }


async def test_nestegg_resume_with_the_app_hands_a_failed_run_back_to_the_workers(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    flag, worker_pid = await _failed_on_a_worker(deployment, monkeypatch, tmp_path, "cli")
    flag.unlink()
    done = await deployment.nestegg(
        "resume", "cli", "--app", "tests.transport.apps:flaky", "--json"
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == (  # what the command waits for (and would wait for, silent, with no
        # worker running)
        "run cli was handed back to the workers of pipeline 'flaky': waiting for its result "
        "(a worker runs it: nestegg worker with this --app; --here runs it in this process "
        "instead)\n"
    )
    summary = json.loads(done.stdout)
    assert (summary["status"], summary["previous_status"], summary["steps"]) == (
        "completed",
        "failed",
        3,
    )
    assert summary["result"]["report"] == worker_pid
    await _check_completed_once(deployment, store, "cli", summary["result"])


async def test_a_failed_run_whose_data_no_longer_fits_is_refused_before_it_is_handed_back(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    flag = tmp_path / "flag"
    flag.touch()
    monkeypatch.setenv("NESTEGG_TEST_FLAG", str(flag))
    deployment.start_worker("typed")
    typed = make_typed()
    try:
        task = await typed.submit({"title": "t"}, run_id="misfit")
        with pytest.raises(RunFailedError):
            await task.result(timeout=30)
    finally:
        await typed.stop()
    flag.unlink()
    before = await store.get_run("misfit")
    assert before is not None and (before.status, before.step_seq) == ("failed", 1)
    strict = make_typed_strict()  # a version whose agent 'second' requires 'pages'
    try:
        with pytest.raises(IncompatibleDataError) as refused:
            await asyncio.wait_for(strict.resume_latest("misfit"), 30)
    finally:
        await strict.stop()
    assert (refused.value.agent, refused.value.model) == ("second", "StrictPage")
    after = await store.get_run("misfit")
    assert after == before  # nothing claimed, written or published
    await asyncio.sleep(1.0)  # no worker got a message for it either
    assert await store.get_run("misfit") == before
