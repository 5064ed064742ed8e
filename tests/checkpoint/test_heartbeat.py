"""A run's heartbeat renews its lease a third of the lease after it was last set, by a
step's commit (durability "sync") or by the last renewal: a run whose steps commit more
often sends no renewal of its own, a long step is renewed in time."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage

LEASE_S = 0.3
"""The runs' lease here: a renewal is due a third of it (0.1 s) after the lease was set."""


class CountsRenewals(MemoryCheckpointStorage):
    """Notes when each lease renewal (a commit of a lease and nothing else) comes."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals: list[float] = []

    async def commit(self, commit: Commit) -> None:
        if commit.lease_until is not None and not (commit.steps or commit.events):
            self.renewals.append(time.monotonic())
        await super().commit(commit)


def clutch_on(store: CountsRenewals, steps: int, step_s: float, durability: str) -> Clutch:
    policy = CheckpointPolicy(durability=durability)  # type: ignore[arg-type]
    config = CheckpointConfig(storage=store, policy=policy, lease=timedelta(seconds=LEASE_S))
    clutch = Clutch("beats", strategy=Strategy.ROUND_ROBIN, max_turns=steps, checkpoint=config)

    @clutch.agent()
    async def works(data: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(step_s)
        return {"n": data.get("n", 0) + 1}

    return clutch


async def test_steps_that_commit_more_often_than_a_third_of_the_lease_need_no_renewal() -> None:
    store = CountsRenewals()
    # 20 steps of 30 ms: 0.6 s, six thirds of the lease, each step's commit renewing it
    result = await clutch_on(store, 20, 0.03, "sync").run({}, run_id="busy")
    assert result == {"n": 20}
    assert store.renewals == []


async def test_a_long_step_has_its_lease_renewed_every_third_of_it() -> None:
    store = CountsRenewals()
    started = time.monotonic()
    task = asyncio.ensure_future(clutch_on(store, 1, 0.55, "sync").run({}, run_id="long"))
    await asyncio.sleep(0.45)
    run = await store.get_run("long")
    assert run is not None and run.lease_until is not None
    assert run.lease_until > time.time() + LEASE_S / 3  # renewed: at least a third ahead
    assert await task == {"n": 1}
    # due at 0.1, 0.2, 0.3, 0.4 and 0.5 s after the start's commit
    assert 4 <= len(store.renewals) <= 6
    gaps = [b - a for a, b in zip([started, *store.renewals], store.renewals, strict=False)]
    assert min(gaps[1:]) >= LEASE_S / 3 * 0.9  # one a third of the lease, no more often


async def test_with_write_behind_the_heartbeat_renews_whatever_the_steps_commit() -> None:
    # durability "async": a step's commit is written later, so it renews nothing yet
    store = CountsRenewals()
    result = await clutch_on(store, 20, 0.03, "async").run({}, run_id="behind")
    assert result == {"n": 20}
    assert len(store.renewals) >= 3
