"""The batching of store calls (group commit) itself, with calls that wait until told."""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Sequence

from nestegg.checkpoint.stores.group import WAKE_PER_TURN, GroupCalls


class Calls:
    """Calls ``"run:n"`` that each wait for their own release; records what went together."""

    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.release: dict[str, asyncio.Event] = {}

    async def one(self, item: str) -> str:
        await self._sent([item])
        return item.upper()

    async def many(self, items: Sequence[str]) -> list[str | BaseException]:
        await self._sent(list(items))
        return [item.upper() for item in items]

    async def _sent(self, items: list[str]) -> None:
        self.sent.append(items)
        await self.release.setdefault(items[0], asyncio.Event()).wait()

    def let_go(self, item: str) -> None:
        self.release.setdefault(item, asyncio.Event()).set()


def run_of(item: str) -> str:
    return item.split(":")[0]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_batches_go_out_beside_one_under_way_but_never_two_calls_of_a_run() -> None:
    calls = Calls()
    group = GroupCalls(calls.one, calls.many, run_of, in_flight=2)
    a1 = asyncio.create_task(group.call("a:1"))
    await settle()
    b1, c1 = (asyncio.create_task(group.call(item)) for item in ("b:1", "c:1"))
    await settle()
    assert calls.sent == [["a:1"], ["b:1", "c:1"]]  # the batch did not wait for a:1
    a2, d1 = (asyncio.create_task(group.call(item)) for item in ("a:2", "d:1"))
    await settle()
    assert len(calls.sent) == 2  # two under way: the others wait
    calls.let_go("b:1")
    await settle()
    assert calls.sent[2] == ["d:1"]  # a:2 waits for a:1, its run's call under way
    assert await b1 == "B:1" and await c1 == "C:1"
    calls.let_go("a:1")
    await settle()
    assert calls.sent[3] == ["a:2"]
    calls.let_go("a:2")
    calls.let_go("d:1")
    assert [await t for t in (a1, a2, d1)] == ["A:1", "A:2", "D:1"]
    await group.drain()


async def test_one_in_flight_sends_what_waited_once_the_call_under_way_ends() -> None:
    calls = Calls()
    group = GroupCalls(calls.one, calls.many, run_of)
    first = asyncio.create_task(group.call("a:1"))
    await settle()
    rest = [asyncio.create_task(group.call(item)) for item in ("b:1", "a:2", "c:1")]
    await settle()
    assert calls.sent == [["a:1"]]
    calls.let_go("a:1")
    await settle()
    assert calls.sent[1] == ["b:1", "a:2", "c:1"]  # in the order they came
    calls.let_go("b:1")
    assert [await t for t in (first, *rest)] == ["A:1", "B:1", "A:2", "C:1"]


async def test_a_batch_holds_no_more_bytes_than_its_weight_allows_and_keeps_each_runs_order() -> (
    None
):
    """Calls weighed by the number after the colon: at most 10 a batch (one heavier call
    goes alone); a run's later call never overtakes one of its calls left for later."""
    calls = Calls()
    weight = lambda item: int(item.split(":")[1])  # noqa: E731
    group = GroupCalls(calls.one, calls.many, run_of, weight=weight, max_weight=10)
    first = asyncio.create_task(group.call("a:1"))
    await settle()
    items = ("b:6", "c:5", "b:1", "d:4", "c:1", "e:30", "f:1")
    rest = [asyncio.create_task(group.call(item)) for item in items]
    await settle()
    for item in ("a:1", "b:6", "c:5", "e:30"):  # each batch's first call
        calls.let_go(item)
        await settle()
    assert [await t for t in (first, *rest)] == ["A:1", *(item.upper() for item in items)]
    # c:5 does not fit beside b:6 (a run's calls may share a batch), nor d:4 after it;
    # c:1 would, but waits for c:5; e:30 fits beside nothing: it goes alone
    assert calls.sent == [["a:1"], ["b:6", "b:1", "f:1"], ["c:5", "d:4", "c:1"], ["e:30"]]
    await group.drain()


async def test_drain_waits_for_calls_queued_behind_a_call_made_alone() -> None:
    calls = Calls()
    group = GroupCalls(calls.one, calls.many, run_of)
    first = asyncio.create_task(group.call("a:1"))
    await settle()
    queued = asyncio.create_task(group.call("b:1"))
    await settle()
    drained = asyncio.create_task(group.drain())
    await asyncio.sleep(0.01)
    assert not drained.done()  # b:1 still waits behind a:1
    calls.let_go("a:1")
    calls.let_go("b:1")
    await asyncio.wait_for(drained, 1)
    assert calls.sent == [["a:1"], ["b:1"]]
    assert await first == "A:1" and await queued == "B:1"


async def test_the_callers_of_a_big_batch_go_on_a_few_per_turn_of_the_loop_oldest_first() -> None:
    calls = Calls()
    group = GroupCalls(calls.one, calls.many, run_of)
    loop = asyncio.get_running_loop()
    turn = [0]
    woken: list[tuple[str, int]] = []

    def tick() -> None:  # runs once in every turn of the loop
        turn[0] += 1
        if len(woken) < len(items):
            loop.call_soon(tick)

    async def caller(item: str) -> str:
        result = await group.call(item)
        woken.append((item, turn[0]))
        return result

    first = asyncio.create_task(group.call("a:1"))
    await settle()
    items = [f"r{n}:1" for n in range(2 * WAKE_PER_TURN + 5)]
    tasks = [asyncio.create_task(caller(item)) for item in items]
    await settle()
    calls.let_go("a:1")
    await settle()
    assert calls.sent[1] == items  # one batch
    loop.call_soon(tick)
    calls.let_go(items[0])
    assert await asyncio.gather(*tasks) == [item.upper() for item in items]
    assert [item for item, _ in woken] == items  # in the order they came
    per_turn = Counter(at for _, at in woken)
    assert list(per_turn.values()) == [WAKE_PER_TURN, WAKE_PER_TURN, 5]
    assert await first == "A:1"


async def test_drain_returns_once_every_caller_of_a_written_batch_is_told() -> None:
    calls = Calls()
    group = GroupCalls(calls.one, calls.many, run_of)
    first = asyncio.create_task(group.call("a:1"))
    await settle()
    items = [f"r{n}:1" for n in range(10 * WAKE_PER_TURN)]
    tasks = [asyncio.create_task(group.call(item)) for item in items]
    await settle()
    calls.let_go("a:1")
    await settle()
    assert calls.sent[1] == items  # the batch is under way
    calls.let_go(items[0])
    await group.drain()
    assert group._to_wake == deque()  # nobody left to tell: the store may close now
    assert [await t for t in (first, *tasks)] == ["A:1", *(item.upper() for item in items)]


def test_a_group_used_by_a_loop_that_ended_mid_telling_serves_the_next_loop() -> None:
    """asyncio.run after asyncio.run on one store: the first loop ends while a batch's
    callers are still being told; the calls of the second must not wait for them."""
    calls = Calls()
    group = GroupCalls(calls.one, calls.many, run_of)

    async def first_loop() -> None:
        alone = asyncio.create_task(group.call("a:1"))
        await settle()
        many = range(40 * WAKE_PER_TURN)  # more than asyncio.run's clean-up tells
        batched = [asyncio.create_task(group.call(f"r{n}:1")) for n in many]
        await settle()
        calls.let_go("a:1")
        calls.let_go("r0:1")
        await alone  # returns while most callers of the batch are still to be told
        assert not all(task.done() for task in batched)

    async def second_loop() -> list[str]:
        for item in ("b:1", "c:1", "d:1"):
            calls.let_go(item)
        waiting = [group.call(item) for item in ("b:1", "c:1", "d:1")]
        return await asyncio.wait_for(asyncio.gather(*waiting), 5)

    asyncio.run(first_loop())
    assert asyncio.run(second_loop()) == ["B:1", "C:1", "D:1"]
