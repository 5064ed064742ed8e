"""Group commit: the commits that arrive while one write is in flight go out together.

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
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from nestegg.checkpoint.records import Commit

Outcome = BaseException | None
WriteOne = Callable[[Commit], Awaitable[None]]
WriteMany = Callable[[Sequence[Commit]], Awaitable[Sequence[Outcome]]]

MAX_BATCH = 512
"""Commits written in one batch at most (the rest go in the next)."""


class GroupCommitter:
    """Writes one store's commits, alone when nothing is in flight, else in batches.

    Args:
        write_one: writes one commit (raises its error).
        write_many: writes commits together, one outcome per commit, in their order; an
            error it raises is every commit's.
        max_batch: commits per batch at most.
    """

    def __init__(self, write_one: WriteOne, write_many: WriteMany, max_batch: int = MAX_BATCH):
        self._write_one = write_one
        self._write_many = write_many
        self._max_batch = max_batch
        self._busy = False
        self._queue: list[tuple[Commit, asyncio.Future[None]]] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self._this_turn: set[str] = set()  # runs written alone in this turn of the loop

    async def commit(self, commit: Commit) -> None:
        """Write ``commit``; return once it is written, raise only its own error."""
        if self._busy or (self._this_turn and commit.run_id not in self._this_turn):
            # Another write is in flight, or another run wrote alone in this same turn of
            # the loop (a write that did not wait, as SQLite's): batched.
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queue.append((commit, future))
            await future
            return
        if not self._this_turn:
            asyncio.get_running_loop().call_soon(self._end_turn)
        self._this_turn.add(commit.run_id)
        self._busy = True
        try:
            await self._write_one(commit)
        finally:
            self._next()

    def _end_turn(self) -> None:
        self._this_turn.clear()
        if not self._busy:
            self._next()

    def _next(self) -> None:
        """Start the next batch, or mark the committer idle."""
        if not self._queue:  # the common case of one run: nothing waits
            self._busy = False
            return
        queue = [(c, f) for c, f in self._queue if not f.cancelled()]
        if not queue:
            self._queue.clear()
            self._busy = False
            return
        self._busy = True
        batch, self._queue = queue[: self._max_batch], queue[self._max_batch :]
        task = asyncio.get_running_loop().create_task(self._flush(batch))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _flush(self, batch: list[tuple[Commit, asyncio.Future[None]]]) -> None:
        stopped: BaseException | None = None
        try:
            if len(batch) == 1:
                outcomes: Sequence[Outcome] = [await outcome_of(self._write_one, batch[0][0])]
            else:
                outcomes = await self._write_many([commit for commit, _ in batch])
        except BaseException as error:  # the whole batch failed: every commit's error
            outcomes = [error] * len(batch)
            stopped = None if isinstance(error, Exception) else error
        self._next()
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.cancelled():
                continue
            if outcome is None:
                future.set_result(None)
            else:
                future.set_exception(outcome)
        if stopped is not None:
            raise stopped

    async def drain(self) -> None:
        """Wait for the batches in flight (before a store closes)."""
        while self._flushing:
            await asyncio.gather(*self._flushing, return_exceptions=True)


async def outcome_of(write_one: WriteOne, commit: Commit) -> Outcome:
    """``write_one(commit)``'s error, or None if it wrote."""
    try:
        await write_one(commit)
    except Exception as error:
        return error
    return None


__all__ = ["MAX_BATCH", "GroupCommitter", "Outcome", "outcome_of"]
