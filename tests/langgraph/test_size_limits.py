"""NestEggSaver keeps to the stores' size limits on every store: a channel value, a
checkpoint or a write over RECORD_MAX_BYTES, or a checkpoint or a task's writes adding up
past COMMIT_MAX_BYTES, is refused with RecordTooLargeError before anything is sent, nothing
stored changes and the thread goes on; writes kept for the next checkpoint that would make
its commit too large are committed apart, each commit within the limit. (Small limits
stand in for the real ones.)"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from nestegg.checkpoint.stores.threads import ThreadChange
from nestegg.errors import RecordTooLargeError
from nestegg.langgraph import NestEggSaver, limits
from tests.langgraph.conftest import SaverFactory, kinds, seeded_saver, stored_rows, thread_config

RECORD_LIMIT = 4_000
COMMIT_LIMIT = 10_000


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "RECORD_MAX_BYTES", RECORD_LIMIT)
    monkeypatch.setattr(limits, "COMMIT_MAX_BYTES", COMMIT_LIMIT)


def _checkpoint(channels: dict[str, Any]) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = channels
    checkpoint["channel_versions"] = {name: "9" for name in channels}
    return checkpoint


def _latest(saver: NestEggSaver) -> Any:
    found = saver.get_tuple(thread_config("t"))
    assert found is not None
    return found


def _refused_put(saver: NestEggSaver, channels: dict[str, Any]) -> RecordTooLargeError:
    checkpoint = _checkpoint(channels)
    with pytest.raises(RecordTooLargeError) as refused:
        saver.put(_latest(saver).config, checkpoint, {}, checkpoint["channel_versions"])
    assert checkpoint["id"] in refused.value.path
    return refused.value


def _refused_writes(saver: NestEggSaver, writes: list[tuple[str, Any]]) -> RecordTooLargeError:
    with pytest.raises(RecordTooLargeError) as refused:
        saver.put_writes(_latest(saver).config, writes, "task-1")
    return refused.value


CASES = {
    "a channel value": (
        lambda saver: _refused_put(saver, {"big": "x" * 5_000}),
        "channel 'big' of checkpoint",
        RECORD_LIMIT,
    ),
    "a checkpoint": (
        lambda saver: _refused_put(saver, {c: c * 3_500 for c in "abc"}),
        "the commit of checkpoint",
        COMMIT_LIMIT,
    ),
    "a write": (
        lambda saver: _refused_writes(saver, [("items", "x" * 5_000)]),
        "the write to channel 'items' of task 'task-1' of thread 't'",
        RECORD_LIMIT,
    ),
    "a task's writes": (
        lambda saver: _refused_writes(saver, [(c, c * 3_500) for c in "abc"]),
        "the writes of task 'task-1' of thread 't'",
        COMMIT_LIMIT,
    ),
}


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_what_a_store_would_not_take_is_refused_before_anything_is_sent(
    saver_factory: SaverFactory, defer_writes: bool, case: str
) -> None:
    saver = seeded_saver(saver_factory, defer_writes)
    before = saver._run(stored_rows(saver.storage))
    refuse, path, limit = CASES[case]
    refused = refuse(saver)
    assert path in refused.path and (refused.limit, refused.size > limit) == (limit, True)
    assert f"over the {limit:,} bytes a store takes at once" in str(refused)
    saver._run(saver._core.flush())  # a deferred write would be committed now
    assert saver._run(stored_rows(saver.storage)) == before
    assert len(list(saver.list(None))) == 5


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_refused_checkpoint_leaves_the_next_one_of_its_channel_readable(
    saver_factory: SaverFactory,
) -> None:
    saver = seeded_saver(saver_factory, defer_writes=True)
    latest = _latest(saver)
    items = latest.checkpoint["channel_values"]["items"]
    refused = _refused_put(
        saver, {"items": [*items, "y" * 3_000], "a": "a" * 3_500, "b": "b" * 3_500}
    )
    assert refused.path.startswith("the commit of checkpoint")
    checkpoint = copy.deepcopy(latest.checkpoint)
    checkpoint["id"] = _checkpoint({})["id"]
    grown = [*items, "y" * 3_000, "z"]  # extends the refused value: stored as a delta
    checkpoint["channel_values"]["items"] = grown
    checkpoint["channel_versions"]["items"] = "99"
    saver.put(latest.config, checkpoint, {}, {"items": "99"})
    saver._core.latest.forget("t")  # read from the store, not from what the saver remembers
    assert _latest(saver).checkpoint["channel_values"]["items"] == grown


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_kept_writes_too_large_for_the_next_commit_are_committed_apart(
    saver_factory: SaverFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    saver = seeded_saver(saver_factory, defer_writes=True)
    parent = _latest(saver).config
    sizes: list[int] = []
    apply = saver.storage.apply_thread_change

    async def measured(thread_id: str, change: ThreadChange, now: float) -> None:
        sizes.append(limits.size_of([*change.put, *change.put_new]))
        await apply(thread_id, change, now)

    monkeypatch.setattr(saver.storage, "apply_thread_change", measured)
    for task in ("t1", "t2", "t3"):
        saver.put_writes(parent, [("a", "a" * 3_000), ("b", "b" * 500)], task)
    checkpoint = _checkpoint({"c": "c" * 3_000})
    saver.put(parent, checkpoint, {}, checkpoint["channel_versions"])
    assert len(sizes) == 3 and all(size <= COMMIT_LIMIT for size in sizes)  # 2 + 1 writes
    written = saver.get_tuple(parent)
    assert written is not None
    tasks = sorted(task for task, _, _ in written.pending_writes or [])
    assert tasks == ["t1", "t1", "t2", "t2", "t3", "t3"]
    assert _latest(saver).checkpoint["channel_values"]["c"] == "c" * 3_000
