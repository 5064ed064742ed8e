"""The other ids NestEggSaver stores, refused as thread ids and namespaces are, on every
store: a checkpoint id (of a config, of ``before``, of a checkpoint), a channel name (of a
write, of ``new_versions``, of ``channel_versions``), a channel version, a task id and a
task path, with one InvalidIdentifierError naming where the id came from, the id and the
character, before anything is written (nothing stored changes).

NUL and lone surrogates are refused in all of them (PostgreSQL keeps no NUL, no store but
the memory one keeps a lone surrogate); U+001F, the row keys' separator, in those a read
splits a row key at (checkpoint ids, channels, versions): a checkpoint id holding it made
its thread unreadable and its writes read as another checkpoint's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from nestegg.errors import InvalidIdentifierError
from nestegg.langgraph import NestEggSaver
from tests.langgraph.conftest import (
    SaverFactory,
    kinds,
    seeded_saver,
    stored_rows,
    thread_config,
)

CID = "config['configurable']['checkpoint_id']"
BAD = {
    "a\0b": "'a\\x00b' holds a NUL character (U+0000) at index 1",
    "a\x1fb": "'a\\x1fb' holds U+001F at index 1, the separator of the parts of a row key",
    "ab\ud800": "'ab\\ud800' holds a lone surrogate (U+D800) at index 2, which is not text",
}


def _checkpoint(
    checkpoint_id: str = "c9", versions: dict[str, Any] | None = None, **values: Any
) -> Checkpoint:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint_id
    checkpoint["channel_values"] = values
    checkpoint["channel_versions"] = versions if versions is not None else {}
    return checkpoint


# name -> (method, its arguments given the bad text, where, what, refused for U+001F)
Args = Callable[[str], tuple[Any, ...]]
CALLS: dict[str, tuple[str, Args, str, str, bool]] = {
    "put's config": (
        "put",
        lambda b: (thread_config("t", b), _checkpoint(), {}, {}),
        CID,
        "checkpoint id",
        True,
    ),
    "put's checkpoint": (
        "put",
        lambda b: (thread_config("t"), _checkpoint(b), {}, {}),
        "checkpoint['id']",
        "checkpoint id",
        True,
    ),
    "new_versions channel": (
        "put",
        lambda b: (thread_config("t"), _checkpoint(items=[1], **{b: [2]}), {}, {"items": 9, b: 9}),
        "a channel of new_versions",
        "channel name",
        True,
    ),
    "new_versions version": (
        "put",
        lambda b: (thread_config("t"), _checkpoint(items=[1]), {}, {"items": b}),
        "new_versions['items']",
        "channel version",
        True,
    ),
    "channel_versions channel": (
        "put",
        lambda b: (thread_config("t"), _checkpoint(versions={b: "1"}), {}, {}),
        "a channel of checkpoint['channel_versions']",
        "channel name",
        True,
    ),
    "channel_versions version": (
        "put",
        lambda b: (thread_config("t"), _checkpoint(versions={"items": b}), {}, {}),
        "checkpoint['channel_versions']['items']",
        "channel version",
        True,
    ),
    "put_writes's config": (
        "put_writes",
        lambda b: (thread_config("t", b), [("items", [1])], "task"),
        CID,
        "checkpoint id",
        True,
    ),
    "put_writes's channel": (
        "put_writes",
        lambda b: (thread_config("t", "c"), [("items", [1]), (b, [2])], "task"),
        "the channel of put_writes's writes[1]",
        "channel name",
        True,
    ),
    "put_writes's task_id": (
        "put_writes",
        lambda b: (thread_config("t", "c"), [("items", [1])], b),
        "put_writes's task_id",
        "task id",
        False,
    ),
    "put_writes's task_path": (
        "put_writes",
        lambda b: (thread_config("t", "c"), [("items", [1])], "task", b),
        "put_writes's task_path",
        "task path",
        False,
    ),
    "get_tuple": ("get_tuple", lambda b: (thread_config("t", b),), CID, "checkpoint id", True),
    "list": ("list", lambda b: (thread_config("t", b),), CID, "checkpoint id", True),
    "list before": (
        "list",
        lambda b: (thread_config("t"), None, thread_config("t", b)),
        "before['configurable']['checkpoint_id']",
        "checkpoint id",
        True,
    ),
}


def _sync(saver: NestEggSaver, method: str, args: tuple[Any, ...]) -> None:
    if method == "list":
        list(saver.list(args[0], before=args[2] if len(args) > 2 else None))
    else:
        getattr(saver, method)(*args)


async def _async(saver: NestEggSaver, method: str, args: tuple[Any, ...]) -> None:
    if method == "list":
        [t async for t in saver.alist(args[0], before=args[2] if len(args) > 2 else None)]
    else:
        await getattr(saver, f"a{method}")(*args)


def _refused(bad: str, separated: bool) -> bool:
    return separated or bad != "a\x1fb"


@pytest.mark.parametrize("bad", list(BAD), ids=["nul", "separator", "surrogate"])
@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_bad_id_is_refused_by_every_method_naming_it_and_nothing_changes(
    saver_factory: SaverFactory, defer_writes: bool, bad: str
) -> None:
    saver = seeded_saver(saver_factory, defer_writes)
    before = saver._run(stored_rows(saver.storage))
    for name, (method, args, where, what, separated) in CALLS.items():
        if not _refused(bad, separated):
            continue
        with pytest.raises(InvalidIdentifierError) as refused:
            _sync(saver, method, args(bad))
        assert str(refused.value) == f"{where} {BAD[bad]}: no store can keep that {what}", name
        saver._run(saver._core.flush())  # a deferred write would be committed now
        assert saver._run(stored_rows(saver.storage)) == before, name
    assert len(list(saver.list(None))) == 5  # the store still reads whole


@pytest.mark.parametrize("bad", list(BAD), ids=["nul", "separator", "surrogate"])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_bad_id_is_refused_by_every_async_method_and_nothing_changes(
    saver_factory: SaverFactory, bad: str
) -> None:
    saver = saver_factory()
    await saver.aput(thread_config("t"), _checkpoint("c"), {}, {})
    before = await saver._arun(stored_rows(saver.storage))
    for name, (method, args, where, what, separated) in CALLS.items():
        if not _refused(bad, separated):
            continue
        with pytest.raises(InvalidIdentifierError) as refused:
            await _async(saver, method, args(bad))
        assert str(refused.value) == f"{where} {BAD[bad]}: no store can keep that {what}", name
        await saver._arun(saver._core.flush())
        assert await saver._arun(stored_rows(saver.storage)) == before, name


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_task_id_or_path_holding_the_separator_is_kept_and_read_back(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory(defer_writes=False)
    saver.put(thread_config("t"), _checkpoint("c"), {}, {})
    saver.put(thread_config("t"), _checkpoint("c\x1e"), {}, {})  # sorts between "c", "c\x1f…"
    saver.put_writes(thread_config("t", "c"), [("items", 1)], "a\x1f0", "p\x1fq")
    saver.put_writes(thread_config("t", "c"), [("items", 2)], "a", "p")
    found = saver.get_tuple(thread_config("t", "c"))
    assert found is not None
    assert sorted(found.pending_writes) == [("a", "items", 2), ("a\x1f0", "items", 1)]
    other = saver.get_tuple(thread_config("t", "c\x1e"))
    assert other is not None and other.pending_writes == []


EMPTY_CONFIG = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": ""}}
EMPTY_WRITES: dict[str, tuple[str, tuple[Any, ...], str]] = {
    "put's checkpoint": ("put", (thread_config("t"), _checkpoint(""), {}, {}), "checkpoint['id']"),
    "put_writes's config": ("put_writes", (EMPTY_CONFIG, [("items", [1])], "task"), CID),
}


def _empty_refused(where: str) -> str:
    return f"{where} is empty: a checkpoint needs a non-empty id (an empty one names none)"


@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_writing_under_an_empty_checkpoint_id_is_refused_and_nothing_changes(
    saver_factory: SaverFactory, defer_writes: bool
) -> None:
    saver = saver_factory(defer_writes=defer_writes)
    saver.put(thread_config("t"), _checkpoint("c"), {}, {})
    before = saver._run(stored_rows(saver.storage))
    for name, (method, args, where) in EMPTY_WRITES.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            _sync(saver, method, args)
        assert str(refused.value) == _empty_refused(where), name
        saver._run(saver._core.flush())
        assert saver._run(stored_rows(saver.storage)) == before, name


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_writing_under_an_empty_checkpoint_id_is_refused_by_the_async_methods(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    await saver.aput(thread_config("t"), _checkpoint("c"), {}, {})
    before = await saver._arun(stored_rows(saver.storage))
    for name, (method, args, where) in EMPTY_WRITES.items():
        with pytest.raises(InvalidIdentifierError) as refused:
            await _async(saver, method, args)
        assert str(refused.value) == _empty_refused(where), name
        await saver._arun(saver._core.flush())
        assert await saver._arun(stored_rows(saver.storage)) == before, name


def _reads_of_an_empty_id(saver: Any) -> list[Any]:
    """What a saver reads for configs whose checkpoint_id is empty, after three puts (the
    first with an empty parent id)."""
    parent = EMPTY_CONFIG
    for checkpoint_id in ("c1", "c2", "c3"):
        parent = saver.put(parent, _checkpoint(checkpoint_id), {}, {})
    first = saver.get_tuple(thread_config("t", "c1"))
    latest = saver.get_tuple(EMPTY_CONFIG)
    return [
        first.parent_config,
        latest.checkpoint["id"],
        [t.checkpoint["id"] for t in saver.list(EMPTY_CONFIG)],
        [t.checkpoint["id"] for t in saver.list(thread_config("t"), before=EMPTY_CONFIG)],
    ]


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_an_empty_checkpoint_id_in_a_config_means_none_as_in_langgraphs_saver(
    saver_factory: SaverFactory,
) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    expected = [None, "c3", ["c3", "c2", "c1"], ["c3", "c2", "c1"]]
    assert _reads_of_an_empty_id(InMemorySaver()) == expected
    assert _reads_of_an_empty_id(saver_factory()) == expected
