"""The store contract: the runs forked from a run, listed newest first by a store that keeps
an index of them (``ForkListing``), and found by :func:`forks_of` in any store."""

from __future__ import annotations

from typing import Any

import pytest

from nestegg.checkpoint.stores import base
from nestegg.checkpoint.stores.base import CheckpointStorage, ForkListing, forks_of
from nestegg.constants import COMPLETED, FAILED
from nestegg.testing.builders import T0, create
from nestegg.testing.fixtures import StoreFactory


async def _fork(
    store: CheckpointStorage, run_id: str, parent: str, at: float, **fields: Any
) -> None:
    """Create run ``run_id`` (of pipeline ``a`` unless ``fields`` say) forked from ``parent``
    at T0 + ``at``."""
    fields.setdefault("pipeline", "a")
    fields.setdefault("parent_checkpoint", f"c-{run_id}")
    await create(store, run_id=run_id, created_at=T0 + at, parent_run=parent, **fields)


async def _listed(store: CheckpointStorage, run_id: str, limit: int | None = None) -> list[str]:
    assert isinstance(store, ForkListing)
    return [run.run_id for run in await store.list_forks(run_id, limit)]


async def _found(store: CheckpointStorage, run_id: str, **options: Any) -> tuple[list[str], bool]:
    run = await store.get_run(run_id)
    assert run is not None
    forks, complete = await forks_of(
        store, run_id, pipeline=run.pipeline, created_at=run.created_at, **options
    )
    return [fork.run_id for fork in forks], complete


async def _family(store: CheckpointStorage) -> None:
    """Run ``p`` of pipeline ``a`` with forks f1 to f4 (f2 and f3 created at the same time),
    a fork ``g`` of f1, and runs that are no fork of ``p``: ``q`` of ``a``, ``b1`` of ``b``,
    ``h`` forked from ``q``."""
    await create(store, run_id="p", pipeline="a", created_at=T0 + 1)
    await create(store, run_id="q", pipeline="a", created_at=T0 + 2)
    await _fork(store, "f1", "p", 3, status=COMPLETED)
    await _fork(store, "f3", "p", 4, status=FAILED)
    await _fork(store, "f2", "p", 4)
    await _fork(store, "g", "f1", 5)
    await create(store, run_id="b1", pipeline="b", created_at=T0 + 6)
    await _fork(store, "h", "q", 7)
    await _fork(store, "f4", "p", 8)


async def test_forks_are_found_newest_first_and_forks_of_forks_under_their_own_parent(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    await _family(store)
    every = (["f4", "f3", "f2", "f1"], True)
    assert await _found(store, "p") == every
    assert await _found(store, "f1") == (["g"], True)
    assert await _found(store, "q") == (["h"], True)
    assert await _found(store, "g") == ([], True)
    assert await _found(await store_factory(), "p") == every  # another handle, the same
    if not isinstance(store, ForkListing):
        return
    assert await _listed(store, "p") == ["f4", "f3", "f2", "f1"]
    assert [await _listed(store, r) for r in ("f1", "q", "g", "b1")] == [["g"], ["h"], [], []]
    forks = await store.list_forks("p")
    assert forks == [await store.get_run(run_id) for run_id in ("f4", "f3", "f2", "f1")]
    assert await _listed(store, "never-stored") == []


async def test_a_limit_gives_the_newest_forks(store: CheckpointStorage) -> None:
    if not isinstance(store, ForkListing):
        pytest.skip("the store keeps no index of forks (no ForkListing)")
    await _family(store)
    assert await _listed(store, "p", 1) == ["f4"]
    assert await _listed(store, "p", 3) == ["f4", "f3", "f2"]
    assert await _listed(store, "p", 4) == await _listed(store, "p", 100)
    assert await _listed(store, "p", 0) == []


async def test_a_fork_of_another_pipeline_is_listed_by_its_parent(
    store: CheckpointStorage,
) -> None:
    # Clutch.fork keeps the parent's pipeline; an imported run may name any parent.
    if not isinstance(store, ForkListing):
        pytest.skip("the store keeps no index of forks (no ForkListing)")
    await _family(store)
    await _fork(store, "elsewhere", "p", 9, pipeline="b")
    assert await _listed(store, "p") == ["elsewhere", "f4", "f3", "f2", "f1"]
    assert await _listed(store, "b1") == []


async def test_deleted_and_expired_forks_are_no_longer_found(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    await _family(store)
    assert await store.delete_run("f3")
    assert await store.expire_runs([COMPLETED], T0 + 100, pipeline="a") == ["f1"]
    assert await _found(store, "p") == (["f4", "f2"], True)
    await create(store, run_id="f3", pipeline="a", created_at=T0 + 10)  # its id again, no fork
    assert await _found(store, "p") == (["f4", "f2"], True)
    await _fork(store, "f1", "p", 11)  # its id again, a fork again
    assert await _found(await store_factory(), "p") == (["f1", "f4", "f2"], True)
    if isinstance(store, ForkListing):
        assert await _listed(store, "p") == ["f1", "f4", "f2"]
        assert await _listed(store, "f1") == ["g"]  # g still names the deleted f1


async def test_forks_of_a_deleted_run_still_name_it(store: CheckpointStorage) -> None:
    if not isinstance(store, ForkListing):
        pytest.skip("the store keeps no index of forks (no ForkListing)")
    await _family(store)
    assert await store.delete_run("p")
    assert await _listed(store, "p") == ["f4", "f3", "f2", "f1"]
    assert await _listed(store, "f1") == ["g"]
    for run_id in ("f4", "f3", "f2", "f1"):
        assert await store.delete_run(run_id)
    assert await _listed(store, "p") == []
    assert await _listed(store, "f1") == ["g"]


async def test_forks_are_found_alike_page_by_page_and_a_scan_cut_short_says_so(
    store: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _family(store)
    for i in range(5):  # newer runs of the pipeline than every fork
        await create(store, run_id=f"later-{i}", pipeline="a", created_at=T0 + 20 + i)
    monkeypatch.setattr(base, "FORK_SCAN_PAGE", 2)  # several pages, the same forks
    assert await _found(store, "p") == (["f4", "f3", "f2", "f1"], True)
    capped = await _found(store, "p", scan=6)
    if isinstance(store, ForkListing):  # an index lists them all within the scan
        assert capped == (["f4", "f3", "f2", "f1"], True)
        assert await _found(store, "p", scan=4) == (["f4", "f3", "f2", "f1"], True)
        assert await _found(store, "p", scan=3) == (["f4", "f3", "f2"], False)
    else:  # the 6 newest runs of the pipeline: the 5 later ones and f4
        assert capped == (["f4"], False)
