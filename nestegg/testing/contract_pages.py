"""The store contract: ``list_runs(before=...)`` pages through runs, newest first, and the
checkpoints of many runs are listed as each run's are."""

from __future__ import annotations

import pytest

from nestegg.checkpoint.stores import base
from nestegg.checkpoint.stores.base import CheckpointListing, CheckpointStorage, checkpoints_of
from nestegg.constants import COMPLETED, FAILED
from nestegg.testing.builders import T0, commit_steps, create


async def _page_ids(store: CheckpointStorage, size: int, **filters: object) -> list[list[str]]:
    pages: list[list[str]] = []
    before = None
    while True:
        runs = await store.list_runs(limit=size, before=before, **filters)  # type: ignore[arg-type]
        if not runs:
            return pages
        pages.append([run.run_id for run in runs])
        before = (runs[-1].created_at, runs[-1].run_id)


async def test_pages_cover_every_run_once_in_order(store: CheckpointStorage) -> None:
    # Runs 0-2 share a creation time: the run id breaks the tie.
    for i in range(7):
        status = FAILED if i % 3 == 0 else COMPLETED
        await create(store, run_id=f"r{i}", created_at=T0 + max(i, 2), status=status)
    everything = [run.run_id for run in await store.list_runs()]
    assert everything == ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    assert await _page_ids(store, 3) == [["r6", "r5", "r4"], ["r3", "r2", "r1"], ["r0"]]
    assert await _page_ids(store, 2) == [["r6", "r5"], ["r4", "r3"], ["r2", "r1"], ["r0"]]
    assert await _page_ids(store, 2, statuses=[FAILED]) == [["r6", "r3"], ["r0"]]
    assert await _page_ids(store, 5, pipeline="nope") == []


async def test_a_page_after_a_deleted_run_continues_where_it_was(
    store: CheckpointStorage,
) -> None:
    for i in range(4):
        await create(store, run_id=f"r{i}", created_at=T0 + i)
    first = await store.list_runs(limit=2)
    await store.delete_run(first[-1].run_id)
    after = await store.list_runs(limit=2, before=(first[-1].created_at, first[-1].run_id))
    assert [run.run_id for run in after] == ["r1", "r0"]


async def test_checkpoints_of_many_runs_are_each_runs_listing(
    store: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = [await create(store, run_id=f"r{i}") for i in range(5)]
    for i, run in enumerate(runs):
        if i != 2:  # r2 has none
            await commit_steps(store, run, range(1, i + 2), checkpoints=True)
    ids = ["r4", "r0", "r2", "nope", "r3", "r1"]  # any order, one not stored
    each = [await store.list_checkpoints(run_id) for run_id in ids]
    assert [len(c) for c in each] == [5, 1, 0, 0, 4, 2]
    assert await checkpoints_of(store, ids) == each
    monkeypatch.setattr(base, "CHECKPOINT_LISTING_BATCH", 2)  # several reads, same answer
    assert await checkpoints_of(store, ids) == each
    assert await checkpoints_of(store, []) == []
    if isinstance(store, CheckpointListing):
        found = await store.list_checkpoints_of(ids)
        assert found == {i: c for i, c in zip(ids, each, strict=True) if c}
