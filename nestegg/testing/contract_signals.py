"""The store contract, signals: stored once per name and run, replaced on request, read
by any handle, deleted with their run; storing one is not fenced. A replacement sent the
way nestegg sends one keeps the time its name first came."""

from __future__ import annotations

import asyncio

import pytest

from nestegg.checkpoint.codec import seal_json
from nestegg.checkpoint.formats import parse_signal
from nestegg.checkpoint.records import SignalRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.waiting import store_signal
from nestegg.constants import COMPLETED
from nestegg.errors import RunNotFoundError, SignalExistsError
from nestegg.testing.builders import OWNER, T0, create, make_commit
from nestegg.testing.fixtures import StoreFactory

SIGNAL_RACERS = 20


def _signal(run_id: str, name: str, value: object, at: float = T0) -> SignalRecord:
    return SignalRecord(run_id, name, at, seal_json(value))


async def test_a_signal_is_stored_once_per_name(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    run = await create(store)
    assert await store.read_signals(run.run_id) == []
    first = _signal(run.run_id, "approval", {"ok": True})
    assert await store.put_signal(first) is True
    assert await store.put_signal(_signal(run.run_id, "approval", {"ok": False})) is False
    other = await store_factory()
    assert await other.read_signals(run.run_id) == [first]


async def test_replace_overwrites_a_signal(store: CheckpointStorage) -> None:
    run = await create(store)
    await store.put_signal(_signal(run.run_id, "b", 1))
    await store.put_signal(_signal(run.run_id, "a", 2))
    newer = _signal(run.run_id, "b", 3, at=T0 + 5)
    assert await store.put_signal(newer, replace=True) is True
    assert await store.read_signals(run.run_id) == [_signal(run.run_id, "a", 2), newer]


async def test_a_replaced_signal_keeps_the_time_its_name_first_came(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    # The deadline rule of wait_for reads that time: replacing a signal that came in time
    # must not make it late.
    run = await create(store)

    async def send(name: str, value: object, at: float, replace: bool) -> None:
        await store_signal(store, run.run_id, name, value, replace=replace, clock=lambda: at)

    await send("approval", "first", T0 + 1, replace=False)
    await send("approval", "second", T0 + 9, replace=True)
    await send("other", "only", T0 + 5, replace=True)  # none before: it is the first
    with pytest.raises(SignalExistsError):
        await send("approval", "third", T0 + 12, replace=False)
    read = await (await store_factory()).read_signals(run.run_id)
    assert [(s.name, s.at, parse_signal(s.body, s.name)) for s in read] == [
        ("approval", T0 + 1, "second"),
        ("other", T0 + 5, "only"),
    ]


async def test_a_signal_needs_its_run(store: CheckpointStorage) -> None:
    with pytest.raises(RunNotFoundError):
        await store.put_signal(_signal("no-such-run", "approval", 1))
    assert await store.read_signals("no-such-run") == []


async def test_a_signal_is_not_fenced(store: CheckpointStorage) -> None:
    run = await create(store)
    claimed = await store.claim_run(run.run_id, run.fence, OWNER, T0 + 30, T0)
    assert await store.put_signal(_signal(run.run_id, "go", "now"))
    await store.commit(make_commit(claimed, status=COMPLETED, updated_at=T0 + 1))
    assert [s.name for s in await store.read_signals(run.run_id)] == ["go"]


async def test_racing_signals_store_one(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    run = await create(store)
    handles = [store, await store_factory()]
    stored = await asyncio.gather(
        *(
            handles[i % 2].put_signal(_signal(run.run_id, "approval", i))
            for i in range(SIGNAL_RACERS)
        )
    )
    assert stored.count(True) == 1
    [kept] = await store.read_signals(run.run_id)
    assert kept == _signal(run.run_id, "approval", stored.index(True))


async def test_signals_go_with_their_run(store: CheckpointStorage) -> None:
    run = await create(store)
    await store.put_signal(_signal(run.run_id, "approval", 1))
    assert await store.delete_run(run.run_id)
    assert await store.read_signals(run.run_id) == []
    again = await create(store, run_id=run.run_id)
    assert await store.read_signals(again.run_id) == []
    expired = await create(store, status=COMPLETED, updated_at=T0)
    await store.put_signal(_signal(expired.run_id, "approval", 1))
    assert await store.expire_runs([COMPLETED], T0 + 1) == [expired.run_id]
    assert await store.read_signals(expired.run_id) == []
