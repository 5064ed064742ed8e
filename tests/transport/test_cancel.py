"""A run cancelled while a worker (a real process, on a real broker) runs its step: the
worker drops the step without failing or publishing the run, goes on with other runs, and
no sweep takes the cancelled run up again."""

from __future__ import annotations

import pytest

from nestegg.checkpoint.codec import unseal_json
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.constants import CANCELLED, RUN_CANCELLED
from nestegg.errors import RunFailedError
from nestegg.transport.worker import Worker
from tests.transport.apps import make_slow
from tests.transport.conftest import Deployment, wait_until
from tests.transport.test_workers import _effects_sync

pytestmark = [pytest.mark.crash, pytest.mark.server]


async def test_a_worker_drops_the_step_of_a_run_cancelled_meanwhile(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.slow = 1.5  # the step sleeps after its journaled call
    deployment.apply(monkeypatch)
    worker = deployment.start_worker("slow")
    slow = make_slow()
    try:
        await slow.submit({}, run_id="stopped")
        await wait_until(lambda: _effects_sync(deployment).get("stopped:1") == 1, 20, "the call")
        assert await slow.cancel("stopped") is True
        with pytest.raises(RunFailedError, match="the run was cancelled"):
            await slow.result("stopped", timeout=10)
        # one slot: this run gets it once the cancelled step is over and dropped
        done = await slow.run({}, run_id="next", timeout=30)
        assert set(done) == {"crawled", "after"}
        swept = await Worker(slow, slow.transport, sweep_after=0.0).sweep()
    finally:
        await slow.stop()
    assert "stopped" not in swept
    run = await store.get_run("stopped")
    # created 1, the worker's claim 2, the cancel 3: nothing claimed it since
    assert run is not None and (run.status, run.fence, run.step_seq) == (CANCELLED, 3, 0)
    events = await store.read_events("stopped")
    assert events[-1].kind == RUN_CANCELLED
    assert unseal_json(events[-1].body, "event")["previous"] == "running"
    assert _effects_sync(deployment) == {"stopped:1": 1, "next:1": 1}
    worker.terminate()
    assert worker.wait(timeout=40) == 0
    errors = worker.errors()
    assert "warning" not in errors and "error" not in errors, errors
