"""The ThreadStore capability itself on every store: what one change does when it keeps and
replaces rows at once (the saver's commit of a checkpoint with its task's writes), which
changes move a thread's time, what a thread deleted leaves behind (nothing); and the saver's
``setup``."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from nestegg.checkpoint.stores.threads import (
    BLOB,
    CHECKPOINT,
    WRITE,
    ThreadChange,
    ThreadRow,
    ThreadStore,
)
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.rows import prefix_range
from tests.langgraph.conftest import SaverFactory, kinds, thread_entries

EVERY_BYTE = bytes(range(256)) * 4
"""A body no text encoding would carry unchanged."""


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_one_change_keeps_new_rows_and_replaces_put_rows(
    saver_factory: SaverFactory,
) -> None:
    store = saver_factory().storage
    await store.setup()
    first = ThreadChange(
        put=[ThreadRow(BLOB, "b", b"old blob")],
        put_new=[ThreadRow(WRITE, "w", b"first write")],
    )
    await store.apply_thread_change("t", first, 100.0)
    second = ThreadChange(
        put=[ThreadRow(BLOB, "b", EVERY_BYTE), ThreadRow(CHECKPOINT, "c", b"")],
        put_new=[ThreadRow(WRITE, "w", b"second write"), ThreadRow(WRITE, "x", EVERY_BYTE)],
    )
    await store.apply_thread_change("t", second, 101.0)

    low, high = prefix_range("")
    assert await store.scan_thread_rows("t", BLOB, low, high) == [ThreadRow(BLOB, "b", EVERY_BYTE)]
    assert await store.scan_thread_rows("t", CHECKPOINT, low, high) == [
        ThreadRow(CHECKPOINT, "c", b"")
    ]
    assert await store.scan_thread_rows("t", WRITE, low, high) == [
        ThreadRow(WRITE, "w", b"first write"),
        ThreadRow(WRITE, "x", EVERY_BYTE),
    ]


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_key_both_kept_and_replaced_in_one_change_ends_replaced(
    saver_factory: SaverFactory,
) -> None:
    """``put_new`` applies before ``put``: the row a change puts wins."""
    store = saver_factory().storage
    await store.setup()
    change = ThreadChange(
        put=[ThreadRow(WRITE, "w", b"put")],
        put_new=[ThreadRow(WRITE, "w", b"put_new"), ThreadRow(WRITE, "v", b"new")],
    )
    await store.apply_thread_change("t", change, 100.0)
    assert await store.get_thread_rows("t", WRITE, ["v", "w"]) == [
        ThreadRow(WRITE, "v", b"new"),
        ThreadRow(WRITE, "w", b"put"),
    ]
    [info] = await store.list_threads()
    assert (info.thread_id, info.rows) == ("t", 2)


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_long_thread_id_is_kept_listed_copied_and_deleted(
    saver_factory: SaverFactory,
) -> None:
    """Thread ids of any length (a file store names a log too long for a file name by a
    hash of its id, and lists it by the id its lines carry)."""
    store = saver_factory().storage
    await store.setup()
    short, long_ascii, long_utf8 = "t" * 125, "x" * 300, "é" * 200
    change = ThreadChange(put=[ThreadRow(CHECKPOINT, "c", EVERY_BYTE)])
    for thread_id in (short, long_ascii, long_utf8):
        await store.apply_thread_change(thread_id, change, 100.0)
    await store.copy_thread(long_ascii, long_ascii + "!", 101.0)
    listed = {info.thread_id: info.rows for info in await store.list_threads()}
    assert listed == {short: 1, long_ascii: 1, long_utf8: 1, long_ascii + "!": 1}
    assert await store.get_thread_rows(long_utf8, CHECKPOINT, ["c"]) == [
        ThreadRow(CHECKPOINT, "c", EVERY_BYTE)
    ]
    assert await store.delete_threads([long_ascii, long_utf8]) == 2
    assert {info.thread_id for info in await store.list_threads()} == {short, long_ascii + "!"}


async def _updated_at(store: ThreadStore, thread_id: str) -> float:
    [info] = [i for i in await store.list_threads() if i.thread_id == thread_id]
    return info.updated_at


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_change_that_only_deletes_leaves_the_thread_time_and_a_put_moves_it(
    saver_factory: SaverFactory,
) -> None:
    """The thread's time is its last write: the saver's ttl and ``threads prune
    --older-than`` read it, and a prune (deletes alone) must not make a thread new again."""
    store = saver_factory().storage
    await store.setup()
    rows = [ThreadRow(CHECKPOINT, key, b"c") for key in ("a", "b", "c")]
    await store.apply_thread_change("t", ThreadChange(put=rows), 1000.0)
    assert await _updated_at(store, "t") == 1000.0

    pruned = ThreadChange(delete=[(CHECKPOINT, "a", "c"), (BLOB, "", "z")])
    await store.apply_thread_change("t", pruned, 5000.0)
    assert [r.key for r in await store.scan_thread_rows("t", CHECKPOINT, "", "z")] == ["c"]
    assert await _updated_at(store, "t") == 1000.0
    await store.apply_thread_change("t", ThreadChange(), 5000.0)  # nothing at all
    assert await _updated_at(store, "t") == 1000.0

    await store.apply_thread_change("t", ThreadChange(put_new=[ThreadRow(WRITE, "w", b"")]), 6000.0)
    assert await _updated_at(store, "t") == 6000.0
    put_and_delete = ThreadChange(put=rows[:1], delete=[(CHECKPOINT, "c", "d")])
    await store.apply_thread_change("t", put_and_delete, 7000.0)
    assert await _updated_at(store, "t") == 7000.0


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_deleted_thread_leaves_no_entry_behind(saver_factory: SaverFactory) -> None:
    """delete_threads takes a thread's entry, its time with it, as well as its rows: the
    memory store kept the time of every thread it ever held."""
    store = saver_factory().storage
    await store.setup()
    change = ThreadChange(put=[ThreadRow(CHECKPOINT, "c", b"c"), ThreadRow(WRITE, "w", b"w")])
    for thread_id in ("t", "kept"):
        await store.apply_thread_change(thread_id, change, 1000.0)
    assert await store.delete_threads(["t", "t", "absent"]) == 1
    assert await thread_entries(store) == {"kept"}
    assert [info.thread_id for info in await store.list_threads()] == ["kept"]

    # a thread of writes alone (a run that failed before its first checkpoint) is one too
    writes = ThreadChange(put=[ThreadRow(WRITE, "w", b"w")])
    await store.apply_thread_change("writes", writes, 1000.0)
    assert await store.delete_threads(["writes"]) == 1
    assert await thread_entries(store) == {"kept"}


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_thread_its_deletes_empty_leaves_no_entry_behind(
    saver_factory: SaverFactory,
) -> None:
    """A change that only deletes and leaves the thread without rows (a prune, the values
    collected, delete_for_runs) takes its entry too: the saver's ttl and ``threads prune``
    go by the listing, which shows no empty thread, so an entry left would stay for ever."""
    store = saver_factory().storage
    await store.setup()
    rows = [
        ThreadRow(CHECKPOINT, "c", b"c"),
        ThreadRow(BLOB, "b", b"b"),
        ThreadRow(WRITE, "w", b"w"),
    ]
    for thread_id in ("t", "kept"):
        await store.apply_thread_change(thread_id, ThreadChange(put=rows), 1000.0)
    everything = [(kind, *prefix_range("")) for kind in (CHECKPOINT, BLOB)]
    await store.apply_thread_change("t", ThreadChange(delete=everything), 2000.0)
    assert await thread_entries(store) == {"t", "kept"}  # its write is left: still a thread

    await store.apply_thread_change("t", ThreadChange(delete=[(WRITE, "w", "x")]), 3000.0)
    await store.apply_thread_change("never", ThreadChange(delete=everything), 3000.0)
    await store.apply_thread_change("never", ThreadChange(), 3000.0)
    assert await thread_entries(store) == {"kept"}
    assert await store.delete_threads(["t", "never"]) == 0

    await store.apply_thread_change("t", ThreadChange(put_new=rows[:1]), 4000.0)
    listed = [(info.thread_id, info.updated_at, info.rows) for info in await store.list_threads()]
    assert listed == [("t", 4000.0, 1), ("kept", 1000.0, 3)]


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_setup_creates_the_thread_tables_before_any_thread_call(
    tmp_path: Path, asynchronous: bool
) -> None:
    db = tmp_path / "graph.db"
    saver = NestEggSaver.from_url(f"sqlite:///{db}")
    try:
        for _ in range(2):  # a second setup does nothing
            if asynchronous:
                await saver.asetup()
            else:
                saver.setup()
        with closing(sqlite3.connect(db)) as conn:
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert {"lg_threads", "lg_rows"} <= tables
    finally:
        await saver.aclose()
