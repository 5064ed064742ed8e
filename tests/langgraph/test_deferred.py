"""Deferred writes (``defer_writes=True``): a fast step commits them with its checkpoint,
once; writes that waited DEFERRED_WRITES_DELAY are committed on their own; close stops
the timer. (A killed process keeping them: test_crash.py.)"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.threads import CHECKPOINT, ThreadChange, ThreadRow
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.deferred import DeferredWrites
from nestegg.testing.clock import FakeClock
from tests.langgraph.graphs import build_loop, loop_config
from tests.langgraph.parallel_child import CONFIG, build


class CountingStore(SQLiteCheckpointStorage):
    """The SQLite store counting its thread commits; the first ``failures`` fail."""

    def __init__(self, path: Path, failures: int = 0) -> None:
        super().__init__(str(path))
        self.commits: list[ThreadChange] = []
        self.failures = failures

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("the store is down")
        await super().apply_thread_change(thread_id, change, now)
        self.commits.append(change)


def _checkpoints(saver: NestEggSaver, thread_id: str) -> int:
    return len(list(saver.list({"configurable": {"thread_id": thread_id}})))


def test_a_fast_sequential_step_commits_once_with_its_checkpoint(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "db")
    with NestEggSaver(store) as saver:
        build_loop(saver, 20).invoke({"items": [], "turn": 0}, loop_config("t", 20))
        assert len(store.commits) == _checkpoints(saver, "t")
        assert all(any(row.kind == CHECKPOINT for row in c.put) for c in store.commits)


async def test_fast_parallel_tasks_commit_once_with_their_checkpoint(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "db")
    async with NestEggSaver(store) as saver:
        app = build(saver, str(tmp_path / "log"), 0.0)
        await app.ainvoke({"log": []}, CONFIG, durability="sync")
        assert len(store.commits) == _checkpoints(saver, "parallel")
        assert all(any(row.kind == CHECKPOINT for row in c.put) for c in store.commits)


def test_writes_that_waited_are_committed_on_their_own(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "db")
    with NestEggSaver(store) as saver:
        build_loop(saver, 1).invoke({"items": [], "turn": 0}, loop_config("t", 1))
        config = saver.get_tuple({"configurable": {"thread_id": "t"}}).config  # type: ignore[union-attr]
        committed = len(store.commits)
        saver.put_writes(config, [("items", ["late"])], "task-1")
        assert len(store.commits) == committed  # deferred
        _wait_until(lambda: len(store.commits) > committed)
        assert store.commits[-1].put_new and not store.commits[-1].put
        other = NestEggSaver(store)  # its own reads: the rows are in the store
        tup = other.get_tuple(config)
        assert tup is not None and tup.pending_writes == [("task-1", "items", ["late"])]


async def test_writes_that_waited_are_committed_on_their_own_in_async_use(
    tmp_path: Path,
) -> None:
    store = CountingStore(tmp_path / "db")
    async with NestEggSaver(store) as saver:  # the saver's loop runs on a thread of its own
        await build_loop(saver, 1).ainvoke({"items": [], "turn": 0}, loop_config("t", 1))
        tup = await saver.aget_tuple({"configurable": {"thread_id": "t"}})
        assert tup is not None
        committed = len(store.commits)
        await saver.aput_writes(tup.config, [("items", ["late"])], "task-1")
        assert len(store.commits) == committed  # deferred
        _wait_until(lambda: len(store.commits) > committed)
        assert store.commits[-1].put_new and not store.commits[-1].put


def test_a_failed_commit_of_waiting_writes_keeps_them_for_the_next(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "db")
    with NestEggSaver(store) as saver:
        build_loop(saver, 1).invoke({"items": [], "turn": 0}, loop_config("t", 1))
        config = saver.get_tuple({"configurable": {"thread_id": "t"}}).config  # type: ignore[union-attr]
        store.failures = 1
        saver.put_writes(config, [("items", ["late"])], "task-1")
        _wait_until(lambda: store.failures == 0)  # the timer's commit failed
        _wait_until(lambda: store.commits[-1].put_new != [])  # its retry did not
        tup = saver.get_tuple(config)
        assert tup is not None and tup.pending_writes == [("task-1", "items", ["late"])]


def test_the_timer_backs_off_while_the_store_is_down_and_warns_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="nestegg")
    store = CountingStore(tmp_path / "db")
    with NestEggSaver(store) as saver:
        build_loop(saver, 1).invoke({"items": [], "turn": 0}, loop_config("t", 1))
        config = saver.get_tuple({"configurable": {"thread_id": "t"}}).config  # type: ignore[union-attr]
        caplog.clear()
        store.failures = down = 10**9
        saver.put_writes(config, [("items", ["late"])], "task-1")
        threading.Event().wait(0.5)  # a window of the outage: tries at 50, 100, 200, 400 ms
        attempts = down - store.failures
        assert 1 <= attempts <= 5  # about 10 without the backoff
        store.failures = 0
        _wait_until(lambda: len(caplog.records) > attempts)  # its next commit is logged
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r.getMessage() for r in warnings] == [
            "deferred LangGraph writes not committed yet, retrying: the store is down",
            f"deferred LangGraph writes committed again after {attempts} failed attempts",
        ]
        assert not any(r.exc_info for r in caplog.records)
        assert len(caplog.records) == attempts + 1  # the failures between at DEBUG
        tup = NestEggSaver(store).get_tuple(config)
        assert tup is not None and tup.pending_writes == [("task-1", "items", ["late"])]


def test_close_stops_the_timer_and_commits_what_waits(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "db")
    saver = NestEggSaver(store, close_storage=True)
    build_loop(saver, 1).invoke({"items": [], "turn": 0}, loop_config("t", 1))
    config = saver.get_tuple({"configurable": {"thread_id": "t"}}).config  # type: ignore[union-attr]
    saver.put_writes(config, [("items", ["late"])], "task-1")
    timer = saver._core.deferred._timer
    saver.close()
    assert timer is not None and not timer.is_alive()
    assert store.commits[-1].put_new
    with NestEggSaver.from_url(f"sqlite:///{tmp_path / 'db'}") as other:
        tup = other.get_tuple(config)
        assert tup is not None and tup.pending_writes == [("task-1", "items", ["late"])]


def _row(key: str) -> ThreadRow:
    return ThreadRow("write", key, b"")


def test_writes_are_due_once_they_waited_the_delay_oldest_first() -> None:
    clock = FakeClock(100.0)
    deferred = DeferredWrites(lambda: None, delay=0.5, clock=clock)
    deferred.add("a", [_row("1")])
    clock.advance(0.25)
    deferred.add("b", [_row("2")])
    deferred.add("a", [_row("3")])  # waits since the first of "a"
    assert deferred.due() == []
    clock.advance(0.25)
    assert deferred.due() == ["a"]
    clock.advance(0.25)
    assert deferred.due() == ["a", "b"]
    rows = deferred.take("a")
    assert [r.key for r in rows] == ["1", "3"] and deferred.due() == ["b"]
    deferred.add("a", [_row("4")])
    deferred.put_back("a", rows)  # a failed commit: first in line again, waiting anew
    assert deferred.due() == ["b"]
    assert [r.key for r in deferred.take("a")] == ["1", "3", "4"]
    deferred.close()


def test_the_timer_calls_back_once_writes_are_due_and_ends_on_close() -> None:
    taken: list[list[ThreadRow]] = []
    called = threading.Event()

    def flush_due() -> None:
        taken.extend(deferred.take(thread_id) for thread_id in deferred.due())
        called.set()

    deferred = DeferredWrites(flush_due, delay=0.01)
    deferred.add("a", [_row("1")])
    assert called.wait(10)
    assert taken == [[_row("1")]]
    timer = deferred._timer
    deferred.close()
    assert timer is None or not timer.is_alive()
    deferred.add("b", [_row("2")])  # after close: kept for a read, no timer
    assert deferred._timer is None and deferred.thread_ids() == ["b"]


def _wait_until(done: Any, seconds: float = 10.0) -> None:
    """Wait for the saver's timer thread to do something (polls an Event, never a clock)."""
    tick = threading.Event()
    for _ in range(int(seconds / 0.005)):
        if done():
            return
        tick.wait(0.005)
    pytest.fail("the timer did not commit")
