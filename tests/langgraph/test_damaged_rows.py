"""A damaged saver row (torn: bytes cut off its end) is refused by name on every store:
get_tuple and list raise CheckpointCorruptedError naming the thread, the namespace (if
any), the checkpoint and the channel (or the pending write) whose row cannot be read,
never a value built from it."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from nestegg.checkpoint.stores.threads import BLOB, CHECKPOINT, WRITE, ThreadChange, ThreadRow
from nestegg.errors import CheckpointCorruptedError
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.rows import prefix_range
from tests.langgraph.conftest import SaverFactory, kinds, thread_config

TORN = "cannot be read: unexpected end of file"


def _stored(saver: NestEggSaver, ns: str) -> Any:
    """Thread ``t``: a checkpoint of channel ``items`` in namespace ``ns`` and a write."""
    cp = empty_checkpoint() | {"channel_values": {"items": ["a", "b"]}}
    cp["channel_versions"] = {"items": "1"}
    config = saver.put(thread_config("t", ns=ns), cp, {"step": 1}, {"items": "1"})
    saver.put_writes(config, [("items", ["c"])], "task-1")
    saver._run(saver._core.flush())
    return config


def _tear(saver: NestEggSaver, kind: str, part: str) -> None:
    """Cut 3 bytes off each ``kind`` row of thread ``t`` whose key holds ``part``; the
    saver forgets what it remembers of the thread (a new process reading the store)."""

    async def tear() -> None:
        store = saver.storage
        rows = await store.scan_thread_rows("t", kind, *prefix_range(""))
        torn = [ThreadRow(kind, r.key, r.body[:-3]) for r in rows if part in r.key]
        assert torn
        await store.apply_thread_change("t", ThreadChange(put=torn), 2.0)

    saver._run(tear())
    saver._core.forget("t")


CASES = {
    "channel value": (BLOB, "items", "channel 'items': the LangGraph channel value row"),
    "checkpoint": (CHECKPOINT, "", "the LangGraph checkpoint row"),
    "write": (WRITE, "task-1", "the write 0 of task 'task-1': the LangGraph write row"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("ns", ["", "sub:1"])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_torn_row_is_refused_naming_thread_checkpoint_and_channel(
    saver_factory: SaverFactory, ns: str, case: str
) -> None:
    saver = saver_factory()
    config = _stored(saver, ns)
    kind, part, what = CASES[case]
    _tear(saver, kind, part)
    checkpoint_id = config["configurable"]["checkpoint_id"]
    where = "LangGraph thread 't'" + (f", namespace {ns!r}" if ns else "")
    expected = f"{where}, checkpoint {checkpoint_id!r}, {what} {TORN}"
    if case == "checkpoint":
        expected = f"{where}, checkpoint {checkpoint_id!r}: {what} {TORN}"
    for read in (
        lambda: saver.get_tuple(config),
        lambda: saver.get_tuple(thread_config("t", ns=ns)),
        lambda: list(saver.list(thread_config("t", ns=ns))),
        lambda: list(saver.list(None)),
    ):
        with pytest.raises(CheckpointCorruptedError) as refused:
            read()
        assert str(refused.value) == expected


@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
async def test_the_async_reads_name_it_too(saver_factory: SaverFactory) -> None:
    saver = saver_factory()
    config = _stored(saver, "")
    _tear(saver, BLOB, "items")
    with pytest.raises(CheckpointCorruptedError, match=r"^LangGraph thread 't', checkpoint '"):
        await saver.aget_tuple(config)
    with pytest.raises(CheckpointCorruptedError, match="channel 'items': the LangGraph channel"):
        [item async for item in saver.alist(config)]
