"""Workers in real processes on a real broker (Redis Streams, then RabbitMQ) and the Redis
store, of two versions of one pipeline: a step whose data does not fit the model of its
agent on the worker that takes it is set aside for a worker whose model fits, for the
misfit grace (ten leases), then its run is failed with IncompatibleDataError."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.errors import RunFailedError
from nestegg.task import ClutchTask
from tests.transport.apps import make_typed
from tests.transport.conftest import Deployment, WorkerProcess
from tests.transport.test_workers import _released, _run_when

pytestmark = [pytest.mark.crash, pytest.mark.server]

LEASE = 1.0
GRACE = 10 * LEASE


@contextlib.asynccontextmanager
async def _set_aside(
    deployment: Deployment,
    store: RedisCheckpointStorage,
    monkeypatch: pytest.MonkeyPatch,
    run_id: str,
) -> AsyncIterator[tuple[WorkerProcess, ClutchTask]]:
    """A worker of agent 'first' of pipeline ``typed``, one of agent 'second' of its strict
    version, with a lease of LEASE, and a run of ``typed`` submitted, whose step 2 that
    worker set aside (claimed by 'first', then by the strict 'second'): that worker and
    the run's task (the caller stopped after)."""
    deployment.lease = LEASE
    deployment.apply(monkeypatch)
    deployment.start_worker("typed", "--agents", "first")
    strict = deployment.start_worker("typed_strict", "--agents", "second")
    typed = make_typed()
    try:
        task = await typed.submit({"title": "t"}, run_id=run_id)
        run = await _run_when(store, run_id, lambda run: run.fence == 3 and _released(run))
        assert run.status == "running" and run.step_seq == 1
        yield strict, task
    finally:
        await typed.stop()


async def test_a_step_no_worker_model_fits_fails_its_run_after_the_misfit_grace(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with _set_aside(deployment, store, monkeypatch, "misfit") as (strict, task):
        set_aside = time.monotonic()
        with pytest.raises(RunFailedError) as failed:
            await task.result(timeout=4 * GRACE)
        took = time.monotonic() - set_aside
    error = failed.value
    assert (error.run_id, error.agent, error.error_type) == (
        "misfit",
        "second",
        "IncompatibleDataError",
    )
    assert error.error_message == (
        "run 'misfit': the stored data of step 1 no longer fits the model StrictPage of "
        "agent 'second' (pages: Field required); no worker whose model fits took the step "
        "within 10 s, so the run failed: resume it once the model fits the data again"
    )
    # set aside at once, and by the sweeps after (every five leases), until the grace ran out
    assert GRACE - 1 < took < GRACE + 12 * LEASE, f"{took:.1f} s"
    strict.terminate()
    assert strict.wait(timeout=20) == 0
    errors = strict.errors()
    assert errors.count("for a worker whose model fits it") == 1, errors  # warned once


async def test_a_worker_whose_model_fits_coming_within_the_misfit_grace_takes_the_step(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rolling deploy: the strict version's worker of agent 'second' is replaced by one
    # whose model fits the data of the first step
    async with _set_aside(deployment, store, monkeypatch, "deployed") as (strict, task):
        strict.kill()
        fitting = deployment.start_worker("typed", "--agents", "second")
        result = await task.result(timeout=4 * GRACE)
    assert result["second"] == fitting.process.pid and result["pages"] == 0


async def test_a_takeover_set_aside_for_a_model_writes_what_it_resumed_once(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner of step 2 died (a claim whose lease runs out); the strict worker's sweep
    takes it over, its data does not fit: the release writes the takeover's
    ``run_interrupted`` and ``run_resumed``, and the set-asides after it write nothing."""
    from nestegg.checkpoint.records import Owner
    from tests.transport.test_workers import event_log

    deployment.lease = LEASE
    deployment.apply(monkeypatch)
    first = deployment.start_worker("typed", "--agents", "first")
    typed = make_typed()
    try:
        await typed.submit({"title": "t"}, run_id="gone")
        run = await _run_when(store, "gone", lambda run: run.step_seq == 1 and _released(run))
        first.kill()
        gone = Owner(host="elsewhere#0", pid=1, started="0")
        now = time.time()
        await store.claim_run("gone", run.fence, gone, now + LEASE, now)  # then it died
        deployment.start_worker("typed_strict", "--agents", "second")
        deadline = time.monotonic() + 30
        while "run_resumed" not in [kind for kind, _ in await event_log(store, "gone")]:
            assert time.monotonic() < deadline, await event_log(store, "gone")
            await asyncio.sleep(0.1)
        await asyncio.sleep(7 * LEASE)  # set aside again by a sweep after, within the grace
    finally:
        await typed.stop()
    log = await event_log(store, "gone")
    kinds = [kind for kind, _ in log]
    assert kinds.count("run_interrupted") == kinds.count("run_resumed") == 1, kinds
    (_, lost), (_, resumed) = log[kinds.index("run_interrupted") :][:2]
    assert lost["owner"] == resumed["previous_owner"] == gone.to_json()
    assert (resumed["previous"], resumed["seq"]) == ("interrupted", 1)
    after = await store.get_run("gone")
    assert after is not None and after.step_seq == 1
