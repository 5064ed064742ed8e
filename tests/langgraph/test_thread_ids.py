"""The thread ids NestEggSaver refuses, on every store: each method that names a thread
refuses the same ids with one InvalidIdentifierError naming where the id came from, before
anything is written (nothing stored changes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from nestegg.checkpoint.stores.threads import ROW_KINDS, ThreadStore
from nestegg.errors import InvalidIdentifierError
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.rows import prefix_range
from tests.langgraph.conftest import SaverFactory, kinds
from tests.langgraph.graphs import build_loop, loop_config

KEY = "config['configurable']['thread_id']"


def _config(thread_id: str, checkpoint_id: str | None = None) -> Any:
    conf = {"thread_id": thread_id, "checkpoint_ns": ""}
    return {"configurable": conf | ({"checkpoint_id": checkpoint_id} if checkpoint_id else {})}


async def _stored(store: ThreadStore) -> dict[str, list[Any]]:
    """Every thread with every row of it."""
    stored = {}
    for info in await store.list_threads():
        rows = [
            row
            for kind in ROW_KINDS
            for row in await store.scan_thread_rows(info.thread_id, kind, *prefix_range(""))
        ]
        stored[info.thread_id] = rows
    return stored


Call = Callable[[NestEggSaver, str], object]
SYNC_CALLS: dict[str, tuple[Call, str]] = {
    "put": (lambda s, t: s.put(_config(t), empty_checkpoint(), {}, {}), KEY),
    "put_writes": (lambda s, t: s.put_writes(_config(t, "c"), [("items", [1])], "task"), KEY),
    "get_tuple": (lambda s, t: s.get_tuple(_config(t)), KEY),
    "list": (lambda s, t: list(s.list(_config(t))), KEY),
    "delete_thread": (lambda s, t: s.delete_thread(t), "delete_thread's thread_id"),
    "copy from": (lambda s, t: s.copy_thread(t, "t"), "copy_thread's source_thread_id"),
    "copy into": (lambda s, t: s.copy_thread("t", t), "copy_thread's target_thread_id"),
    "prune": (lambda s, t: s.prune(["t", t]), "prune's thread_ids[1]"),
}
AsyncCall = Callable[[NestEggSaver, str], Awaitable[object]]


async def _alist(saver: NestEggSaver, thread_id: str) -> list[Any]:
    return [item async for item in saver.alist(_config(thread_id))]


ASYNC_CALLS: dict[str, tuple[AsyncCall, str]] = {
    "aput": (lambda s, t: s.aput(_config(t), empty_checkpoint(), {}, {}), KEY),
    "aput_writes": (lambda s, t: s.aput_writes(_config(t, "c"), [("items", [1])], "task"), KEY),
    "aget_tuple": (lambda s, t: s.aget_tuple(_config(t)), KEY),
    "alist": (_alist, KEY),
    "adelete_thread": (lambda s, t: s.adelete_thread(t), "delete_thread's thread_id"),
    "acopy from": (lambda s, t: s.acopy_thread(t, "t"), "copy_thread's source_thread_id"),
    "acopy into": (lambda s, t: s.acopy_thread("t", t), "copy_thread's target_thread_id"),
    "aprune": (lambda s, t: s.aprune(["t", t]), "prune's thread_ids[1]"),
}


def _seeded(saver_factory: SaverFactory, defer_writes: bool) -> NestEggSaver:
    """A saver whose store holds thread ``t``: five checkpoints (prune would drop four)."""
    saver = saver_factory(defer_writes=defer_writes)
    build_loop(saver, 3).invoke({"items": [], "turn": 0}, loop_config("t", 3))
    return saver


@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_an_empty_thread_id_is_refused_by_every_method_and_nothing_changes(
    saver_factory: SaverFactory, defer_writes: bool
) -> None:
    saver = _seeded(saver_factory, defer_writes)
    before = saver._run(_stored(saver.storage))
    for name, (call, where) in SYNC_CALLS.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            call(saver, "")
        assert str(refused.value) == (
            f"{where} is empty: a LangGraph thread needs a non-empty thread id"
        ), name
        saver._run(saver._core.flush())  # a deferred write would be committed now
        assert saver._run(_stored(saver.storage)) == before, name
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == ["t"] * 5


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_an_empty_thread_id_is_refused_by_every_async_method_and_nothing_changes(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    await saver.aput(_config("t"), empty_checkpoint(), {}, {})
    before = await saver._arun(_stored(saver.storage))
    for name, (call, where) in ASYNC_CALLS.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            await call(saver, "")
        assert str(refused.value).startswith(f"{where} is empty"), name
        assert isinstance(refused.value, ValueError), name  # as LangGraph's callers expect
        await saver._arun(saver._core.flush())  # a deferred write would be committed now
        assert await saver._arun(_stored(saver.storage)) == before, name


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
