"""Group commit: the calls that arrive while one write is in flight go out together.

A store hands :class:`GroupCommitter` two ways to write: ``write_one(commit)`` (a commit
alone, as the store always wrote it) and ``write_many(commits)`` (many runs' commits in one
transaction or round trip, each still fenced on its own, returning one outcome per
commit: None, or the error of that commit alone). A commit that finds nothing in flight
is written alone at once, so one run pays nothing for the batching; the commits that
arrive while it (or a batch) is written, and those of other runs in the same turn of the
event loop (for a store whose write does not wait, as SQLite's on the loop thread), wait
and go out together in the next batch. Each caller's ``commit`` returns only when its own
commit is written (``durability="sync"`` keeps its promise) and raises only its own error:
a run whose fence was lost gets StaleOwnerError, the other runs of the batch commit.

Within a batch the commits keep the order they arrived in, so two commits of one run
land in order.

:class:`GroupCalls` is the same for any store operation with a result (a server store's
run creations, reads of runs and claims, which thousands of runs starting at once would
otherwise queue one by one for the pool's few connections): ``many(items)`` returns one
outcome per item, its result or its error.

:func:`commit_latencies` measures how long commits take to be written: from a commit's
arrival to the moment its outcome is known (its batch written), before its run goes on.
With many runs on one event loop that is less than the wait of the run itself, which
also waits its turn on the loop to go on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

from nestegg.checkpoint.records import Commit

T = TypeVar("T")
R = TypeVar("R")
Outcome = BaseException | None
WriteOne = Callable[[Commit], Awaitable[None]]
WriteMany = Callable[[Sequence[Commit]], Awaitable[Sequence[Outcome]]]

MAX_BATCH = 512
"""Calls sent in one batch at most (the rest go in the next)."""


class GroupCalls(Generic[T, R]):
    """Makes one store operation's calls, alone when nothing is in flight, else in batches.

    Args:
        one: makes one call (returns its result, raises its error).
        many: makes calls together, one outcome per item in their order (its result, or
            its error as a value); an error it raises is every call's.
        key: what marks a call as another caller's (a run id): a call whose key was
            already made alone in this turn of the loop is not held back for a batch.
        max_batch: calls per batch at most.
    """

    def __init__(
        self,
        one: Callable[[T], Awaitable[R]],
        many: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
        key: Callable[[T], str],
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._one = one
        self._many = many
        self._key = key
        self._max_batch = max_batch
        self._busy = False
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self._this_turn: set[str] = set()  # keys called alone in this turn of the loop

    async def call(self, item: T) -> R:
        """Make the call for ``item``; return its result once made, raise its own error."""
        key = self._key(item)
        if self._busy or (self._this_turn and key not in self._this_turn):
            # Another call is in flight, or another caller's call was made alone in this
            # same turn of the loop (a write that did not wait, as SQLite's): batched.
            future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
            self._queue.append((item, future))
            return await future
        if not self._this_turn:
            asyncio.get_running_loop().call_soon(self._end_turn)
        self._this_turn.add(key)
        self._busy = True
        try:
            return await self._one(item)
        finally:
            self._next()

    def _end_turn(self) -> None:
        self._this_turn.clear()
        if not self._busy:
            self._next()

    def _next(self) -> None:
        """Start the next batch, or mark the group idle."""
        if not self._queue:  # the common case of one run: nothing waits
            self._busy = False
            return
        queue = [(c, f) for c, f in self._queue if not f.cancelled()]
        if not queue:
            self._queue.clear()
            self._busy = False
            return
        self._busy = True
        if len(queue) <= self._max_batch:
            batch, self._queue = queue, []
        else:
            batch, self._queue = queue[: self._max_batch], queue[self._max_batch :]
        task = asyncio.get_running_loop().create_task(self._flush(batch))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        stopped: BaseException | None = None
        try:
            if len(batch) == 1:
                outcomes: Sequence[R | BaseException] = [await outcome_of(self._one, batch[0][0])]
            else:
                outcomes = await self._many([item for item, _ in batch])
        except BaseException as error:  # the whole batch failed: every call's error
            outcomes = [error] * len(batch)
            stopped = None if isinstance(error, Exception) else error
        self._settled(batch)
        self._next()
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.cancelled():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if stopped is not None:
            raise stopped

    def _settled(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """The outcomes of ``batch`` are known (before its callers are told)."""

    async def drain(self) -> None:
        """Wait for the batches in flight (before a store closes)."""
        while self._flushing:
            await asyncio.gather(*self._flushing, return_exceptions=True)


def _run_of(commit: Commit) -> str:
    return commit.run_id


class GroupCommitter(GroupCalls[Commit, None]):
    """Writes one store's commits, alone when nothing is in flight, else in batches.

    Args:
        write_one: writes one commit (raises its error).
        write_many: writes commits together, one outcome per commit, in their order; an
            error it raises is every commit's.
        max_batch: commits per batch at most.
    """

    def __init__(self, write_one: WriteOne, write_many: WriteMany, max_batch: int = MAX_BATCH):
        super().__init__(write_one, write_many, _run_of, max_batch)
        self._written: dict[int, float] = {}  # id(commit) -> when its batch was written

    async def commit(self, commit: Commit) -> None:
        """Write ``commit``; return once it is written, raise only its own error."""
        if not _latency_lists:
            await self.call(commit)
            return
        started = time.perf_counter()
        try:
            await self.call(commit)
        finally:
            written = self._written.pop(id(commit), None) or time.perf_counter()
            for latencies in _latency_lists:
                latencies.append(written - started)

    def _settled(self, batch: list[tuple[Commit, asyncio.Future[None]]]) -> None:
        if _latency_lists:
            now = time.perf_counter()
            self._written.update((id(c), now) for c, future in batch if not future.cancelled())


_latency_lists: list[list[float]] = []


@contextmanager
def commit_latencies() -> Iterator[list[float]]:
    """Collects, while open, the seconds every group-committed store commit of this process
    takes to be written: from its arrival to its outcome (its batch written), not counting
    the wait of its run for its turn on the event loop afterwards."""
    latencies: list[float] = []
    _latency_lists.append(latencies)
    try:
        yield latencies
    finally:
        _latency_lists.remove(latencies)


async def outcome_of(one: Callable[[T], Awaitable[R]], item: T) -> R | BaseException:
    """``one(item)``'s result, or its error."""
    try:
        return await one(item)
    except Exception as error:
        return error


__all__ = [
    "MAX_BATCH",
    "GroupCalls",
    "GroupCommitter",
    "Outcome",
    "commit_latencies",
    "outcome_of",
]
