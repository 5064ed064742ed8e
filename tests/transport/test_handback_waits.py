"""Waiting runs handed back to the workers (see test_handback.py): one cancelled while it
waited goes on as a local resume of it does, one whose wait is over is continued once by a
worker, and the web inspector's resume button of either answers 202 however the run then
ends on a worker. On a real broker (Redis Streams, then RabbitMQ), the Redis store and worker
processes whose sweeps come every 20 s (the lease): what goes on at once is the
hand-back's doing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from nestegg import RunWaiting
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.constants import EXIT_WAITING
from tests.transport.apps import make_approving
from tests.transport.conftest import Deployment
from tests.transport.test_handback_paths import press_resume
from tests.transport.test_workers import _effects_sync, event_log

pytestmark = [pytest.mark.crash, pytest.mark.server]
HANDED_BACK_S = 10.0
"""How long a hand-back may take here: less than a sweep's 20 s."""


def _kinds(log: list[tuple[str, Any]]) -> list[str]:
    return [kind for kind, _ in log if kind != "checkpoint_saved"]


async def _waiting(clutch: Any, run_id: str) -> None:
    with pytest.raises(RunWaiting) as waiting:
        await clutch.run({}, run_id=run_id, timeout=30)
    assert waiting.value.signal == "approval"


async def test_a_cancelled_waiting_run_handed_back_waits_again_as_a_local_resume_leaves_it(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.lease = 20.0
    deployment.apply(monkeypatch)
    worker = deployment.start_worker("approving")
    approving, local = make_approving(), make_approving(here=True)
    try:
        await _waiting(approving, "off")
        await _waiting(local, "here")
        for clutch, run_id in ((approving, "off"), (local, "here")):
            assert await clutch.cancel(run_id)
            with pytest.raises(RunWaiting) as again:
                await asyncio.wait_for(clutch.resume_latest(run_id), HANDED_BACK_S)
            told = f"send it with signal({run_id!r}, 'approval', value)"
            assert str(again.value) == f"run {run_id!r} waits for signal 'approval': {told}"
        off, here = [await store.get_run(run_id) for run_id in ("off", "here")]
        assert off is not None and here is not None
        assert (off.status, off.step_seq, off.lease_until) == ("waiting", 0, here.lease_until)
        await approving.signal("off", "approval", "yes", resume=False)
        result = await asyncio.wait_for(approving.resume_latest("off"), HANDED_BACK_S)
    finally:
        await approving.stop()
    assert result == {"approval": "yes", "review": worker.process.pid}
    handed, local_log = [await event_log(store, run_id) for run_id in ("off", "here")]
    kinds = _kinds(handed)
    assert kinds[: len(_kinds(local_log))] == _kinds(local_log)  # as the local resume did
    cancelled = kinds.index("run_cancelled")
    assert kinds[cancelled:] == [
        *["run_cancelled", "run_resumed", "step_started", "run_waiting"],
        *["run_resumed", "step_started", "signal_received", "step_completed", "run_completed"],
    ], kinds
    resumed = [body for kind, body in handed if kind == "run_resumed"]
    assert [body["previous"] for body in resumed] == ["cancelled", "waiting"]
    assert _effects_sync(deployment) == {"off:1": 1, "here:1": 1}  # replayed, not made again


@pytest.mark.parametrize("over", ["signal stored", "deadline passed"])
async def test_a_waiting_run_whose_wait_is_over_is_handed_back_and_continued_once(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    over: str,
) -> None:
    deployment.lease = 20.0
    deployment.apply(monkeypatch)
    if over == "deadline passed":
        monkeypatch.setenv("NESTEGG_TEST_WAIT", "1")
    worker = deployment.start_worker("approving")
    approving = make_approving()
    try:
        await _waiting(approving, "over")
        if over == "signal stored":
            await approving.signal("over", "approval", "yes", resume=False)
        else:
            await asyncio.sleep(1.5)
        result = await asyncio.wait_for(approving.resume_latest("over"), HANDED_BACK_S)
    finally:
        await approving.stop()
    approval = "yes" if over == "signal stored" else "expired"
    assert result == {"approval": approval, "review": worker.process.pid}
    log = await event_log(store, "over")
    kinds = _kinds(log)
    waited = kinds.index("run_waiting")
    assert kinds[waited:] == [
        *["run_waiting", "run_resumed", "step_started"],
        *["signal_received", "step_completed", "run_completed"],
    ], kinds
    resumed = next(body for kind, body in log if kind == "run_resumed")
    assert (resumed["previous"], resumed["seq"]) == ("waiting", 0)
    assert _effects_sync(deployment) == {"over:1": 1}  # replayed, not made again


@pytest.mark.parametrize("sent_by", ["signal()", "nestegg signal --app"])
async def test_a_signal_hands_the_run_whose_wait_it_ends_back_to_the_workers(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    sent_by: str,
) -> None:
    # the run is the workers': the process that sends the signal runs none of its steps
    deployment.lease = 20.0
    deployment.apply(monkeypatch)
    worker = deployment.start_worker("approving")
    approving = make_approving()
    try:
        await _waiting(approving, "sent")
        if sent_by == "signal()":
            signalled = approving.signal("sent", "approval", "yes")
            result = await asyncio.wait_for(signalled, HANDED_BACK_S)
        else:
            app = "tests.transport.apps:approving"
            done = await deployment.nestegg(
                "signal", "sent", "approval", '"yes"', "--app", app, "--json"
            )
            assert done.returncode == 0, done.stderr
            assert done.stderr == (
                "run sent was handed back to the workers of pipeline 'approving': waiting for "
                "its result (a worker runs it: nestegg worker with this --app)\n"
            )
            result = json.loads(done.stdout)["result"]
    finally:
        await approving.stop()
    assert result == {"approval": "yes", "review": worker.process.pid}
    kinds = _kinds(await event_log(store, "sent"))
    assert kinds[kinds.index("run_waiting") :] == [
        *["run_waiting", "run_resumed", "step_started"],
        *["signal_received", "step_completed", "run_completed"],
    ], kinds
    assert _effects_sync(deployment) == {"sent:1": 1}  # replayed, not made again


async def test_a_run_that_waits_again_on_workers_for_a_timer_is_said_to_be_resumed_by_a_sweep(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # not nestegg resume, which would hand it back to the workers to wait again
    deployment.lease = 20.0
    monkeypatch.setenv("NESTEGG_TEST_NAP", "3600")
    deployment.apply(monkeypatch)
    deployment.start_worker("approving")
    approving = make_approving()
    try:
        await _waiting(approving, "napping")
        done = await deployment.nestegg(
            "signal", "napping", "approval", '"yes"', "--app", "tests.transport.apps:approving"
        )
    finally:
        await approving.stop()
    assert done.returncode == EXIT_WAITING, done.stderr
    told = done.stderr.splitlines()[-1]
    assert told.startswith("error: run 'napping' was resumed and waits again, for timer until ")
    assert told.endswith(": it goes on once the timer is due: a worker's sweep resumes it then")


@pytest.mark.parametrize("then", ["fails", "waits again"])
async def test_the_inspectors_resume_button_answers_202_for_a_waiting_run_that_ends_at_once(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    then: str,
) -> None:
    # a worker claims it and fails it, or it waits again: the answer was the run's outcome
    # (500 with its failure, 409 with its RunWaiting) when the run ended so within the few
    # seconds the answer waits for the resume's claim
    deployment.lease = 20.0
    deployment.apply(monkeypatch)
    flag = tmp_path / "flag"
    flag.touch()
    monkeypatch.setenv("NESTEGG_TEST_FLAG", str(flag))
    deployment.start_worker("approving")
    approving = make_approving()
    try:
        await _waiting(approving, "button")
        if then == "fails":  # its wait is over: nothing to claim, a worker takes it
            await approving.signal("button", "approval", "yes", resume=False)
        else:  # reopened, it waits again on a worker
            assert await approving.cancel("button")
    finally:
        await approving.stop()
    until = "failed" if then == "fails" else "waiting"
    status, body, ended = await asyncio.to_thread(
        press_resume, deployment, "button", until, make_approving()
    )
    assert (status, body) == (202, {"run_id": "button", "started": True})  # handed back
    assert ended == until  # its page shows it
    kinds = _kinds(await event_log(store, "button"))
    resumed = kinds.index("run_resumed")
    assert kinds[resumed:] == (
        ["run_resumed", "step_started", "signal_received", "step_failed", "run_failed"]
        if then == "fails"
        else ["run_resumed", "step_started", "run_waiting"]
    ), kinds
