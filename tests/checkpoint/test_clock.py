"""The checkpoint config's clock times leases, heartbeats' lease ends and stored times."""

from __future__ import annotations

import pytest

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.records import Owner
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import ConfigurationError, RunLockedError
from nestegg.testing import FakeClock

from .conftest import Flaky, Pipeline

FOREIGN = Owner(host="elsewhere#00000000", pid=1, started="1")


async def _failed_run(store: CheckpointStorage, clock: FakeClock, run_id: str, at: str) -> Pipeline:
    """The pipeline a, b, c timed by ``clock``, after its run ``run_id`` failed at ``at``."""
    pipeline = Pipeline(store, clock=clock)
    pipeline.fail.add(at)
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id=run_id)
    return pipeline


async def test_a_lease_taken_elsewhere_expires_when_the_clock_passes_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    clock = FakeClock(1_800_000_000.0)
    pipeline = await _failed_run(checkpoint_store, clock, "remote", "b")
    run = await checkpoint_store.get_run("remote")
    assert run is not None and run.updated_at == clock.now
    await checkpoint_store.claim_run(
        "remote", run.fence, FOREIGN, clock.now + 60, clock.now, reopen=True
    )

    assert await pipeline.clutch.list_interrupted() == []
    with pytest.raises(RunLockedError):
        await pipeline.clutch.resume_latest("remote")
    clock.advance(61)
    assert [info.run_id for info in await pipeline.clutch.list_interrupted()] == ["remote"]
    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("remote") == ["a", "b", "c"]
    resumed = await checkpoint_store.get_run("remote")
    assert resumed is not None and resumed.updated_at == clock.now
    assert resumed.lease_until == clock.now + CheckpointConfig().lease.total_seconds()


def test_a_clock_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"CheckpointConfig\.clock must be a callable"):
        CheckpointConfig(clock=1.5)  # type: ignore[arg-type]


async def test_every_time_a_run_stores_comes_from_the_clock(
    checkpoint_store: CheckpointStorage,
) -> None:
    clock = FakeClock(1_800_000_000.0)
    pipeline = await _failed_run(checkpoint_store, clock, "timed", "c")
    events = await checkpoint_store.read_events("timed")
    assert {e.kind for e in events} >= {"run_started", "step_started", "step_failed"}
    assert {e.at for e in events} == {clock.now}
    history = await pipeline.clutch.history("timed")
    assert [step.started.timestamp() for step in history.steps] == [clock.now, clock.now]
