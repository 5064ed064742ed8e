"""What the pages read: the forks of a run, listed by the store's index of them (or, in a
store without one, found among newer runs, within a bound)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, cast

import pytest

from nestegg.checkpoint.records import Owner, RunRecord
from nestegg.checkpoint.stores import base
from nestegg.checkpoint.stores.base import CheckpointStorage, ForkListing
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.views import to_datetime
from nestegg.checkpoint.waiting import store_signal
from nestegg.cli import reading
from nestegg.testing.builders import commit_steps, create
from nestegg.ui import queries
from tests.ui.pipelines import SIGNAL, start_waiting


class _WithoutForkListing:
    """A memory store seen as a store that keeps no index of forks (no ``list_forks``):
    only what the family of a run reads."""

    def __init__(self) -> None:
        self.inner = MemoryCheckpointStorage()

    async def create_run(self, run: RunRecord) -> None:
        await self.inner.create_run(run)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self.inner.get_run(run_id)

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        return await self.inner.list_runs(**filters)


async def _family(store: Any, run_id: str) -> dict[str, object]:
    run = await reading.get_run(store, run_id)
    return await queries.family(store, reading.run_row(run, None, run.updated_at), 60.0)


async def _parent_fork_and_newer_runs(store: Any) -> None:
    await create(store, run_id="older", created_at=1.0, parent_run="parent")  # impossible
    await create(store, run_id="parent", created_at=2.0)
    await create(store, run_id="fork", created_at=3.0, parent_run="parent", parent_checkpoint="c")
    for i in range(30):
        await create(store, run_id=f"newer-{i:02d}", created_at=4.0 + i)


def _child(run_id: str, checkpoint: str | None, at: float) -> dict[str, object]:
    """A fork as the family lists it: stored by ``create``, running with no owner, queued."""
    return {"run_id": run_id, "checkpoint": checkpoint, "status": "running",
            "interrupted": False, "queued": True, "created_at": to_datetime(at),
            "shown_status": "queued"}  # fmt: skip


async def test_a_store_that_lists_forks_gives_every_one_however_many_newer_runs_there_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryCheckpointStorage()
    assert isinstance(store, ForkListing)
    await _parent_fork_and_newer_runs(store)
    await create(store, run_id="fork-2", created_at=50.0, parent_run="parent")
    gone = Owner(host="elsewhere", pid=1, started="0")  # its lease ran out at 40: interrupted
    await create(store, run_id="fork-3", created_at=51.0, parent_run="parent", owner=gone,
                 lease_until=40.0)  # fmt: skip
    monkeypatch.setattr(queries, "FORK_SCAN", 10)  # a bound only a scan has
    found = await _family(store, "parent")
    interrupted = _child("fork-3", None, 51.0)
    interrupted.update(queued=False, interrupted=True, shown_status="interrupted")
    assert found["children"] == [
        interrupted,
        _child("fork-2", None, 50.0),
        _child("fork", "c", 3.0),
        _child("older", None, 1.0),
    ]
    assert found["complete"] is True


async def test_forks_are_found_among_newer_runs_and_older_ones_are_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = cast(CheckpointStorage, _WithoutForkListing())
    assert not isinstance(store, ForkListing)
    await _parent_fork_and_newer_runs(store)
    found = await _family(store, "parent")
    assert found["children"] == [_child("fork", "c", 3.0)]
    assert found["complete"] is True
    monkeypatch.setattr(queries, "FORK_SCAN", 10)
    monkeypatch.setattr(base, "FORK_SCAN_PAGE", 5)
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


class _CountingStore(MemoryCheckpointStorage):
    """A memory store that counts its reads of events and signals."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: Counter[str] = Counter()

    async def read_events(self, *args: Any, **kwargs: Any) -> Any:
        self.reads["events"] += 1
        return await super().read_events(*args, **kwargs)

    async def read_signals(self, *args: Any, **kwargs: Any) -> Any:
        self.reads["signals"] += 1
        return await super().read_signals(*args, **kwargs)


async def test_the_runs_watch_reads_a_wait_once_and_its_signal_until_stored() -> None:
    store = _CountingStore()
    for run_id in ("a", "b"):
        await start_waiting(store, run_id, nap=False)
    store.reads.clear()
    watch = queries.RunsWatch(store, status=None, pipeline=None)
    first = await watch.signature(time.time())
    assert queries.over_in(first) == []
    assert store.reads == {"events": 2, "signals": 2}  # what each waits for, once
    await store_signal(store, "a", SIGNAL, "yes", replace=False, clock=time.time)
    store.reads.clear()
    second = await watch.signature(time.time())
    assert second != first and queries.over_in(second) == ["a"]
    assert store.reads == {"signals": 2}
    store.reads.clear()
    assert await watch.signature(time.time()) == second
    assert store.reads == {"signals": 1}  # a stored signal stays: only b's is looked for
    assert queries.waits_token(["a"]) == queries.waits_token(queries.over_in(second))
    assert queries.waits_token([]) != queries.waits_token(["a"])


async def test_the_run_page_lists_a_step_whose_record_is_missing() -> None:
    store = MemoryCheckpointStorage()
    run = await create(store, run_id="gap")
    await commit_steps(store, run, range(1, 4))
    del store._runs["gap"].steps[3]  # the record of the last step the run counts is gone
    page = await queries.run_window(store, "gap", None, time.time())
    assert [(s["seq"], s["outcome"] == "missing") for s in page["steps"]] == [
        (1, False),
        (2, False),
        (3, True),
    ]
