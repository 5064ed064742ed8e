"""A value or a commit larger than a store takes at once fails clearly, on every store:
the input before anything is stored, a step's output or commit by failing the step and
the run (not by leaving the run to be resumed into the same refusal)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nestegg import Clutch, durable, get_context, wait_for
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy, codec
from nestegg.checkpoint.stores import common
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.constants import RECORD_MAX_BYTES
from nestegg.errors import RecordTooLargeError
from nestegg.testing import fixtures as store_fixtures
from nestegg.testing.fixtures import StoreFactory, parametrize_stores

store_factory = store_fixtures.store_factory
store_name = store_fixtures.store_name

RECORD_LIMIT = 1000
COMMIT_LIMIT = 3000
CALLS = 5
"""Journaled calls of a step, each one's result under RECORD_LIMIT, all of them over
COMMIT_LIMIT."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test once per registered store (memory, SQLite, file, PostgreSQL, Redis)."""
    parametrize_stores(metafunc)


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The limits, where they are read, small enough for a test's values to pass them."""
    monkeypatch.setattr(codec, "RECORD_MAX_BYTES", RECORD_LIMIT)
    monkeypatch.setattr(common, "COMMIT_MAX_BYTES", COMMIT_LIMIT)


def pipeline(
    store: CheckpointStorage, durability: str = "sync", gate: asyncio.Event | None = None
) -> tuple[Clutch, list[str]]:
    """Agents ``fetch`` (``CALLS`` journaled calls for ``{"calls": True}``) and ``write``
    (a large output for ``{"large": n}``, large metadata too for ``{"metadata": n}``; it
    raises for ``{"fail": True}``, waits for signal ``ok`` for ``{"wait": True}``, and
    for ``gate`` to be set first)."""
    policy = CheckpointPolicy(durability=durability)  # type: ignore[arg-type]
    clutch = Clutch("sizes", checkpoint=CheckpointConfig(storage=store, policy=policy))
    calls: list[str] = []

    @durable
    async def page(number: int) -> str:
        calls.append(f"page{number}")
        return "p" * (RECORD_LIMIT - 100)

    @clutch.agent()
    async def fetch(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("calls"):
            for number in range(CALLS):
                await page(number)
        return data

    @clutch.agent()
    async def write(data: dict[str, Any]) -> dict[str, Any]:
        calls.append("write")
        if gate is not None:
            await gate.wait()
        if data.get("wait"):
            await wait_for("ok")
        if data.get("fail"):
            raise ValueError("write failed on purpose")
        if "metadata" in data:
            get_context().metadata["notes"] = "m" * data["metadata"]
            return {"text": "w" * data["metadata"]}
        return {**data, "text": "w" * data.get("large", 1)}

    return clutch, calls


async def stored_failure(clutch: Clutch, store: CheckpointStorage, run_id: str) -> Any:
    """The error the store holds of ``run_id``, stored as failed (and its step count)."""
    run = await store.get_run(run_id)
    assert run is not None and run.status == "failed"
    [info] = await clutch.list_runs()
    assert info.error is not None
    return info.error, run.step_seq


@pytest.mark.usefixtures("small_limits")
async def test_a_too_large_input_is_refused_before_anything_is_stored(
    store_factory: StoreFactory,
) -> None:
    store = await store_factory()
    clutch, calls = pipeline(store)
    with pytest.raises(RecordTooLargeError) as refused:
        await clutch.run({"text": "i" * RECORD_LIMIT}, run_id="large-input")
    error = refused.value
    assert (error.path, error.type_name, error.limit) == ("input", "dict", RECORD_LIMIT)
    assert error.size == RECORD_LIMIT + len('{"text":""}')
    assert str(error) == (
        f"cannot store input: it is {error.size:,} bytes encoded, over the 1,000 bytes "
        "a store takes at once"
    )
    assert calls == []
    assert await store.get_run("large-input") is None
    assert await store.list_runs() == []


@pytest.mark.usefixtures("small_limits")
async def test_a_too_large_step_output_fails_the_step_and_the_run(
    store_factory: StoreFactory,
) -> None:
    store = await store_factory()
    clutch, calls = pipeline(store)
    with pytest.raises(RecordTooLargeError, match="cannot store data: it is"):
        await clutch.run({"large": RECORD_LIMIT}, run_id="large-output")
    error, steps = await stored_failure(clutch, store, "large-output")
    assert error["type"] == "RecordTooLargeError" and steps == 1
    assert (error["agent"], error["seq"]) == ("write", 2)
    kinds = [event.kind for event in await store.read_events("large-output")]
    assert kinds[-2:] == ["step_failed", "run_failed"]
    assert calls == ["write"]


@pytest.mark.usefixtures("small_limits")
async def test_a_step_whose_records_add_up_past_the_limit_fails_the_step_and_the_run(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its output and its metadata are each under the record limit, its commit is over
    # the commit limit.
    store = await store_factory()
    clutch, _ = pipeline(store)
    monkeypatch.setattr(common, "COMMIT_MAX_BYTES", RECORD_LIMIT + 500)
    with pytest.raises(RecordTooLargeError, match="the commit of step 2 of run 'sum'"):
        await clutch.run({"metadata": RECORD_LIMIT - 100}, run_id="sum")
    error, steps = await stored_failure(clutch, store, "sum")
    assert error["type"] == "RecordTooLargeError" and steps == 1
    assert (error["agent"], error["seq"]) == ("write", 2)


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("fail", [False, True], ids=["run-end", "failed-step"])
async def test_journaled_calls_adding_up_past_the_limit_fail_the_run_with_durability_exit(
    store_factory: StoreFactory, fail: bool
) -> None:
    # Durability "exit" commits the run's records once, at its end: more than a store
    # takes at once. The run is stored failed (with the error of its step if one
    # failed), not left running to be resumed into the same refusal.
    store = await store_factory()
    clutch, calls = pipeline(store, durability="exit")
    with pytest.raises(ValueError if fail else RecordTooLargeError) as raised:
        await clutch.run({"calls": True, "fail": fail}, run_id="calls")
    assert calls == [*(f"page{number}" for number in range(CALLS)), "write"]
    error, steps = await stored_failure(clutch, store, "calls")
    assert (error["type"], error["message"]) == (type(raised.value).__name__, str(raised.value))
    assert steps == 0
    assert [event.kind for event in await store.read_events("calls")][-1] == "run_failed"
    if isinstance(raised.value, RecordTooLargeError):
        assert raised.value.path == "the commit of steps 1 to 2 of run 'calls'"
        assert raised.value.limit == COMMIT_LIMIT < raised.value.size


@pytest.mark.usefixtures("small_limits")
@pytest.mark.parametrize("pause", ["wait", "checkpoint"])
async def test_journaled_calls_adding_up_past_the_limit_before_a_wait_or_a_checkpoint_fail_the_run(
    store_factory: StoreFactory, pause: str
) -> None:
    # Durability "exit" commits what the run piled up at a wait too, and at a checkpoint
    # asked from outside (served at the next step boundary): refused, the run is stored
    # failed, not left running to be resumed into the same refusal.
    store = await store_factory()
    gate = asyncio.Event()
    clutch, calls = pipeline(store, durability="exit", gate=gate)
    run = asyncio.ensure_future(clutch.run({"calls": True, "wait": pause == "wait"}, run_id="w"))
    while "write" not in calls:
        await asyncio.sleep(0.01)
    request = asyncio.ensure_future(clutch.checkpoint("w")) if pause == "checkpoint" else None
    await asyncio.sleep(0)
    gate.set()
    with pytest.raises(RecordTooLargeError) as raised:
        await run
    assert raised.value.path == "the commit of steps 1 to 2 of run 'w'"
    if request is not None:
        with pytest.raises(RecordTooLargeError):  # told, not left waiting
            await asyncio.wait_for(request, 5)
    error, steps = await stored_failure(clutch, store, "w")
    assert (error["type"], error["message"]) == ("RecordTooLargeError", str(raised.value))
    assert steps == 0
    assert [event.kind for event in await store.read_events("w")][-1] == "run_failed"
    assert await clutch.recover() == {}  # failed: no sweep takes it again
    assert calls == [*(f"page{number}" for number in range(CALLS)), "write"]


async def test_an_input_over_the_real_limit_is_refused() -> None:
    # About 130 MB at most: the string and its JSON.
    store = MemoryCheckpointStorage()
    await store.setup()
    clutch, calls = pipeline(store)
    with pytest.raises(RecordTooLargeError) as refused:
        await clutch.run("i" * (RECORD_MAX_BYTES - 1), run_id="huge")
    assert (refused.value.size, refused.value.limit) == (RECORD_MAX_BYTES + 1, RECORD_MAX_BYTES)
    assert calls == [] and await store.get_run("huge") is None
