"""The store contract, part three: many runs committing at once (a store may write the
commits that arrive together in one transaction or round trip; each stays fenced on its
own, and a failing one fails alone).

Every test runs against every registered store (see :mod:`nestegg.testing`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import COMPLETED
from nestegg.errors import (
    RunExistsError,
    RunFinishedError,
    RunLockedError,
    RunNotFoundError,
    StaleOwnerError,
)
from nestegg.testing.builders import (
    OWNER,
    T0,
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_run,
    make_step,
    snapshot,
)

RUNS = 40
STEPS = 3


def _step_commit(run: RunRecord, seq: int, fence: int | None = None) -> object:
    rid = run.run_id
    return make_commit(
        run,
        fence=run.fence if fence is None else fence,
        steps=[make_step(rid, seq)],
        events=[make_event(rid, seq)],
        checkpoints=[make_checkpoint(rid, seq)],
        step_seq=seq,
        event_seq=seq,
    )


async def _commit_all_at_once(
    store: CheckpointStorage, runs: list[RunRecord], seq: int, fences: dict[str, int]
) -> list[BaseException | None]:
    """One commit of step ``seq`` per run, all at once; each one's outcome."""

    async def one(run: RunRecord) -> BaseException | None:
        try:
            await store.commit(_step_commit(run, seq, fences.get(run.run_id)))  # type: ignore[arg-type]
        except Exception as error:
            return error
        return None

    return await asyncio.gather(*(one(run) for run in runs))


async def test_runs_committing_at_once_each_keep_their_own_steps(
    store: CheckpointStorage,
) -> None:
    runs = [await create(store, run_id=f"group-{i:02d}") for i in range(RUNS)]
    for seq in range(1, STEPS + 1):
        assert await _commit_all_at_once(store, runs, seq, {}) == [None] * RUNS
    for run in runs:
        rid = run.run_id
        assert await store.load_steps(rid) == [make_step(rid, s) for s in range(1, STEPS + 1)]
        assert [e.seq for e in await store.read_events(rid)] == list(range(1, STEPS + 1))
        assert [c.seq for c in await store.list_checkpoints(rid)] == list(range(1, STEPS + 1))
        stored = await store.get_run(rid)
        assert stored is not None and stored.step_seq == STEPS


async def test_a_lost_fence_in_a_group_fails_only_its_run(store: CheckpointStorage) -> None:
    # A big group and a small one (a store may write them differently: SQLite writes a
    # small one on the loop thread, in the transaction it began there).
    for size, name in ((RUNS, "fenced"), (5, "few")):
        runs = [await create(store, run_id=f"{name}-{i:02d}") for i in range(size)]
        assert await _commit_all_at_once(store, runs, 1, {}) == [None] * size
        lost = runs[size // 2]
        before = await snapshot(store, lost.run_id)
        outcomes = await _commit_all_at_once(store, runs, 2, {lost.run_id: lost.fence - 1})
        for run, outcome in zip(runs, outcomes, strict=True):
            if run is lost:
                assert isinstance(outcome, StaleOwnerError)
                assert lost.run_id in str(outcome)
            else:
                assert outcome is None
                assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
        assert await snapshot(store, lost.run_id) == before


async def test_a_missing_run_in_a_group_fails_alone(store: CheckpointStorage) -> None:
    runs = [await create(store, run_id=f"present-{i:02d}") for i in range(RUNS)]
    ghost = make_run("ghost-run")
    outcomes = await _commit_all_at_once(store, [*runs[:5], ghost, *runs[5:]], 1, {})
    assert isinstance(outcomes[5], RunNotFoundError)
    assert outcomes[:5] + outcomes[6:] == [None] * RUNS
    assert await store.get_run("ghost-run") is None
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]


async def _outcomes(calls: list[Any]) -> list[Any]:
    """Each awaitable's result or error, all awaited at once."""

    async def one(call: Any) -> Any:
        try:
            return await call
        except Exception as error:
            return error

    return await asyncio.gather(*(one(call) for call in calls))


async def test_runs_created_read_and_claimed_at_once_each_get_their_own_answer(
    store: CheckpointStorage,
) -> None:
    taken = await create(store, run_id="start-taken")
    done = await create(store, run_id="start-done", status=COMPLETED)
    runs = [make_run(f"start-{i:02d}") for i in range(RUNS)]
    twice = make_run("start-twice")
    created = await _outcomes(
        [store.create_run(r) for r in [*runs, make_run("start-taken"), twice, twice]]
    )
    assert created[:RUNS] == [None] * RUNS
    assert isinstance(created[RUNS], RunExistsError)
    assert {type(c) for c in created[RUNS + 1 :]} == {RunExistsError, type(None)}

    read = await _outcomes(
        [store.get_run(r.run_id) for r in [*runs, taken]] + [store.get_run("ghost")]
    )
    assert [r.run_id for r in read[:-1]] == [r.run_id for r in [*runs, taken]]
    assert read[:RUNS] == runs and read[-1] is None

    claims = [store.claim_run(r.run_id, r.fence, OWNER, T0 + 60, T0 + 50) for r in runs]
    claims.append(store.claim_run(taken.run_id, taken.fence + 5, OWNER, T0 + 60, T0 + 50))
    claims.append(store.claim_run("ghost", 1, OWNER, T0 + 60, T0 + 50))
    claims.append(store.claim_run(done.run_id, done.fence, OWNER, T0 + 60, T0 + 50))
    claimed = await _outcomes(claims)
    assert [(c.run_id, c.fence, c.owner) for c in claimed[:RUNS]] == [
        (r.run_id, r.fence + 1, OWNER) for r in runs
    ]
    assert isinstance(claimed[RUNS], RunLockedError)
    assert isinstance(claimed[RUNS + 1], RunNotFoundError)
    assert isinstance(claimed[RUNS + 2], RunFinishedError)
    assert await store.get_run(taken.run_id) == taken
    assert await store.get_run(done.run_id) == done


async def test_a_run_read_twice_at_once_gives_each_caller_a_record_of_its_own(
    store: CheckpointStorage,
) -> None:
    run = await create(store, run_id="read-twice")
    # the first read goes alone, the next ones together (a grouped read with one id twice)
    read = await asyncio.gather(*(store.get_run(run.run_id) for _ in range(3)))
    assert read == [run] * 3
    assert len({id(record) for record in read}) == 3  # changing one changes no other
