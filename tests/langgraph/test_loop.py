"""Where the saver's store calls run: on the sync caller's own thread while only sync code
uses the saver, on a thread of the saver's from the first call made from an event loop;
a saver used both ways, in any order, sees one store."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.errors import StorageUnavailableError
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.loop import LoopThread
from tests.langgraph.conftest import SaverFactory, kinds
from tests.langgraph.graphs import build_loop, loop_config

LOOP_THREAD = "nestegg-langgraph"


def _loop_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == LOOP_THREAD]


def _invoke(saver: NestEggSaver, thread_id: str, steps: int) -> None:
    app = build_loop(saver, steps, 10)
    app.invoke({"items": [], "turn": 0}, loop_config(thread_id, steps), durability="sync")


def _checkpoints(saver: NestEggSaver, thread_id: str) -> int:
    return len(list(saver.list({"configurable": {"thread_id": thread_id}})))


def test_sync_use_runs_the_store_on_the_callers_thread(tmp_path: Path) -> None:
    before = len(_loop_threads())
    with NestEggSaver.from_url(f"sqlite:///{tmp_path / 'g.db'}") as saver:
        _invoke(saver, "t", 5)
        assert len(_loop_threads()) == before
        assert _checkpoints(saver, "t") == 7  # input, the loop's first step, 5 steps


async def test_an_async_call_moves_the_loop_to_its_thread_and_sync_calls_follow(
    tmp_path: Path,
) -> None:
    before = len(_loop_threads())
    saver = NestEggSaver.from_url(f"sqlite:///{tmp_path / 'g.db'}")
    try:
        await asyncio.to_thread(_invoke, saver, "sync-first", 3)
        assert len(_loop_threads()) == before
        assert await saver.aget_tuple({"configurable": {"thread_id": "sync-first"}})
        assert len(_loop_threads()) == before + 1
        # sync calls, from another thread or from this event loop's own thread
        await asyncio.to_thread(_invoke, saver, "sync-after", 3)
        assert _checkpoints(saver, "sync-after") == 5
        assert _checkpoints(saver, "sync-first") == 5
    finally:
        await saver.aclose()
    assert len(_loop_threads()) == before


async def test_a_sync_call_from_an_event_loop_before_any_async_one(tmp_path: Path) -> None:
    before = len(_loop_threads())
    saver = NestEggSaver.from_url(f"sqlite:///{tmp_path / 'g.db'}")
    try:
        assert saver.get_tuple({"configurable": {"thread_id": "none"}}) is None
        assert len(_loop_threads()) == before + 1  # this thread's loop is running
    finally:
        await saver.aclose()
    assert len(_loop_threads()) == before


def test_a_call_from_the_running_loop_itself_is_refused_not_deadlocked() -> None:
    runner = LoopThread()

    async def reenter() -> None:
        runner.run(asyncio.sleep(0))

    try:
        with pytest.raises(RuntimeError, match="from its own loop"):
            runner.run(reenter())
    finally:
        runner.stop()


def test_calls_under_way_when_the_loop_stops_fail_instead_of_hanging() -> None:
    loop = LoopThread()
    loop._start_thread()  # as once an async caller came: other threads' calls go to it
    entered = threading.Event()
    outcomes: list[BaseException] = []

    async def slow() -> None:
        entered.set()
        await asyncio.sleep(30)

    def call() -> None:
        try:
            loop.run(slow())
        except BaseException as error:  # what the waiting caller gets
            outcomes.append(error)

    callers = [threading.Thread(target=call) for _ in range(3)]
    for caller in callers:
        caller.start()
    assert entered.wait(5)
    loop.stop()  # a saver closed while other threads' calls are under way
    for caller in callers:
        caller.join(5)
        assert not caller.is_alive(), "a call waits for a loop that no longer runs"
    assert [type(error) for error in outcomes] == [StorageUnavailableError] * 3
    with pytest.raises(StorageUnavailableError, match="store was closed"):
        loop.run(slow())


async def test_an_async_call_under_way_when_the_loop_stops_fails_too() -> None:
    loop = LoopThread()
    call = asyncio.ensure_future(loop.arun(asyncio.sleep(30)))
    await asyncio.sleep(0.2)
    await asyncio.to_thread(loop.stop)
    with pytest.raises(StorageUnavailableError, match="store was closed"):
        await asyncio.wait_for(call, 5)


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_a_closed_saver_refuses_calls_instead_of_reopening_its_store(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()  # opened the store: closes it with itself
    await asyncio.to_thread(_invoke, saver, "t", 2)
    config = {"configurable": {"thread_id": "t"}}
    latest = saver.get_tuple(config)
    assert latest is not None
    await asyncio.to_thread(saver.close)
    calls: list[Callable[[], object]] = [
        lambda: saver.get_tuple(config),
        lambda: list(saver.list(None)),
        lambda: saver.put_writes(latest.config, [("items", ["x"])], "task"),
        lambda: saver.delete_thread("t"),
        lambda: _invoke(saver, "after", 2),
    ]
    for call in calls:
        with pytest.raises(StorageUnavailableError, match="saver was closed"):
            await asyncio.to_thread(call)
    with pytest.raises(StorageUnavailableError, match="saver was closed"):
        await saver.aget_tuple(config)
    with pytest.raises(StorageUnavailableError, match="saver was closed"):
        await build_loop(saver, 2).ainvoke({"items": [], "turn": 0}, loop_config("after", 2))


def test_a_closed_saver_over_a_store_of_yours_refuses_calls_too() -> None:
    store = MemoryCheckpointStorage()
    with NestEggSaver(store) as saver:
        _invoke(saver, "t", 2)
    with pytest.raises(StorageUnavailableError, match="saver was closed"):
        _invoke(saver, "after", 2)
    with NestEggSaver(store) as fresh:  # the store itself stays open, and holds only "t"
        assert [t.config["configurable"]["thread_id"] for t in fresh.list(None, limit=1)] == ["t"]
        assert _checkpoints(fresh, "after") == 0
