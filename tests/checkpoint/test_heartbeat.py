"""A run's heartbeat renews its lease a third of the lease after it was last set, by a
step's commit (durability "sync") or by the last renewal: a run whose steps commit more
often sends no renewal of its own, a long step is renewed in time. One timer of the loop
keeps every run's heartbeat: a failed renewal is logged and the next made when due, a
stopped heartbeat's renewal under way is cancelled, and ended runs leave nothing behind."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import time
import weakref
from datetime import timedelta
from typing import Any

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.heartbeat import Heartbeat, heartbeats
from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.errors import StaleOwnerError

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


class Renews:
    """A run's writer as the loop's heartbeats see it: a renewal due every ``every`` s."""

    RENEWAL_FAILURES: tuple[type[Exception], ...] = (OSError,)

    def __init__(self, run_id: str, every: float, fail: int = 0, block: bool = False) -> None:
        self.run_id = run_id
        self.every = every
        self.fail = fail
        self.block = block
        self.renewed_at = time.monotonic()
        self.renewals: list[float] = []
        self.cancelled = False

    def _renewal_due_in(self) -> float:
        return self.renewed_at + self.every - time.monotonic()

    async def _renew(self) -> bool:
        self.renewed_at = time.monotonic()
        if self.block:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if self.fail:
            self.fail -= 1
            raise OSError("the store did not answer")
        self.renewals.append(self.renewed_at)
        return True

    async def _cancel_note(self) -> str | None:
        return None


async def test_one_timer_renews_many_runs_each_when_due() -> None:
    beats = heartbeats()
    runs = [Renews(f"r{i}", 0.05 + i * 0.01) for i in range(5)]
    kept = [beats.beat(run) for run in runs]
    assert beats.beating == 5
    await asyncio.sleep(0.32)
    for run in runs:  # every run renewed about every ``every`` s
        assert len(run.renewals) >= int(0.3 / run.every) - 1
        gaps = [b - a for a, b in zip(run.renewals, run.renewals[1:], strict=False)]
        assert min(gaps) >= run.every * 0.9
    for heartbeat in kept:
        await heartbeat.stop()
    assert beats.beating == 0
    counts = [len(run.renewals) for run in runs]
    await asyncio.sleep(0.15)
    assert [len(run.renewals) for run in runs] == counts  # stopped: no renewal more


async def test_a_failed_renewal_is_logged_and_the_next_made_when_due(caplog: Any) -> None:
    run = Renews("flaky", 0.05, fail=2)
    heartbeat = heartbeats().beat(run)
    await asyncio.sleep(0.27)
    await heartbeat.stop()
    assert len(run.renewals) >= 2  # after the two failures
    failed = [r.getMessage() for r in caplog.records if "heartbeat of run" in r.getMessage()]
    assert failed == ["heartbeat of run 'flaky' failed: the store did not answer"] * 2


async def test_stopping_a_heartbeat_cancels_its_renewal_under_way() -> None:
    beats = heartbeats()
    run = Renews("stuck", 0.02, block=True)
    heartbeat = beats.beat(run)
    await asyncio.sleep(0.08)
    assert heartbeat.renewal is not None  # under way, waiting
    await heartbeat.stop()
    assert run.cancelled and heartbeat.renewal is None and beats.beating == 0


async def test_a_run_taken_over_has_its_heartbeat_end(caplog: Any) -> None:
    class Taken(Renews):
        async def _renew(self) -> bool:
            raise StaleOwnerError("taken")

    beats = heartbeats()
    heartbeat = beats.beat(Taken("gone", 0.02))
    await asyncio.sleep(0.08)
    assert beats.beating == 0 and heartbeat.renewer is None
    assert "run 'gone' was taken over by another owner" in caplog.text


async def test_runs_that_ended_leave_nothing_behind_in_the_heartbeats() -> None:
    beats = heartbeats()
    for batch in range(20):  # 2,000 runs that end long before a renewal is due
        kept = [beats.beat(Renews(f"r{batch}-{i}", 60.0)) for i in range(100)]
        for heartbeat in kept:
            await heartbeat.stop()
    assert beats.beating == 0
    assert len(beats._heap) <= 200  # rebuilt without the stopped ones, not 2,000
    assert all(entry[2].renewer is None for entry in beats._heap)


async def test_a_run_due_before_a_run_whose_lease_moved_is_renewed_when_due() -> None:
    beats = heartbeats()
    moved = Renews("moved", 0.1)  # due at 0.10 s
    first = beats.beat(moved)
    await asyncio.sleep(0.02)
    other, began = Renews("other", 0.1), time.monotonic()  # due at 0.12 s
    second = beats.beat(other)
    await asyncio.sleep(0.07)
    moved.renewed_at = time.monotonic()  # a step's commit set its lease: due at 0.19 s
    await asyncio.sleep(0.2)
    await first.stop()
    await second.stop()
    assert other.renewals[0] - began < 0.13  # not when the moved one became due


def test_a_closed_loop_is_not_kept_by_its_heartbeats() -> None:
    async def use() -> weakref.ref[asyncio.AbstractEventLoop]:
        heartbeats().beat(Renews("left", 60.0))  # never stopped: its loop ends first
        return weakref.ref(asyncio.get_running_loop())

    used = asyncio.run(use())
    asyncio.run(use())  # the next loop's heartbeats
    gc.collect()
    assert used() is None


SEEN: contextvars.ContextVar[object] = contextvars.ContextVar("seen")


async def test_a_renewal_runs_in_its_own_runs_context_and_keeps_no_other() -> None:
    class Data:
        pass

    data = Data()
    freed = weakref.ref(data)
    beats = heartbeats()
    mine, other = Renews("mine", 0.05), Renews("other", 0.06)
    for run in (mine, other):
        run.seen = []  # type: ignore[attr-defined]
        renew = run._renew

        async def noted(run: Renews = run, renew: Any = renew) -> bool:
            run.seen.append(SEEN.get(None))  # type: ignore[attr-defined]
            return bool(await renew())

        run._renew = noted  # type: ignore[method-assign]

    async def start_mine(value: object) -> Heartbeat:
        SEEN.set(value)
        return beats.beat(mine)

    kept = await asyncio.get_running_loop().create_task(start_mine(data))
    others = beats.beat(other)  # from a context without the value
    await asyncio.sleep(0.2)
    await kept.stop()
    assert mine.seen and all(v is data for v in mine.seen)  # type: ignore[attr-defined]
    mine.seen.clear()  # type: ignore[attr-defined]
    del data
    await asyncio.sleep(0.15)
    gc.collect()
    await others.stop()
    assert set(other.seen) == {None}  # type: ignore[attr-defined]
    assert freed() is None  # the run's context went with its heartbeat


async def test_a_renewal_error_it_does_not_outlive_is_logged_and_ends_it(caplog: Any) -> None:
    class Odd(Renews):
        async def _renew(self) -> bool:
            raise RuntimeError("unexpected")

    beats = heartbeats()
    heartbeat = beats.beat(Odd("odd", 0.03))
    await asyncio.sleep(0.1)
    assert beats.beating == 0 and heartbeat.renewer is None
    assert "heartbeat of run 'odd' stopped" in caplog.text
    assert "RuntimeError: unexpected" in caplog.text
