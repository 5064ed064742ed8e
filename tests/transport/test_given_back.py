"""A run a worker's drain gave back, whose message pointing at it again was lost (the
worker died between the release and the publish): a worker's sweep brings it back, and
the worker that claims it writes ``run_resumed`` as after a drain whose message came. On
a real broker (Redis Streams, then RabbitMQ), the Redis store and a worker process."""

from __future__ import annotations

import time

import pytest

from nestegg.checkpoint.formats import event_body, opening_payload, step_started_body
from nestegg.checkpoint.ownership import interruption
from nestegg.checkpoint.records import Commit, EventRecord, Owner
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.constants import RUN_INTERRUPTED, RUN_STARTED, STEP_STARTED
from tests.transport.apps import make_slow
from tests.transport.conftest import Deployment
from tests.transport.test_workers import event_log

pytestmark = [pytest.mark.crash, pytest.mark.server]


async def test_a_sweep_bringing_back_a_run_a_drain_gave_back_writes_run_resumed(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.lease = 1.0  # sweeps every second
    deployment.apply(monkeypatch)
    slow = make_slow()
    try:
        # stored for the workers, not published: as if its message was taken already
        book = slow.checkpointed_runs()
        await book.store_queued(await book.queued_record({}, "given-back"))
        gone = Owner(host="elsewhere#0", pid=1, started="0")
        now = time.time()
        claimed = await store.claim_run("given-back", 1, gone, now + 1.0, now)
        # what its drain wrote before the worker died: the step's start, the release
        past = now - 60.0  # untouched for longer than a sweep waits
        events = [
            (RUN_STARTED, event_body(opening_payload())),
            (STEP_STARTED, step_started_body(1, "crawl")),
            (RUN_INTERRUPTED, event_body(interruption(claimed, released=True))),
        ]
        release = Commit("given-back", claimed.fence, lease_until=past, updated_at=past)
        for seq, (kind, body) in enumerate(events, 1):
            release.events.append(EventRecord("given-back", seq, past, kind, body))
        release.event_seq = len(events)
        await store.commit(release)
        worker = deployment.start_worker("slow")
        result = await slow.result("given-back", timeout=30)
    finally:
        await slow.stop()
    assert result["crawled"] == worker.process.pid
    kinds = [kind for kind, _ in await event_log(store, "given-back")]
    assert kinds[:5] == ["run_started", "step_started", "run_interrupted", "run_resumed",
                         "step_started"]  # fmt: skip
    (_, released), (_, resumed) = (await event_log(store, "given-back"))[2:4]
    assert resumed["previous"] == "interrupted" and resumed["seq"] == 0
    assert resumed["previous_owner"] == released["owner"] == gone.to_json()
    assert kinds.count("run_interrupted") == kinds.count("run_resumed") == 1
