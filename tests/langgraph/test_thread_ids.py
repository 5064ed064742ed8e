"""The thread ids and namespaces NestEggSaver refuses, on every store: each method that
reads or writes a thread refuses the same ids (empty, or holding a NUL or a lone surrogate,
which no store keeps) and namespaces (those characters, and the row keys' separator) with
one InvalidIdentifierError naming where the id came from and the character, before anything
is written (nothing stored changes); other control characters are kept, by every store.
Deleting and pruning take any id: a thread an older version stored under such an id goes;
reading and copying from it take its id too, while the store holds it, so its checkpoints
can be moved out; writing to it is refused."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from nestegg.checkpoint.stores.threads import CHECKPOINT, ThreadChange
from nestegg.errors import InvalidIdentifierError, StorageError
from nestegg.langgraph import NestEggSaver
from tests.langgraph.conftest import SaverFactory, kinds, seeded_saver, stored_rows, thread_config
from tests.langgraph.graphs import build_loop, loop_config

KEY = "config['configurable']['thread_id']"
NS_KEY = "config['configurable']['checkpoint_ns']"
BAD_IDS = {
    "": "is empty: a LangGraph thread needs a non-empty thread id",
    "a\0b": "'a\\x00b' holds a NUL character (U+0000) at index 1: no store can keep that thread id",
    "ab\ud800": "'ab\\ud800' holds a lone surrogate (U+D800) at index 2, which is not text: "
    "no store can keep that thread id",
}
BAD_NAMESPACES = {
    "n\0s": "'n\\x00s' holds a NUL character (U+0000) at index 1",
    "n\x1fs": "'n\\x1fs' holds U+001F at index 1, the separator of the parts of a row key",
    "\udc80": "'\\udc80' holds a lone surrogate (U+DC80) at index 0, which is not text",
}


Call = Callable[[NestEggSaver, str], object]
SYNC_CALLS: dict[str, tuple[Call, str]] = {
    "put": (lambda s, t: s.put(thread_config(t), empty_checkpoint(), {}, {}), KEY),
    "put_writes": (lambda s, t: s.put_writes(thread_config(t, "c"), [("items", [1])], "task"), KEY),
    "get_tuple": (lambda s, t: s.get_tuple(thread_config(t)), KEY),
    "list": (lambda s, t: list(s.list(thread_config(t))), KEY),
    "copy from": (lambda s, t: s.copy_thread(t, "t"), "copy_thread's source_thread_id"),
    "copy into": (lambda s, t: s.copy_thread("t", t), "copy_thread's target_thread_id"),
}
AsyncCall = Callable[[NestEggSaver, str], Awaitable[object]]


async def _alist(saver: NestEggSaver, thread_id: str) -> list[Any]:
    return [item async for item in saver.alist(thread_config(thread_id))]


ASYNC_CALLS: dict[str, tuple[AsyncCall, str]] = {
    "aput": (lambda s, t: s.aput(thread_config(t), empty_checkpoint(), {}, {}), KEY),
    "aput_writes": (
        lambda s, t: s.aput_writes(thread_config(t, "c"), [("items", [1])], "task"),
        KEY,
    ),
    "aget_tuple": (lambda s, t: s.aget_tuple(thread_config(t)), KEY),
    "alist": (_alist, KEY),
    "acopy from": (lambda s, t: s.acopy_thread(t, "t"), "copy_thread's source_thread_id"),
    "acopy into": (lambda s, t: s.acopy_thread("t", t), "copy_thread's target_thread_id"),
}


@pytest.mark.parametrize("bad", list(BAD_IDS), ids=["empty", "nul", "surrogate"])
@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_bad_thread_id_is_refused_by_every_method_and_nothing_changes(
    saver_factory: SaverFactory, defer_writes: bool, bad: str
) -> None:
    saver = seeded_saver(saver_factory, defer_writes)
    before = saver._run(stored_rows(saver.storage))
    for name, (call, where) in SYNC_CALLS.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            call(saver, bad)
        assert str(refused.value) == f"{where} {BAD_IDS[bad]}", name
        saver._run(saver._core.flush())  # a deferred write would be committed now
        assert saver._run(stored_rows(saver.storage)) == before, name
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == ["t"] * 5


NS_CALLS: dict[str, Call] = {
    "put": lambda s, ns: s.put(thread_config("t", ns=ns), empty_checkpoint(), {}, {}),
    "put_writes": lambda s, ns: s.put_writes(thread_config("t", "c", ns), [("items", [1])], "task"),
    "get_tuple": lambda s, ns: s.get_tuple(thread_config("t", ns=ns)),
    "list": lambda s, ns: list(s.list(thread_config("t", ns=ns))),
    "list every thread": lambda s, ns: list(s.list({"configurable": {"checkpoint_ns": ns}})),
}


@pytest.mark.parametrize("bad", list(BAD_NAMESPACES), ids=["nul", "separator", "surrogate"])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_bad_namespace_is_refused_by_every_method_and_nothing_changes(
    saver_factory: SaverFactory, bad: str
) -> None:
    saver = seeded_saver(saver_factory, True)
    before = saver._run(stored_rows(saver.storage))
    for name, call in NS_CALLS.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            call(saver, bad)
        assert str(refused.value) == (
            f"{NS_KEY} {BAD_NAMESPACES[bad]}: no store can keep that checkpoint namespace"
        ), name
        saver._run(saver._core.flush())
        assert saver._run(stored_rows(saver.storage)) == before, name
    assert len(list(saver.list(None))) == 5  # the store still reads whole


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_other_control_characters_are_kept_by_every_store(saver_factory: SaverFactory) -> None:
    thread_id, ns = "tab\tline\nesc\x1b[31m\x7f\x85", "sub\x07ns"
    saver = saver_factory()
    saver.put(thread_config(thread_id, ns=ns), empty_checkpoint(), {}, {})
    found = saver.get_tuple(thread_config(thread_id, ns=ns))
    assert found is not None and found.config["configurable"]["checkpoint_ns"] == ns
    listed = [t.config["configurable"] for t in saver.list(None)]
    assert [(c["thread_id"], c["checkpoint_ns"]) for c in listed] == [(thread_id, ns)]
    saver.copy_thread(thread_id, "copy")
    saver.delete_thread(thread_id)
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == ["copy"]


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_an_empty_thread_id_is_refused_by_every_async_method_and_nothing_changes(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    await saver.aput(thread_config("t"), empty_checkpoint(), {}, {})
    before = await saver._arun(stored_rows(saver.storage))
    for name, (call, where) in ASYNC_CALLS.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            await call(saver, "")
        assert str(refused.value).startswith(f"{where} is empty"), name
        assert isinstance(refused.value, ValueError), name  # as LangGraph's callers expect
        await saver._arun(saver._core.flush())  # a deferred write would be committed now
        assert await saver._arun(stored_rows(saver.storage)) == before, name


@pytest.mark.parametrize("saver_factory", kinds("memory"), indirect=True)
def test_a_config_without_a_thread_id_is_refused_naming_the_key(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    for config in ({"configurable": {"checkpoint_ns": ""}}, {}):
        with pytest.raises(InvalidIdentifierError) as refused:
            saver.put(config, empty_checkpoint(), {}, {})  # type: ignore[arg-type]
        assert str(refused.value) == f"{KEY} is missing: name the LangGraph thread"
    assert list(saver.list(None)) == []


LEGACY_IDS = {"": "empty", "a\0b": "nul", "ab\ud800": "surrogate"}
LEGACY = pytest.mark.parametrize("legacy", list(LEGACY_IDS), ids=list(LEGACY_IDS.values()))
"""Each refused id a thread an older version wrote may have."""


async def _stored_under(saver: NestEggSaver, thread_id: str) -> bool:
    """Move thread ``t``'s rows to ``thread_id`` through the store's own thread API, as an
    older version wrote them; False if the store cannot hold that id."""
    store = saver.storage
    rows = [row for rows in (await stored_rows(store)).values() for row in rows]
    try:
        await store.apply_thread_change(thread_id, ThreadChange(put=rows), 1.0)
    except (StorageError, UnicodeEncodeError):  # PostgreSQL: NUL; all but memory: surrogates
        return False
    await store.delete_threads(["t"])
    saver._core.forget("t")  # what the saver remembers of ``t`` is gone with it
    return True


def _threads(saver: NestEggSaver) -> list[str]:
    return [info.thread_id for info in saver._run(saver.storage.list_threads())]


@LEGACY
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_stored_thread_of_a_refused_id_is_pruned_and_deleted(
    saver_factory: SaverFactory, legacy: str
) -> None:
    saver = seeded_saver(saver_factory, True)
    held = saver._run(_stored_under(saver, legacy))
    build_loop(saver, 1).invoke({"items": [], "turn": 0}, loop_config("t", 1))
    saver.prune(_threads(saver))  # every thread, as `nestegg threads prune` does
    assert sorted(_threads(saver)) == sorted(["t", legacy] if held else ["t"])
    if held:
        rows = saver._run(stored_rows(saver.storage))[legacy]
        assert len([row for row in rows if row.kind == CHECKPOINT]) == 1
    saver.delete_thread(legacy)
    assert _threads(saver) == ["t"]
    saver.prune(["t", legacy], strategy="delete")
    assert _threads(saver) == []


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_stored_thread_of_an_empty_id_is_deleted_and_pruned_by_async_methods(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    for checkpoint_id in ("c1", "c2"):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = checkpoint_id
        await saver.aput(thread_config("t"), checkpoint, {}, {})
    assert await saver._arun(_stored_under(saver, ""))
    await saver.aprune([""])
    rows = (await saver._arun(stored_rows(saver.storage)))[""]
    assert [row.key.split("\x1f")[-1] for row in rows if row.kind == CHECKPOINT] == ["c2"]
    await saver.adelete_thread("")
    assert await saver._arun(stored_rows(saver.storage)) == {}
    await saver.aprune([""], strategy="delete")  # absent: nothing to do


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
@LEGACY
def test_a_stored_thread_of_a_refused_id_is_read_and_copied_out_but_not_written(
    legacy: str, saver_factory: SaverFactory
) -> None:
    """So its checkpoints can be moved to a thread of an id taken, then it deleted."""
    saver = seeded_saver(saver_factory, True)
    newest = saver.get_tuple(thread_config("t"))
    assert newest is not None
    if not saver._run(_stored_under(saver, legacy)):  # this store cannot hold that id
        with pytest.raises(InvalidIdentifierError):  # so no thread of it: refused as before
            saver.get_tuple(thread_config(legacy))
        return
    found = saver.get_tuple(thread_config(legacy))
    assert found is not None and found.checkpoint == newest.checkpoint
    assert found.config["configurable"]["thread_id"] == legacy
    assert len(list(saver.list(thread_config(legacy)))) == 5
    saver.copy_thread(legacy, "moved")
    copied = saver.get_tuple(thread_config("moved"))
    assert copied is not None and copied.checkpoint == newest.checkpoint
    before = saver._run(stored_rows(saver.storage))
    for name in ("put", "put_writes", "copy into"):
        call, where = SYNC_CALLS[name]
        with pytest.raises(InvalidIdentifierError) as refused:
            call(saver, legacy)
        assert str(refused.value).startswith(where), name
    saver._run(saver._core.flush())
    assert saver._run(stored_rows(saver.storage)) == before
    saver.delete_thread(legacy)
    assert _threads(saver) == ["moved"]
    with pytest.raises(InvalidIdentifierError):  # no such thread now: refused as before
        saver.get_tuple(thread_config(legacy))


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_stored_thread_of_an_empty_id_is_read_and_copied_out_by_async_methods(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    checkpoint = empty_checkpoint()
    checkpoint["id"] = "c1"
    await saver.aput(thread_config("t"), checkpoint, {}, {})
    assert await saver._arun(_stored_under(saver, ""))
    found = await saver.aget_tuple(thread_config(""))
    assert found is not None and found.checkpoint["id"] == "c1"
    assert [t.checkpoint["id"] for t in await _alist(saver, "")] == ["c1"]
    await saver.acopy_thread("", "moved")
    assert [t.checkpoint["id"] for t in await _alist(saver, "moved")] == ["c1"]
    with pytest.raises(InvalidIdentifierError):
        await saver.aput(thread_config(""), checkpoint, {}, {})
