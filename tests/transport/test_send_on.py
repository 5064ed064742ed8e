"""Workers in real processes on a real broker (Redis Streams, then RabbitMQ) and the Redis
store that only send a step on to its agent's channel (they do not host the agent, or
their Clutch lacks it): a takeover's ``run_interrupted`` and ``run_resumed`` are written
once, by the worker that claims the run, and a step set aside for a model keeps its mark.
"""

from __future__ import annotations

import time

import pytest

from nestegg.checkpoint.records import Owner
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.transport.base import StepMessage, channel_name
from nestegg.transport.lacking import set_aside_since
from nestegg.transport.verdicts import pointer_fence
from tests.transport.apps import make_split, make_typed
from tests.transport.conftest import Deployment
from tests.transport.test_workers import _released, _run_when, event_log

pytestmark = [pytest.mark.crash, pytest.mark.server]

LEASE = 1.0
GONE = Owner(host="elsewhere#0", pid=1, started="0")


@pytest.mark.parametrize(
    "sender", [("split", "--agents", "first,second"), ("split_without_third",)]
)
async def test_a_takeover_sent_on_to_its_agent_writes_what_it_resumed_once(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    sender: tuple[str, ...],
) -> None:
    """The owner of step 3 died (a claim whose lease ran out); a worker that does not host
    agent 'third' (or whose Clutch lacks it) takes the run over and sends the step on, then
    gets a second pointer at the step, sent as the first was, and sends it on again; a
    worker of 'third' runs it: one ``run_interrupted`` and one ``run_resumed``."""
    deployment.lease = LEASE
    deployment.apply(monkeypatch)
    older = deployment.start_worker("split", "--agents", "first,second")
    split = make_split()
    assert split.transport is not None
    try:
        task = await split.submit({"x": 1}, run_id="sent")
        run = await _run_when(store, "sent", lambda run: run.step_seq == 2 and _released(run))
        older.kill()
        now = time.time()
        await store.claim_run("sent", run.fence, GONE, now + 0.2, now)  # then it died
        taken = await _run_when(store, "sent", lambda run: (run.lease_until or 0) < time.time())
        # pointed at again through the pipeline's channel, as the sweeps of two workers do
        message = StepMessage("sent", 3, pointer_fence(taken), None)
        deployment.start_worker(*sender)
        fence = taken.fence
        for _ in range(2):
            await split.transport.publish(channel_name("split"), message)
            sent = await _run_when(
                store, "sent", lambda run, after=fence: run.fence > after and _released(run)
            )
            fence = sent.fence
        third = deployment.start_worker("split", "--agents", "third")
        result = await task.result(timeout=20)
    finally:
        await split.stop()
    assert result["third"] == third.process.pid
    log = await event_log(store, "sent")
    kinds = [kind for kind, _ in log]
    assert kinds.count("run_interrupted") == kinds.count("run_resumed") == 1, kinds
    (_, lost), (_, resumed) = log[kinds.index("run_interrupted") :][:2]
    assert lost["owner"] == resumed["previous_owner"] == GONE.to_json()
    assert (resumed["previous"], resumed["seq"]) == ("interrupted", 2)
    assert kinds[-4:] == ["step_started", "step_completed", "checkpoint_saved", "run_completed"]


@pytest.mark.parametrize("sender", [("typed", "--agents", "first"), ("typed_without_second",)])
async def test_a_step_set_aside_for_a_model_and_sent_on_keeps_its_mark(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    sender: tuple[str, ...],
) -> None:
    """A step the strict worker of agent 'second' set aside, which a sweep then points a
    worker that does not host 'second' (or whose Clutch lacks it) at: that worker sends
    it on to the channel of 'second' and the run keeps the mark of the first set-aside,
    which its misfit grace counts from."""
    deployment.lease = LEASE
    deployment.apply(monkeypatch)
    first = deployment.start_worker("typed", "--agents", "first")
    strict = deployment.start_worker("typed_strict", "--agents", "second")
    typed = make_typed()
    try:
        await typed.submit({"title": "t"}, run_id="marked")
        run = await _run_when(store, "marked", lambda run: run.fence == 3 and _released(run))
        mark = set_aside_since(run)
        assert run.status == "running" and run.step_seq == 1 and mark is not None
        first.kill()
        strict.kill()
        deployment.start_worker(*sender)
        sent = await _run_when(store, "marked", lambda run: run.fence == 4 and _released(run))
    finally:
        await typed.stop()
    assert sent.status == "running" and sent.step_seq == 1
    assert set_aside_since(sent) == mark
