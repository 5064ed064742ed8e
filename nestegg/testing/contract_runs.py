"""The store contract, part one: setup, runs, claims, deleting and expiring.

Every test runs against every registered store (see :mod:`nestegg.testing`). The memory
store is the reference: whatever it does, every other store must do too.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from nestegg.checkpoint.codec import seal_json
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import CANCELLED, COMPLETED, FAILED, RUNNING, WAITING
from nestegg.errors import (
    RunExistsError,
    RunFinishedError,
    RunLockedError,
    RunNotFoundError,
    StaleOwnerError,
)
from nestegg.testing.builders import (
    OTHER_OWNER,
    OWNER,
    T0,
    assert_bytes_fields,
    commit_steps,
    create,
    make_commit,
    make_journal,
    make_run,
    make_step,
    snapshot,
)
from nestegg.testing.fixtures import StoreFactory

RACERS = 40


# --- setup and runs --------------------------------------------------------------------


async def test_store_fills_the_protocol(store: CheckpointStorage) -> None:
    assert isinstance(store, CheckpointStorage)


async def test_setup_is_idempotent(store: CheckpointStorage, store_factory: StoreFactory) -> None:
    await store.setup()
    run = await create(store)
    await store.setup()
    other = await store_factory()
    await other.setup()
    assert await store.get_run(run.run_id) == run
    assert await other.get_run(run.run_id) == run


async def test_another_handle_sees_every_write(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    run = await create(store)
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    other = await store_factory()
    assert await snapshot(other, run.run_id) == await snapshot(store, run.run_id)


async def test_create_and_get_round_trip_every_field(store: CheckpointStorage) -> None:
    run = make_run(
        "run-full",
        pipeline="enrichment",
        status=FAILED,
        input_value={"text": "héllo ☃ \U0001f600", "n": [1, 2.5, None, True]},
        created_at=T0 + 0.000001,
        updated_at=T0 + 12.345678,
        fence=7,
        owner=OWNER,
        lease_until=T0 + 30.5,
        result=seal_json({"answer": 42}),
        error=seal_json({"type": "ValueError", "message": "boom"}),
        step_seq=12,
        event_seq=31,
        parent_run="run-parent",
        parent_checkpoint="0190aabbccdd-000001abcd12345678",
    )
    await store.create_run(run)
    got = await store.get_run("run-full")
    assert got == run
    assert got is not None
    assert_bytes_fields(got)
    assert got.input == run.input


async def test_create_and_get_round_trip_defaults(store: CheckpointStorage) -> None:
    run = make_run("run-min")
    await store.create_run(run)
    got = await store.get_run("run-min")
    assert got == run
    assert got is not None
    assert (got.owner, got.lease_until, got.result, got.error) == (None, None, None, None)
    assert (got.parent_run, got.parent_checkpoint, got.fence) == (None, None, 1)


async def test_stored_run_is_not_the_callers_object(store: CheckpointStorage) -> None:
    run = make_run("run-copy")
    await store.create_run(run)
    kept = dataclasses.replace(run)
    run.status = CANCELLED
    run.fence = 99
    got = await store.get_run("run-copy")
    assert got == kept
    assert got is not None
    got.status = COMPLETED
    assert await store.get_run("run-copy") == kept


async def test_create_twice_raises_and_keeps_the_first(store: CheckpointStorage) -> None:
    first = await create(store, run_id="run-twice", pipeline="one")
    second = make_run("run-twice", pipeline="two", status=COMPLETED, fence=5)
    with pytest.raises(RunExistsError):
        await store.create_run(second)
    assert await store.get_run("run-twice") == first


async def test_get_missing_run_is_none(store: CheckpointStorage) -> None:
    assert await store.get_run("run-nope") is None
    assert await store.load_steps("run-nope") == []
    assert await store.read_events("run-nope") == []
    assert await store.list_checkpoints("run-nope") == []
    assert await store.read_journal("run-nope", 1) == []
    assert await store.get_checkpoint("nope") is None


@pytest.mark.parametrize("malformed", ["../orig", "a/b", "..", "", "x" * 201])
async def test_get_checkpoint_of_a_malformed_id_is_none_and_changes_nothing(
    store: CheckpointStorage, malformed: str
) -> None:
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    before = await snapshot(store, run.run_id)
    assert await store.get_checkpoint(malformed) is None
    assert await snapshot(store, run.run_id) == before
    assert [r.run_id for r in await store.list_runs()] == [run.run_id]


async def test_list_runs_newest_first_and_filtered(store: CheckpointStorage) -> None:
    assert await store.list_runs() == []
    specs = [("a", RUNNING), ("b", COMPLETED), ("a", FAILED), ("b", RUNNING), ("a", COMPLETED)]
    runs = [
        await create(store, run_id=f"run-{i}", pipeline=p, status=s, created_at=T0 + i)
        for i, (p, s) in enumerate(specs)
    ]
    newest_first = list(reversed(runs))
    assert await store.list_runs() == newest_first
    assert await store.list_runs(pipeline="a") == [r for r in newest_first if r.pipeline == "a"]
    assert await store.list_runs(statuses=[RUNNING]) == [runs[3], runs[0]]
    assert await store.list_runs(statuses=(COMPLETED, FAILED)) == [runs[4], runs[2], runs[1]]
    assert await store.list_runs(pipeline="b", statuses=[RUNNING]) == [runs[3]]
    assert await store.list_runs(limit=2) == newest_first[:2]
    assert await store.list_runs(pipeline="a", limit=1) == [runs[4]]
    assert await store.list_runs(statuses=[]) == []
    assert await store.list_runs(pipeline="zzz") == []


# --- claims -----------------------------------------------------------------------------


async def test_claim_sets_owner_lease_status_and_fence(store: CheckpointStorage) -> None:
    run = await create(store, status=WAITING, fence=3)
    claimed = await store.claim_run(run.run_id, 3, OWNER, T0 + 60, T0 + 50)
    expected = dataclasses.replace(
        run, fence=4, owner=OWNER, lease_until=T0 + 60, status=RUNNING, updated_at=T0 + 50
    )
    assert claimed == expected
    assert await store.get_run(run.run_id) == expected
    again = await store.claim_run(run.run_id, 4, OTHER_OWNER, T0 + 90, T0 + 80)
    assert (again.fence, again.owner, again.lease_until) == (5, OTHER_OWNER, T0 + 90)


@pytest.mark.parametrize("status", [COMPLETED, FAILED, CANCELLED])
async def test_claim_of_a_finished_run_changes_nothing_unless_it_reopens_it(
    store: CheckpointStorage, status: str
) -> None:
    run = await create(store, status=status, fence=3, result=seal_json({"done": 1}))
    with pytest.raises(RunFinishedError) as refused:
        await store.claim_run(run.run_id, 3, OWNER, T0 + 60, T0 + 50)
    assert (refused.value.run_id, refused.value.status) == (run.run_id, status)
    assert isinstance(refused.value, RunLockedError)  # a lost claim
    assert await store.get_run(run.run_id) == run
    with pytest.raises(RunLockedError) as stale:  # a stale fence stays a plain lost claim
        await store.claim_run(run.run_id, 2, OWNER, T0 + 60, T0 + 50, reopen=True)
    assert not isinstance(stale.value, RunFinishedError)
    reopened = await store.claim_run(run.run_id, 3, OWNER, T0 + 60, T0 + 50, reopen=True)
    expected = dataclasses.replace(
        run, fence=4, owner=OWNER, lease_until=T0 + 60, status=RUNNING, updated_at=T0 + 50
    )
    assert reopened == expected
    assert await store.get_run(run.run_id) == expected


@pytest.mark.parametrize("wrong_fence", [0, 1, 3])
async def test_claim_with_a_wrong_fence_changes_nothing(
    store: CheckpointStorage, wrong_fence: int
) -> None:
    run = await create(store, fence=2, owner=OWNER, lease_until=T0 + 5)
    with pytest.raises(RunLockedError):
        await store.claim_run(run.run_id, wrong_fence, OTHER_OWNER, T0 + 99, T0 + 98)
    assert await store.get_run(run.run_id) == run


async def test_claim_missing_run_raises_not_found(store: CheckpointStorage) -> None:
    with pytest.raises(RunNotFoundError):
        await store.claim_run("run-nope", 1, OWNER, T0 + 60, T0)
    assert await store.get_run("run-nope") is None


async def _race_claims(handles: list[CheckpointStorage], run: RunRecord) -> list[Any]:
    return await asyncio.gather(
        *(
            handle.claim_run(
                run.run_id,
                run.fence,
                dataclasses.replace(OWNER, pid=1000 + i),
                T0 + 60,
                T0 + 10,
            )
            for i, handle in enumerate(handles)
        ),
        return_exceptions=True,
    )


async def test_concurrent_claims_exactly_one_wins(store: CheckpointStorage) -> None:
    run = await create(store)
    outcomes = await _race_claims([store] * 20, run)
    winners = [o for o in outcomes if isinstance(o, RunRecord)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, RunLockedError) for o in outcomes if o is not winners[0])
    stored = await store.get_run(run.run_id)
    assert stored == winners[0]
    assert stored is not None and stored.fence == run.fence + 1


async def test_concurrent_claims_over_two_handles_exactly_one_wins(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    other = await store_factory()
    run = await create(store)
    outcomes = await _race_claims([store, other] * 10, run)
    winners = [o for o in outcomes if isinstance(o, RunRecord)]
    assert len(winners) == 1, outcomes
    assert await other.get_run(run.run_id) == winners[0]


async def test_old_owner_is_fenced_off_after_a_claim(store: CheckpointStorage) -> None:
    run = await create(store)
    await store.claim_run(run.run_id, run.fence, OTHER_OWNER, T0 + 60, T0 + 10)
    with pytest.raises(StaleOwnerError):
        await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)], step_seq=1))
    assert await store.load_steps(run.run_id) == []
    await store.commit(make_commit(run, fence=run.fence + 1, steps=[make_step(run.run_id, 1)]))
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1]


# --- deleting ---------------------------------------------------------------------------


async def test_delete_run_removes_everything(store: CheckpointStorage) -> None:
    run, other = await create(store), await create(store)
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    await store.commit(make_commit(run, journal=[make_journal(run.run_id, 2, 0)]))
    await commit_steps(store, other, range(1, 3), checkpoints=True)
    checkpoint_ids = [c.checkpoint_id for c in await store.list_checkpoints(run.run_id)]
    other_before = await snapshot(store, other.run_id)
    assert await store.delete_run(run.run_id) is True
    assert await snapshot(store, run.run_id) == (None, [], [], [], [], [[]] * 10)
    for checkpoint_id in checkpoint_ids:
        assert await store.get_checkpoint(checkpoint_id) is None
    assert await store.delete_run(run.run_id) is False
    assert await store.delete_run("run-never") is False
    assert await snapshot(store, other.run_id) == other_before
    assert await store.list_runs() == [other_before[0]]


async def test_a_deleted_run_id_can_be_created_afresh(store: CheckpointStorage) -> None:
    run = await create(store, run_id="run-again")
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    await store.delete_run("run-again")
    fresh = await create(store, run_id="run-again", pipeline="second")
    assert await snapshot(store, "run-again") == (fresh, [], [], [], [], [[]] * 10)


async def test_delete_checkpoints(store: CheckpointStorage) -> None:
    run, other = await create(store, fence=5), await create(store)
    await commit_steps(store, run, range(1, 5), checkpoints=True)
    await commit_steps(store, other, range(1, 2), checkpoints=True)
    mine, theirs = (
        await store.list_checkpoints(run.run_id),
        await store.list_checkpoints(other.run_id),
    )
    gone = await store.delete_checkpoints(
        run.run_id, [mine[1].checkpoint_id, mine[3].checkpoint_id, "0000-unknown"]
    )
    assert gone == 2
    assert await store.list_checkpoints(run.run_id) == [mine[0], mine[2]]
    assert await store.get_checkpoint(mine[1].checkpoint_id) is None
    assert await store.delete_checkpoints(run.run_id, [theirs[0].checkpoint_id]) == 0
    assert await store.get_checkpoint(theirs[0].checkpoint_id) == theirs[0]
    assert await store.delete_checkpoints(run.run_id, []) == 0
    assert await store.delete_checkpoints("run-nope", [mine[0].checkpoint_id]) == 0
    assert len(await store.load_steps(run.run_id)) == 4


async def test_expire_runs(store: CheckpointStorage) -> None:
    def spec(pipeline: str, status: str, updated: float) -> dict[str, Any]:
        return {"pipeline": pipeline, "status": status, "updated_at": T0 + updated}

    specs = {
        "run-old-done": spec("a", COMPLETED, 10),
        "run-old-failed": spec("a", FAILED, 20),
        "run-old-running": spec("a", RUNNING, 10),
        "run-new-done": spec("a", COMPLETED, 200),
        "run-edge-done": spec("a", COMPLETED, 100),
        "run-b-old-done": spec("b", COMPLETED, 10),
    }
    for run_id, fields in specs.items():
        run = await create(store, run_id=run_id, **fields)
        await commit_steps(store, run, range(1, 3), checkpoints=True)
        await store.commit(make_commit(run, updated_at=fields["updated_at"]))
    b_checkpoints = await store.list_checkpoints("run-b-old-done")
    expired = await store.expire_runs([COMPLETED, FAILED], T0 + 100, pipeline="a")
    assert sorted(expired) == ["run-old-done", "run-old-failed"]
    assert await store.get_run("run-old-done") is None
    assert await store.load_steps("run-old-failed") == []
    assert await store.expire_runs([], T0 + 1000) == []
    assert await store.expire_runs([COMPLETED], T0 + 100) == ["run-b-old-done"]
    assert await store.get_checkpoint(b_checkpoints[0].checkpoint_id) is None
    remaining = sorted(r.run_id for r in await store.list_runs())
    assert remaining == ["run-edge-done", "run-new-done", "run-old-running"]
    assert len(await store.load_steps("run-edge-done")) == 2


async def test_expire_never_deletes_a_run_claimed_meanwhile(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    other = await store_factory()
    runs = [
        await create(store, status=COMPLETED, updated_at=T0 + 1, fence=2) for _ in range(RACERS)
    ]
    now = T0 + 10_000

    async def resume(run: RunRecord) -> bool:
        try:
            await other.claim_run(run.run_id, run.fence, OWNER, now + 30, now, reopen=True)
        except RunNotFoundError:
            return False
        return True

    claims = asyncio.gather(*(resume(run) for run in runs))
    expired_ids, claimed = await asyncio.gather(store.expire_runs([COMPLETED], T0 + 100), claims)
    expired = set(expired_ids)
    for run, won in zip(runs, claimed, strict=True):
        stored = await store.get_run(run.run_id)
        if won:
            assert run.run_id not in expired, f"{run.run_id} was claimed, then expired"
            assert stored is not None and stored.status == RUNNING
        else:
            assert run.run_id in expired and stored is None
