"""The store contract for long histories, run against every registered store:
:func:`~nestegg.checkpoint.stores.base.load_history` gives the records ``load_steps`` gives
(a :class:`~nestegg.checkpoint.stores.base.BlockHistoryStore` keeps them packed in blocks),
across block edges, truncations, rewritten steps and deletion.

Runs are longer than one block (``STEP_BLOCK_STEPS``), so a store that packs blocks (the
SQLite store) packs some here; the records are in the checkpointer's layout.
"""

from __future__ import annotations

import pytest

from nestegg.checkpoint.records import RunRecord, StepRecord
from nestegg.checkpoint.step_blocks import step_records
from nestegg.checkpoint.stores.base import CheckpointStorage, load_history
from nestegg.constants import STEP_BLOCK_STEPS
from nestegg.testing.builders import commit_steps, create, make_commit, make_step

BLOCK = STEP_BLOCK_STEPS
STEPS = 2 * BLOCK + 88


async def commit_at_once(
    store: CheckpointStorage, run: RunRecord, seqs: range, *, agent: str = "agent"
) -> list[StepRecord]:
    """Commit the steps ``seqs`` in one commit; returns them."""
    steps = [make_step(run.run_id, seq, agent=agent, data={"n": seq}) for seq in seqs]
    if steps:
        await store.commit(make_commit(run, steps=steps, step_seq=seqs[-1]))
    return steps


async def history(
    store: CheckpointStorage, run_id: str, upto: int | None = None, after: int = 0
) -> list[StepRecord]:
    """The records ``load_history`` gives, blocks unpacked."""
    return step_records(await load_history(store, run_id, after, upto))


async def test_load_history_gives_every_record_in_order(store: CheckpointStorage) -> None:
    run = await create(store)
    steps = await commit_at_once(store, run, range(1, STEPS + 1))
    assert await store.load_steps(run.run_id) == steps
    assert await history(store, run.run_id) == steps
    for upto in (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 2 * BLOCK, STEPS - 1, STEPS, STEPS + 5):
        assert await history(store, run.run_id, upto) == steps[:upto], upto


async def test_steps_committed_one_by_one_read_back_the_same(store: CheckpointStorage) -> None:
    run = await create(store)
    steps = await commit_steps(store, run, range(1, BLOCK + 3))
    assert await store.load_steps(run.run_id) == steps
    assert await history(store, run.run_id) == steps


@pytest.mark.parametrize(
    ("after", "upto"),
    [(0, BLOCK), (BLOCK - 1, BLOCK + 1), (10, 2 * BLOCK - 10), (BLOCK, 2 * BLOCK), (300, None)],
)
async def test_load_steps_ranges_cut_across_blocks(
    store: CheckpointStorage, after: int, upto: int | None
) -> None:
    run = await create(store)
    steps = await commit_at_once(store, run, range(1, STEPS + 1))
    assert await store.load_steps(run.run_id, after=after, upto=upto) == steps[after:upto]
    assert await history(store, run.run_id, upto, after) == steps[after:upto]


@pytest.mark.parametrize("after", [0, 1, BLOCK - 1, BLOCK, BLOCK + 100, 2 * BLOCK, STEPS - 1])
async def test_a_truncation_anywhere_keeps_the_steps_up_to_it(
    store: CheckpointStorage, after: int
) -> None:
    run = await create(store)
    steps = await commit_at_once(store, run, range(1, STEPS + 1))
    redo = make_step(run.run_id, after + 1, agent="redo", data="again")
    await store.commit(make_commit(run, truncate_after=after, steps=[redo], step_seq=after + 1))
    assert await store.load_steps(run.run_id) == [*steps[:after], redo]
    assert await history(store, run.run_id) == [*steps[:after], redo]
    more = await commit_at_once(store, run, range(after + 2, STEPS + 1), agent="more")
    assert await store.load_steps(run.run_id) == [*steps[:after], redo, *more]
    assert await history(store, run.run_id) == [*steps[:after], redo, *more]


@pytest.mark.parametrize("seq", [1, BLOCK // 2, BLOCK, BLOCK + 1, STEPS])
async def test_a_step_written_again_replaces_it_in_every_read(
    store: CheckpointStorage, seq: int
) -> None:
    run = await create(store)
    steps = await commit_at_once(store, run, range(1, STEPS + 1))
    again = make_step(run.run_id, seq, agent="again", data="newer")
    await store.commit(make_commit(run, steps=[again]))
    expected = [again if step.seq == seq else step for step in steps]
    assert await store.load_steps(run.run_id) == expected
    assert await history(store, run.run_id) == expected
    assert await store.load_steps(run.run_id, after=seq - 1, upto=seq) == [again]


async def test_a_step_written_again_survives_a_truncation_after_it_in_its_block(
    store: CheckpointStorage,
) -> None:
    run = await create(store)
    steps = await commit_at_once(store, run, range(1, STEPS + 1))
    again = make_step(run.run_id, 100, agent="again", data="newer")
    await store.commit(make_commit(run, steps=[again]))
    await store.commit(make_commit(run, truncate_after=200))
    expected = [*steps[:99], again, *steps[100:200]]
    assert await store.load_steps(run.run_id) == expected
    assert await history(store, run.run_id) == expected


async def test_a_deleted_long_run_leaves_no_step_behind(store: CheckpointStorage) -> None:
    run = await create(store)
    await commit_at_once(store, run, range(1, STEPS + 1))
    assert await store.delete_run(run.run_id)
    assert await store.load_steps(run.run_id) == []
    assert await load_history(store, run.run_id) == []
    again = await create(store, run_id=run.run_id)
    steps = await commit_at_once(store, again, range(1, BLOCK + 1))
    assert await history(store, run.run_id) == steps


async def test_long_runs_side_by_side_stay_apart(store: CheckpointStorage) -> None:
    first, second = await create(store), await create(store)
    mine = await commit_at_once(store, first, range(1, STEPS + 1), agent="first")
    theirs = await commit_at_once(store, second, range(1, BLOCK + 1), agent="second")
    assert await history(store, first.run_id) == mine
    assert await history(store, second.run_id) == theirs
    assert await load_history(store, "no-such-run") == []
