"""Steps held back while a store's commits pile up (``max_pending_commits``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.group import GroupCommitter, Outcome
from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.constants import MAX_PENDING_COMMITS
from nestegg.errors import ConfigurationError


class Writes:
    """Commits that are written when a test says so, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.written: asyncio.Queue[asyncio.Event] = asyncio.Queue()

    async def one(self, commit: Commit) -> None:
        await self._write([commit])

    async def many(self, commits: Sequence[Commit]) -> list[Outcome]:
        await self._write(list(commits))
        return [None] * len(commits)

    async def _write(self, commits: list[Commit]) -> None:
        self.batches.append([c.run_id for c in commits])
        done = asyncio.Event()
        self.written.put_nowait(done)
        await done.wait()

    async def write_next(self) -> None:
        """Let the oldest write under way end."""
        (await self.written.get()).set()
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_steps_wait_once_the_limit_of_pending_commits_is_reached_and_go_on_oldest_first() -> (
    None
):
    writes = Writes()
    group = GroupCommitter(writes.one, writes.many, max_pending=4)  # batches of 2 at most
    commits = [asyncio.create_task(group.commit(Commit(f"r{i}", 1))) for i in range(4)]
    await settle()
    assert group.pending == 4
    held = [group.step_admission() for _ in range(3)]
    assert all(wait is not None for wait in held)
    order: list[int] = []

    async def step(index: int, wait: Any) -> None:
        await wait
        order.append(index)
        await group.commit(Commit(f"s{index}", 1))  # the step's own commit

    steps = [asyncio.create_task(step(i, wait)) for i, wait in enumerate(held)]
    await settle()
    assert order == []  # four commits pending: no step starts
    await writes.write_next()  # r0, written alone
    assert order == [0]  # one place: the oldest step goes on (and commits)
    assert group.pending == 4
    await writes.write_next()  # r1 and r2
    assert order == [0, 1, 2]
    assert group.pending == 4
    assert writes.batches == [["r0"], ["r1", "r2"], ["r3", "s0"]]
    for _ in range(2):
        await writes.write_next()
    await asyncio.gather(*commits, *steps)
    assert group.step_admission() is None  # nothing pending: a step starts at once


async def test_a_held_step_that_is_cancelled_takes_no_place() -> None:
    writes = Writes()
    group = GroupCommitter(writes.one, writes.many, max_pending=1)
    commit = asyncio.create_task(group.commit(Commit("r0", 1)))
    await settle()
    first, second = (asyncio.ensure_future(group.step_admission()) for _ in range(2))  # type: ignore[arg-type]
    await settle()
    first.cancel()
    await writes.write_next()
    assert first.cancelled() and second.done()  # the place went to the next step held
    await commit
    assert group.step_admission() is None  # the step let go started and did not commit


async def test_without_a_limit_no_step_is_held_back() -> None:
    writes = Writes()
    group = GroupCommitter(writes.one, writes.many)
    commits = [asyncio.create_task(group.commit(Commit(f"r{i}", 1))) for i in range(100)]
    await settle()
    assert group.pending == 100 and group.step_admission() is None
    await writes.write_next()
    await writes.write_next()
    await asyncio.gather(*commits)


def test_a_store_used_by_a_loop_that_ended_holds_no_step_of_it_back() -> None:
    writes_of: dict[str, Writes] = {}

    async def one(commit: Commit) -> None:
        await writes_of["now"].one(commit)

    async def many(commits: Sequence[Commit]) -> list[Outcome]:
        return await writes_of["now"].many(commits)

    group = GroupCommitter(one, many, max_pending=1)

    async def held_at_the_end() -> None:
        writes_of["now"] = Writes()
        left = [asyncio.ensure_future(group.commit(Commit("r0", 1)))]
        await settle()
        left.append(asyncio.ensure_future(group.step_admission()))  # type: ignore[arg-type]
        await settle()  # the loop ends with the commit and the step held
        assert not any(task.done() for task in left)

    async def next_loop() -> bool:
        writes_of["now"] = Writes()
        return group.step_admission() is None

    asyncio.run(held_at_the_end())
    assert asyncio.run(next_loop())


def forget(tasks: list[Any]) -> None:
    """Close the coroutines of tasks a closed loop left, now rather than when collected."""
    for task in tasks:
        task._log_destroy_pending = False
        task.get_coro().close()


def test_a_loop_that_ended_without_cancelling_its_tasks_holds_no_step_of_the_next_back() -> None:
    async def never(*_: Any) -> Any:
        await asyncio.Event().wait()

    group = GroupCommitter(never, never, max_pending=2)
    left = asyncio.new_event_loop()

    async def piled_up() -> list[Any]:
        commits = [asyncio.ensure_future(group.commit(Commit(f"r{i}", 1))) for i in range(2)]
        await settle()
        return [*commits, group.step_admission()]

    abandoned = left.run_until_complete(piled_up())  # ends with two commits pending
    assert group.pending == 2 and abandoned[-1] is not None
    left.close()  # its tasks never cancelled, never go on

    async def next_loop() -> bool:
        return group.step_admission() is None

    try:
        assert asyncio.run(next_loop())  # none of this loop's commits is pending
    finally:
        forget(abandoned[:2])


def test_a_commit_of_the_next_loop_goes_through_a_step_an_ended_loop_left_held() -> None:
    stuck = [True]  # the first loop's commit is never written

    async def one(commit: Commit) -> None:
        if stuck[0]:
            await asyncio.Event().wait()

    async def many(commits: Sequence[Commit]) -> list[Outcome]:
        return [None] * len(commits)

    group = GroupCommitter(one, many, max_pending=1)
    left = asyncio.new_event_loop()

    async def held_at_the_end() -> list[Any]:
        commit = asyncio.ensure_future(group.commit(Commit("r0", 1)))
        await asyncio.sleep(0)
        return [commit, group.step_admission()]

    abandoned = left.run_until_complete(held_at_the_end())  # a step held, never told
    assert abandoned[-1] is not None and not abandoned[-1].done()
    left.close()

    stuck[0] = False

    async def next_loop() -> None:
        await group.commit(Commit("r1", 1))  # made room: the old loop's step is not told
        assert group.step_admission() is None

    try:
        asyncio.run(next_loop())
    finally:
        forget(abandoned[:1])


# ------------------------------------------------------------ runs on real stores


@pytest.fixture(params=["sqlite", "postgres", "redis"])
async def limited_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A set-up store of each group-committing kind that lets 8 commits pend at most."""
    prefix = f"adm_{uuid.uuid4().hex[:8]}_"
    if request.param == "sqlite":
        store: Any = SQLiteCheckpointStorage(tmp_path / "n.db", max_pending_commits=8)
    elif request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        store = PostgresCheckpointStorage(url, table_prefix=prefix, max_pending_commits=8)
    else:
        url = request.getfixturevalue("redis_url")
        store = RedisCheckpointStorage(url, prefix=prefix.replace("_", ":"), max_pending_commits=8)
    await store.setup()
    yield store
    if request.param != "sqlite":
        await store.drop()
    await store.close()


async def test_many_runs_at_once_keep_to_the_limit_and_each_ends_with_its_own_steps(
    limited_store: Any,
) -> None:
    store = limited_store
    pending_at_arrival: list[int] = []
    held: list[bool] = []
    commit, admission = store.commit, store.step_admission

    async def counted_commit(change: Commit) -> None:
        pending_at_arrival.append(store._group.pending)
        await commit(change)

    def counted_admission() -> Any:
        wait = admission()
        held.append(wait is not None)
        return wait

    store.commit, store.step_admission = counted_commit, counted_admission
    policy = CheckpointPolicy(every_n_steps=1, durability="sync")
    clutch = Clutch(
        "held",
        strategy=Strategy.SEQUENTIAL,
        checkpoint=CheckpointConfig(storage=store, policy=policy),
    )

    @clutch.agent()
    async def first(data: list[str]) -> list[str]:
        return [*data, "first"]

    @clutch.agent()
    async def second(data: list[str]) -> list[str]:
        return [*data, "second"]

    @clutch.agent()
    async def third(data: list[str]) -> list[str]:
        return [*data, "third"]

    results = await asyncio.gather(
        *(clutch.run([f"run {i}"], run_id=f"h{i}", timeout=60) for i in range(60))
    )
    assert results == [[f"run {i}", "first", "second", "third"] for i in range(60)]
    assert any(held)  # steps were held back
    assert max(pending_at_arrival) <= 8  # never more than the limit pending (and to come)
    for i in (0, 59):
        run = await store.get_run(f"h{i}")
        assert run is not None and run.status == "completed" and run.step_seq == 3


@pytest.mark.parametrize("given", [0, -1, True, 2.5, "8"])
def test_a_limit_that_is_not_a_positive_int_is_refused_by_name(
    given: object, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        SQLiteCheckpointStorage(tmp_path / "n.db", max_pending_commits=given)  # type: ignore[arg-type]
    assert str(raised.value).startswith(
        f"SQLiteCheckpointStorage takes max_pending_commits= a positive integer or None, got "
        f"max_pending_commits={given!r}"
    )
    assert not (tmp_path / "n.db").exists()
    for store in (PostgresCheckpointStorage, RedisCheckpointStorage):
        with pytest.raises(
            ConfigurationError,
            match=f"{store.__name__} takes max_pending_commits= a positive integer or None, ",
        ):
            store(
                "postgresql://x/y" if store is PostgresCheckpointStorage else "redis://x",
                max_pending_commits=given,
            )  # type: ignore[operator]


def test_no_limit_by_default_and_the_limit_given(tmp_path: Path) -> None:
    assert MAX_PENDING_COMMITS is None
    assert SQLiteCheckpointStorage(tmp_path / "a.db")._group._gate is None
    limited = SQLiteCheckpointStorage(tmp_path / "b.db", max_pending_commits=64)
    assert limited._group._gate is not None and limited._group._gate.max_pending == 64
