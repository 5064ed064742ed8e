"""Hand-backs to the workers beyond a failed run's (see test_handback.py): a cancelled run,
one whose ``on_request`` never passed, an interrupted run, a failed run whose newest
checkpoint is damaged, and the web inspector's resume button. On a real broker (Redis
Streams, then RabbitMQ), the Redis store and worker processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from typing import Any

import pytest
import redis

from nestegg import Clutch
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.checkpoint.stores.redis.layout import checkpoint_value
from nestegg.checkpoint.views import run_result
from nestegg.errors import CheckpointFallbackWarning, RunFailedError, RunFinishedError
from nestegg.ui import UISettings
from tests.transport.apps import make_flaky, make_slow
from tests.transport.conftest import ROOT, Deployment, wait_until
from tests.transport.test_handback import _check_completed_once, _failed_on_a_worker
from tests.transport.test_workers import _effects_sync, _journaled, event_log
from tests.ui.conftest import TOKEN, client_for

pytestmark = [pytest.mark.crash, pytest.mark.server]
TWO_STEPS = [*["step_started", "step_completed"] * 2, "run_completed"]
"""The events of a run's last two steps, after its resume."""


async def _in_step_one(deployment: Deployment, store: RedisCheckpointStorage, run_id: str) -> None:
    await wait_until(lambda: _effects_sync(deployment).get(f"{run_id}:1") == 1, 30, "the call")
    await _journaled(store, run_id)


def _kinds(log: list[tuple[str, Any]]) -> list[str]:
    return [kind for kind, _ in log if kind != "checkpoint_saved"]


async def test_a_cancelled_run_is_handed_back_and_one_not_to_reopen_is_refused_first(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.slow = 30.0  # the first worker is in its first step when the run is cancelled
    deployment.apply(monkeypatch)
    first = deployment.start_worker("slow")
    requests: list[str] = []

    async def on_request(request: dict[str, Any]) -> None:
        requests.append(request["clutch_id"])

    slow = make_slow(on_request=on_request)
    try:
        task = await slow.submit({}, run_id="off")
        await _in_step_one(deployment, store, "off")
        assert await slow.cancel("off")
        with pytest.raises(RunFailedError, match="cancelled"):
            await task.result(timeout=10)
        first.kill()  # else it sleeps on in a step it cannot commit
        before = await store.get_run("off")
        assert before is not None and before.status == "cancelled"
        logged = await event_log(store, "off")
        with pytest.raises(RunFinishedError, match="was cancelled from outside"):
            await asyncio.wait_for(slow.resume_latest("off", reopen_cancelled=False), 30)
        assert await store.get_run("off") == before and await event_log(store, "off") == logged
        deployment.slow = 0.0
        second = deployment.start_worker("slow")
        result = await asyncio.wait_for(slow.resume_latest("off"), 30)
    finally:
        await slow.stop()
    assert result["crawled"] == result["after"] == second.process.pid
    assert requests == ["off"]  # on submit only: the step had started, so the hook passed
    log = [entry for entry in await event_log(store, "off") if entry[0] != "checkpoint_saved"]
    kinds = _kinds(log)
    cancelled = kinds.index("run_cancelled")
    assert kinds[cancelled + 1 :] == ["run_resumed", *TWO_STEPS], kinds
    assert (log[cancelled + 1][1]["previous"], log[cancelled + 1][1]["seq"]) == ("cancelled", 0)
    assert kinds.count("run_resumed") == 1
    assert _effects_sync(deployment) == {"off:1": 1}  # replayed, not made again


async def test_on_request_is_awaited_once_before_a_hand_back_and_its_refusal_changes_nothing(
    deployment: Deployment, store: RedisCheckpointStorage
) -> None:
    worker = deployment.start_worker("flaky")
    seen: list[Any] = []

    async def on_request(request: dict[str, Any]) -> None:
        seen.append(await store.get_run(request["clutch_id"]))  # as it was: nothing written
        if len(seen) < 3:
            raise PermissionError(f"not allowed ({len(seen)})")

    flaky = make_flaky(on_request=on_request)
    try:
        with pytest.raises(PermissionError, match=r"\(1\)"):
            await flaky.run({"q": 1}, run_id="asked", timeout=20)
        before = await store.get_run("asked")
        assert before is not None and (before.status, before.step_seq) == ("failed", 0)
        logged = await event_log(store, "asked")
        with pytest.raises(PermissionError, match=r"\(2\)"):
            await asyncio.wait_for(flaky.resume_latest("asked"), 30)
        await asyncio.sleep(1.0)  # no worker got a message for it either
        assert await store.get_run("asked") == before and await event_log(store, "asked") == logged
        result = await asyncio.wait_for(flaky.resume_latest("asked"), 30)
    finally:
        await flaky.stop()
    assert len(seen) == 3 and seen[1] == seen[2] == before  # once per resume, before writes
    assert result["fetch"] == result["report"] == worker.process.pid
    kinds = _kinds(await event_log(store, "asked"))
    assert kinds.count("run_resumed") == 1 and kinds.count("step_completed") == 3, kinds


async def test_an_interrupted_run_handed_back_is_taken_by_a_worker_at_once(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its owner, a process of this host, died in its first step: no message of it is in
    the broker, and its lease runs still when the hand-back comes (lease 10 s, sweeps
    after 50 s)."""
    deployment.lease, deployment.slow = 10.0, 30.0
    deployment.apply(monkeypatch)
    code = "import asyncio, tests.transport.apps as a; "
    code += "asyncio.run(a.make_slow(here=True).run({}, run_id='cut'))"
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=deployment.env())
    try:
        await _in_step_one(deployment, store, "cut")
    finally:
        owner.kill()
        owner.wait()
    deployment.slow = 0.0
    deployment.apply(monkeypatch)
    worker = deployment.start_worker("slow")
    slow = make_slow()
    try:
        await asyncio.sleep(2.0)  # the worker is up (it takes the run in any case)
        started = time.monotonic()
        result = await asyncio.wait_for(slow.resume_latest("cut"), 30)
        took = time.monotonic() - started
    finally:
        await slow.stop()
    assert result["crawled"] == result["after"] == worker.process.pid
    assert took < 8.0, took  # not after the lease (10 s), nor a sweep's 50 s
    log = await event_log(store, "cut")
    kinds = _kinds(log)
    assert kinds.count("run_interrupted") == kinds.count("run_resumed") == 1, kinds
    taken_over = kinds[kinds.index("run_interrupted") :]
    assert taken_over == ["run_interrupted", "run_resumed", *TWO_STEPS], kinds
    interrupted = next(body for kind, body in log if kind == "run_interrupted")
    assert interrupted["owner"]["pid"] == owner.pid
    assert _effects_sync(deployment) == {"cut:1": 1}  # replayed, not made again


async def test_a_failed_run_handed_back_to_an_older_checkpoint_is_resumed_once(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    flag, worker_pid = await _failed_on_a_worker(deployment, monkeypatch, tmp_path, "older")
    flag.unlink()
    newest = max(await store.list_checkpoints("older"), key=lambda record: record.seq)
    assert newest.seq == 1
    client = redis.Redis.from_url(deployment.redis_url)
    try:  # the newest checkpoint damaged: the run goes back to before step 1
        damaged = newest._replace(body=newest.body[:-8] + b"damaged!")
        key = f"{deployment.prefix}checkpoints:older"
        client.hset(key, newest.checkpoint_id, checkpoint_value(damaged))
    finally:
        client.close()
    flaky = make_flaky()
    try:
        with pytest.warns(CheckpointFallbackWarning):
            result = await asyncio.wait_for(flaky.resume_latest("older"), 30)
    finally:
        await flaky.stop()
    assert result["fetch"] == result["report"] == worker_pid
    log = [entry for entry in await event_log(store, "older") if entry[0] != "checkpoint_saved"]
    kinds = _kinds(log)
    failed_at = kinds.index("run_failed")
    assert kinds[failed_at + 1 :] == ["run_resumed"] + ["step_started", "step_completed"] * 3 + [
        "run_completed"
    ], kinds
    assert (log[failed_at + 1][1]["previous"], log[failed_at + 1][1]["seq"]) == ("failed", 0)
    # steps 1 and 2 ran again, their journaled calls replayed, not made again
    assert {k: n for k, n in _effects_sync(deployment).items() if k.startswith("older:")} == {
        "older:1": 1,
        "older:2": 1,
        "older:3": 1,
    }


def press_resume(
    deployment: Deployment, run_id: str, until: str, clutch: Clutch | None = None
) -> tuple[int, Any, str]:
    """The web inspector's resume button of ``run_id``, with ``clutch`` (default: a
    ``flaky``) handing it back to the workers: the answer's status and body, and the run's
    status once it is ``until`` after events the resume wrote (or 30 s later)."""
    ui_store = RedisCheckpointStorage(deployment.redis_url, prefix=deployment.prefix)
    clutch = clutch or make_flaky()
    settings = UISettings(store=ui_store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        read: Any = client.portal.call(ui_store.get_run, run_id)  # type: ignore[union-attr]
        answer = client.post(f"/api/runs/{run_id}/resume", headers={"X-Nestegg-Token": TOKEN})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            run: Any = client.portal.call(ui_store.get_run, run_id)  # type: ignore[union-attr]
            if run.status == until and run.event_seq > read.event_seq:
                break
            time.sleep(0.05)
        # Its transport's and store's tasks end here, not when the client's loop ends and
        # cancels what is left (a broker client's task there could hold that end).
        client.portal.call(clutch.stop)  # type: ignore[union-attr]
        client.portal.call(ui_store.close)  # type: ignore[union-attr]
        return answer.status_code, answer.json(), run.status


async def test_the_inspectors_resume_button_hands_a_failed_run_back_to_the_workers(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    flag, worker_pid = await _failed_on_a_worker(deployment, monkeypatch, tmp_path, "button")
    flag.unlink()
    clutch = make_flaky()
    assert clutch.transport is not None
    closed: list[bool] = []
    close = clutch.transport.close

    async def counted_close() -> None:
        closed.append(True)
        await close()

    clutch.transport.close = counted_close  # type: ignore[method-assign]
    status, body, ended = await asyncio.to_thread(
        press_resume, deployment, "button", "completed", clutch
    )
    assert (status, body) == (202, {"run_id": "button", "started": True})
    assert ended == "completed"
    assert closed  # the inspector closed the connection it handed the run over, at its end
    run = await store.get_run("button")
    assert run is not None
    result = run_result(run)
    assert result["report"] == worker_pid  # run by the worker, not in the inspector
    await _check_completed_once(deployment, store, "button", result)


async def test_the_inspectors_resume_button_answers_202_for_a_run_that_fails_again_on_a_worker(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    await _failed_on_a_worker(deployment, monkeypatch, tmp_path, "again")  # its flag stays
    before = await store.get_run("again")
    assert before is not None
    status, body, ended = await asyncio.to_thread(press_resume, deployment, "again", "failed")
    assert (status, body) == (202, {"run_id": "again", "started": True})  # as handed back
    assert ended == "failed"  # the run's page shows it
    run = await store.get_run("again")
    assert run is not None and run.fence > before.fence
    kinds = _kinds(await event_log(store, "again"))
    assert kinds.count("run_failed") == 2 and kinds.count("run_resumed") == 1, kinds
