"""What the pages read: the forks of a run are found among newer runs, within a bound."""

from __future__ import annotations

import pytest

from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.cli import reading
from nestegg.testing.builders import create
from nestegg.ui import queries


async def _family(store: MemoryCheckpointStorage, run_id: str) -> dict[str, object]:
    run = await reading.get_run(store, run_id)
    return await queries.family(store, reading.run_row(run, None, run.updated_at))


async def test_forks_are_found_among_newer_runs_and_older_ones_are_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryCheckpointStorage()
    await create(store, run_id="older", created_at=1.0, parent_run="parent")  # impossible
    await create(store, run_id="parent", created_at=2.0)
    await create(store, run_id="fork", created_at=3.0, parent_run="parent", parent_checkpoint="c")
    for i in range(30):
        await create(store, run_id=f"newer-{i:02d}", created_at=4.0 + i)
    found = await _family(store, "parent")
    assert found["children"] == [{"run_id": "fork", "checkpoint": "c", "status": "running"}]
    assert found["complete"] is True
    monkeypatch.setattr(queries, "FORK_SCAN", 10)
    monkeypatch.setattr(queries, "FORK_SCAN_PAGE", 5)
    capped = await _family(store, "parent")
    assert capped["children"] == [] and capped["complete"] is False


async def test_ancestors_are_listed_oldest_first_and_a_deleted_one_ends_the_chain() -> None:
    store = MemoryCheckpointStorage()
    await create(store, run_id="a", created_at=1.0, parent_run="gone", parent_checkpoint="g")
    await create(store, run_id="b", created_at=2.0, parent_run="a", parent_checkpoint="ca")
    await create(store, run_id="c", created_at=3.0, parent_run="b", parent_checkpoint="cb")
    found = await _family(store, "c")
    assert found["ancestors"] == [
        {"run_id": "gone", "checkpoint": "g", "exists": False},
        {"run_id": "a", "checkpoint": "ca", "exists": True},
        {"run_id": "b", "checkpoint": "cb", "exists": True},
    ]
