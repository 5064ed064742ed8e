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

The callers of a written batch are woken at most ``WAKE_PER_TURN`` in one turn of the event
loop, the others in the turns after, oldest first. With a thousand runs at once a batch
holds hundreds of commits: their runs woken together would make one turn of the loop as
long as all their steps, and the commits arriving meanwhile, a batch's reply on its socket
and every other callback of the process would wait for its end. Woken a few at a time,
each turn stays short, the commits of the runs that went on go out within a turn or two,
and the runs not yet woken wait their turn, as they would have on the loop anyway.

Within a batch the commits keep the order they arrived in, so two commits of one run
land in order. A batch holds no more bytes than one commit may (``COMMIT_MAX_BYTES``): the
commits of many runs, each under it, never add up to more than a server takes at once (a
PostgreSQL message over 1 GB drops the connection).

A store that writes on several connections lets several batches be under
way at once (``in_flight``): the commits that arrive while one is written go out at the
end of that turn of the loop instead of waiting for it, which keeps batches small and
commits quick with thousands of runs. A run's commits are never in two batches under
way at once.

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
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

from nestegg.checkpoint.records import Commit, RunRecord
from nestegg.checkpoint.stores.step_gate import StepGate
from nestegg.constants import COMMIT_MAX_BYTES

T = TypeVar("T")
R = TypeVar("R")
Outcome = BaseException | None
WriteOne = Callable[[Commit], Awaitable[None]]
WriteMany = Callable[[Sequence[Commit]], Awaitable[Sequence[Outcome]]]

MAX_BATCH = 512
"""Calls sent in one batch at most (the rest go in the next)."""
WAKE_PER_TURN = 32
"""Callers of written batches woken in one turn of the event loop at most; the others in
the turns after, in the order their calls were made."""
_DRAIN_POLL = 0.001
"""Seconds :meth:`GroupCalls.drain` sleeps between looks while a call made alone is under
way (it has no task of the group's to wait for)."""


class GroupCalls(Generic[T, R]):
    """Makes one store operation's calls, alone when nothing is in flight, else in batches.

    Args:
        one: makes one call (returns its result, raises its error).
        many: makes calls together, one outcome per item in their order (its result, or
            its error as a value); an error it raises is every call's.
        key: what marks a call as another caller's (a run id): a call whose key was
            already made alone in this turn of the loop is not held back for a batch.
        max_batch: calls per batch at most.
        in_flight: batches (or calls alone) under way at once at most: more than one for a
            store that writes on several connections, so that the calls arriving while
            one batch is written go out without waiting for it.
        wake_per_turn: callers of written batches told their outcomes in one turn of the
            event loop at most.
        weight: the bytes a call sends, about (None: calls are not weighed).
        max_weight: the bytes of one batch at most, when calls are weighed: a call that
            would take its batch past it goes in a later batch (alone if it weighs more).
    """

    def __init__(
        self,
        one: Callable[[T], Awaitable[R]],
        many: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
        key: Callable[[T], str],
        max_batch: int = MAX_BATCH,
        in_flight: int = 1,
        wake_per_turn: int = WAKE_PER_TURN,
        weight: Callable[[T], int] | None = None,
        max_weight: int = 0,
    ) -> None:
        self._one = one
        self._weight = weight
        self._max_weight = max_weight
        self._wake_per_turn = wake_per_turn
        self._many = many
        self._key = key
        self._max_batch = max_batch
        self._max_in_flight = in_flight
        self._in_flight = 0  # calls made alone and batches under way
        self._under_way = 0  # the calls of those
        self._flying: set[str] = set()  # the keys of the calls under way
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self._this_turn: set[str] = set()  # keys called alone in this turn of the loop
        self._kick_due = False
        self._to_wake: deque[tuple[asyncio.Future[R], R | BaseException]] = deque()
        self._wake_due = False
        self._loop: asyncio.AbstractEventLoop | None = None  # where the callbacks due run

    def _this_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop. A store used by a loop that ended (``asyncio.run`` after
        ``asyncio.run``) forgets that loop's callbacks due, its calls under way and its
        callers, whose futures can no longer be told: else the calls of the next loop
        would wait for them."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._kick_due = self._wake_due = False
            self._in_flight = self._under_way = 0
            self._flying.clear()
            self._flushing.clear()
            self._this_turn.clear()
            self._queue = [call for call in self._queue if call[1].get_loop() is loop]
            self._to_wake = deque(w for w in self._to_wake if w[0].get_loop() is loop)
        return loop

    async def call(self, item: T) -> R:
        """Make the call for ``item``; return its result once made, raise its own error."""
        key = self._key(item)
        loop = self._this_loop()
        if self._in_flight or self._queue or (self._this_turn and key not in self._this_turn):
            # Another call is under way or waits, or another caller's call was made alone
            # in this same turn of the loop (a write that did not wait, as SQLite's):
            # batched, sent at the end of this turn if a batch may start then.
            future: asyncio.Future[R] = loop.create_future()
            self._queue.append((item, future))
            if not self._kick_due and self._in_flight < self._max_in_flight:
                self._kick_due = True
                loop.call_soon(self._kick)
            return await future
        if not self._this_turn:
            loop.call_soon(self._end_turn)
        self._this_turn.add(key)
        self._in_flight += 1
        self._under_way += 1
        self._flying.add(key)
        try:
            return await self._one(item)
        finally:
            self._in_flight -= 1
            self._under_way -= 1
            self._flying.discard(key)
            self._next()

    def _end_turn(self) -> None:
        self._this_turn.clear()
        self._next()

    def _kick(self) -> None:
        self._kick_due = False
        self._next()

    def _next(self) -> None:
        """Start batches of the waiting calls while fewer than ``in_flight`` are under way."""
        while self._queue and self._in_flight < self._max_in_flight:
            batch, keys = self._take()
            if not batch:
                break
            self._in_flight += 1
            self._under_way += len(batch)
            task = asyncio.get_running_loop().create_task(self._flush(batch, keys))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)
        self._room_made()

    def _take(self) -> tuple[list[tuple[T, asyncio.Future[R]]], set[str]]:
        """The next batch and its keys: the oldest waiting calls, at most ``max_batch`` and,
        weighed, ``max_weight`` bytes (but one call at least), none of a key under way or
        of a key whose earlier call waits (a run's calls are made one after the other, in
        order)."""
        batch: list[tuple[T, asyncio.Future[R]]] = []
        keys: set[str] = set()
        left: list[tuple[T, asyncio.Future[R]]] = []
        held: set[str] = set()  # keys of calls left for later: their next calls wait too
        weight = 0
        for call in self._queue:
            if call[1].cancelled():
                continue
            key = self._key(call[0])
            if len(batch) < self._max_batch and key not in self._flying and key not in held:
                more = self._weight(call[0]) if self._weight is not None else 0
                if not batch or weight + more <= self._max_weight or self._weight is None:
                    batch.append(call)
                    keys.add(key)
                    weight += more
                    continue
            held.add(key)
            left.append(call)
        self._queue = left
        self._flying |= keys
        return batch, keys

    async def _flush(self, batch: list[tuple[T, asyncio.Future[R]]], keys: set[str]) -> None:
        stopped: BaseException | None = None
        try:
            if len(batch) == 1:
                outcomes: Sequence[R | BaseException] = [await outcome_of(self._one, batch[0][0])]
            else:
                outcomes = await self._many([item for item, _ in batch])
        except BaseException as error:  # the whole batch failed: every call's error
            outcomes = [error] * len(batch)
            stopped = None if isinstance(error, Exception) else error
        self._in_flight -= 1
        self._under_way -= len(batch)
        self._flying -= keys
        self._settled(batch)
        self._next()
        self._to_wake.extend(zip([f for _, f in batch], outcomes, strict=True))
        if stopped is not None:  # the loop is being stopped: every caller is told now
            self._wake(len(self._to_wake))
            raise stopped
        if not self._wake_due:
            self._wake()

    def _wake(self, most: int | None = None) -> None:
        """Tell at most ``most`` callers their outcomes (``wake_per_turn`` by default);
        the rest in the next turn."""
        self._wake_due = False
        to_wake = self._to_wake
        for _ in range(min(len(to_wake), most or self._wake_per_turn)):
            future, outcome = to_wake.popleft()
            if future.cancelled():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
        if to_wake:
            self._wake_due = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _settled(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        """The outcomes of ``batch`` are known (before its callers are told)."""

    def _room_made(self) -> None:
        """Calls were made: fewer wait or are under way."""

    @property
    def pending(self) -> int:
        """The calls waiting or under way (made, their outcomes not known yet)."""
        return len(self._queue) + self._under_way

    async def drain(self) -> None:
        """Wait for the calls waiting, the batches under way and the telling of their
        callers (before a store closes)."""
        while self._flushing or self._queue or self._to_wake:
            if self._flushing:
                await asyncio.gather(*self._flushing, return_exceptions=True)
            elif self._kick_due or self._to_wake:  # at the end of this turn
                await asyncio.sleep(0)
            else:  # the calls wait for a call made alone: its end starts their batch
                await asyncio.sleep(_DRAIN_POLL)


def run_id_of(item: Commit | RunRecord) -> str:
    """The run a commit or a run record is of: the key of a store's grouped commits and run
    creations (a run's calls are never in two batches under way at once)."""
    return item.run_id


def runs_read(found: Mapping[str, RunRecord], run_ids: Sequence[str]) -> list[RunRecord | None]:
    """The run of each of ``run_ids`` among ``found`` (None if not stored), in their order:
    a grouped read's answers, each caller's record its own, also for an id read twice."""
    answers: list[RunRecord | None] = []
    given: set[str] = set()
    for run_id in run_ids:
        run = found.get(run_id)
        if run is not None and run_id in given:
            run = dataclasses.replace(run)
        given.add(run_id)
        answers.append(run)
    return answers


class GroupCommitter(GroupCalls[Commit, None]):
    """Writes one store's commits, alone when nothing is in flight, else in batches.

    Args:
        write_one: writes one commit (raises its error).
        write_many: writes commits together, one outcome per commit, in their order; an
            error it raises is every commit's.
        max_batch: commits per batch at most.
        in_flight: batches under way at once at most (a run's commits never in two).
        wake_per_turn: runs of written batches that go on in one turn of the loop at most.
    """

    def __init__(
        self,
        write_one: WriteOne,
        write_many: WriteMany,
        max_batch: int = MAX_BATCH,
        in_flight: int = 1,
        wake_per_turn: int = WAKE_PER_TURN,
        max_pending: int | None = None,
    ):
        super().__init__(
            write_one,
            write_many,
            run_id_of,
            max_batch,
            in_flight,
            wake_per_turn,
            weight=Commit.size,
            max_weight=COMMIT_MAX_BYTES,
        )
        self._written: dict[int, float] = {}  # id(commit) -> when its batch was written
        self._gate: StepGate | None = None
        if max_pending is not None:
            self._gate = StepGate(lambda: self.pending, max_pending)
            # Half of them at most in one batch: while one is written, the next is formed
            # (the runs let go meanwhile make its commits), so the store never waits for
            # the process, nor the process for the store.
            self._max_batch = min(self._max_batch, max(1, max_pending // 2))

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
            for latencies, steps_only in _latency_lists:
                if commit.steps or not steps_only:
                    latencies.append(written - started)

    def step_admission(self) -> Awaitable[None] | None:
        """None when a run may start its next step now; else what it awaits first (see
        :class:`~nestegg.checkpoint.stores.step_gate.StepGate`); the commits pending are
        this loop's (a loop that ended left its own)."""
        if self._gate is None:
            return None
        self._this_loop()
        return self._gate.admission()

    def _room_made(self) -> None:
        if self._gate is not None:
            self._gate.room_made()

    def _settled(self, batch: list[tuple[Commit, asyncio.Future[None]]]) -> None:
        if _latency_lists:
            now = time.perf_counter()
            self._written.update((id(c), now) for c, future in batch if not future.cancelled())


_latency_lists: list[tuple[list[float], bool]] = []


@contextmanager
def commit_latencies(*, steps_only: bool = False) -> Iterator[list[float]]:
    """Collects, while open, the seconds every group-committed store commit of this process
    takes to be written: from its arrival to its outcome (its batch written), not counting
    the wait of its run for its turn on the event loop afterwards. ``steps_only``: only the
    commits that write a step (a step's commit, which its run waits for before it goes on),
    not a run's opening or a step's start published while it runs."""
    latencies: list[float] = []
    entry = (latencies, steps_only)
    _latency_lists.append(entry)
    try:
        yield latencies
    finally:  # by identity: two measurements' lists may be equal
        _latency_lists[:] = [other for other in _latency_lists if other is not entry]


async def outcome_of(one: Callable[[T], Awaitable[R]], item: T) -> R | BaseException:
    """``one(item)``'s result, or its error."""
    try:
        return await one(item)
    except Exception as error:
        return error


__all__ = [
    "MAX_BATCH",
    "WAKE_PER_TURN",
    "GroupCalls",
    "GroupCommitter",
    "Outcome",
    "commit_latencies",
    "outcome_of",
    "runs_read",
    "run_id_of",
]
