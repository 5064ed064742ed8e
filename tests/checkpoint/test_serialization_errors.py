"""Values that cannot be stored fail the step naming their path and type, and leave the
run resumable; what model_dump() produces comes back exactly after a resume."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Awaitable, Callable
from decimal import Decimal
from enum import Enum
from typing import Any

import pytest
from pydantic import BaseModel

from nestegg import Clutch, get_context
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import CheckpointSerializationError
from nestegg.execution import StepHook

from .conftest import Flaky, config, stored_view

Reopen = Callable[[], Awaitable[CheckpointStorage]]


class Client:
    """Something no store can keep: a connection-like object."""


def build(
    store: CheckpointStorage,
    broken: dict[str, bool],
    calls: list[str],
    on_step: StepHook | None = None,
) -> Clutch:
    clutch = Clutch("serializing", on_step=on_step, checkpoint=config(store, keep_latest=None))

    @clutch.agent()
    async def fetch(data: dict[str, Any]) -> dict[str, Any]:
        calls.append("fetch")
        return {**data, "items": [0, 1, 2]}

    @clutch.agent()
    async def enrich(data: dict[str, Any]) -> dict[str, Any]:
        calls.append("enrich")
        if broken.get("data"):
            return {"items": [0, 1, 2, {"client": object()}]}
        if broken.get("nested"):
            return {"items": [0, {"deep": [{"client": Client()}]}]}
        if broken.get("int"):
            return {"items": [0, 1, 2, 10**5000]}
        if broken.get("metadata"):
            get_context().metadata["login"] = {"client": Client()}
        return {**data, "items": [*data["items"], 3]}

    @clutch.agent()
    async def publish(data: dict[str, Any]) -> dict[str, Any]:
        calls.append("publish")
        return {**data, "published": True}

    return clutch


@pytest.mark.parametrize(
    ("broken", "path", "type_name"),
    [
        ("data", "data.items[3].client", "object"),
        ("nested", "data.items[1].deep[0].client", "Client"),
        ("metadata", "metadata.login.client", "Client"),
        ("int", "data.items[3]", "int"),
    ],
)
async def test_an_unstorable_value_fails_the_step_naming_its_path_and_type(
    broken: str,
    path: str,
    type_name: str,
    checkpoint_store: CheckpointStorage,
    reopen_store: Reopen,
) -> None:
    calls: list[str] = []
    clutch = build(checkpoint_store, {broken: True}, calls)
    with pytest.raises(CheckpointSerializationError) as raised:
        await clutch.run({"q": 1}, run_id="unstorable")

    error = raised.value
    assert path in str(error) and type_name in str(error)
    assert error.path == path and error.type_name == type_name
    [info] = await clutch.list_runs()
    assert info.status == "failed" and info.steps == 1
    assert info.error is not None and info.error["type"] == "CheckpointSerializationError"
    assert info.error["agent"] == "enrich" and path in info.error["message"]

    fixed: list[str] = []
    restarted = build(await reopen_store(), {}, fixed)
    result = await restarted.resume_latest("unstorable")
    assert result == {"q": 1, "items": [0, 1, 2, 3], "published": True}
    assert calls == ["fetch", "enrich"] and fixed == ["enrich", "publish"]


async def test_an_unstorable_value_changes_nothing_already_stored(
    checkpoint_store: CheckpointStorage,
) -> None:
    calls: list[str] = []
    before: list[dict[str, Any]] = []

    async def on_step(agent: str, data: Any, output: Any) -> None:
        if agent == "enrich":
            before.append(await stored_view(checkpoint_store, "intact"))

    clutch = build(checkpoint_store, {"data": True}, calls, on_step)
    with pytest.raises(CheckpointSerializationError):
        await clutch.run({"q": 1}, run_id="intact")
    [stored] = before
    after = await stored_view(checkpoint_store, "intact")

    assert after["steps"] == stored["steps"] and [s.seq for s in stored["steps"]] == [1]
    assert after["checkpoints"] == stored["checkpoints"]
    assert after["events"][: len(stored["events"])] == stored["events"]
    assert [e.kind for e in after["events"][len(stored["events"]) :]] == [
        "step_started",
        "step_failed",
        "run_failed",
    ]
    for field in ("input", "result", "created_at", "pipeline", "step_seq", "fence"):
        assert after["run"][field] == stored["run"][field]
    assert after["run"]["status"] == "failed"


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        ([1, {"client": Client()}], "input.q[1].client", "Client"),
        ({"a": 10**5000}, "input.q.a", "int"),
    ],
)
async def test_an_unstorable_input_is_refused_before_anything_is_stored(
    value: Any, path: str, type_name: str, checkpoint_store: CheckpointStorage
) -> None:
    calls: list[str] = []
    clutch = build(checkpoint_store, {}, calls)
    with pytest.raises(CheckpointSerializationError) as raised:
        await clutch.run({"q": value}, run_id="bad-input")
    assert raised.value.path == path
    assert raised.value.type_name == type_name
    assert calls == []
    assert await checkpoint_store.get_run("bad-input") is None
    assert await clutch.list_runs() == []


# ------------------------------------------------------------------- round trips


class Color(Enum):
    """An Enum field."""

    RED = "red"
    GREEN = "green"


class Line(BaseModel):
    """A nested model."""

    sku: uuid.UUID
    price: Decimal
    blob: bytes
    color: Color


class Order(BaseModel):
    """A model with every kind of value model_dump() produces."""

    placed: dt.datetime
    placed_naive: dt.datetime
    day: dt.date
    lines: list[Line]
    note: str | None = None


ORDER = Order(
    placed=dt.datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=dt.timezone(dt.timedelta(hours=5))),
    placed_naive=dt.datetime(1999, 12, 31, 0, 0, 1),
    day=dt.date(2000, 1, 1),
    lines=[
        Line(
            sku=uuid.UUID("12345678-1234-5678-1234-567812345678"),
            price=Decimal("10.50"),
            blob=b"\x00\xff binary \n",
            color=Color.GREEN,
        ),
        Line(sku=uuid.uuid4(), price=Decimal("-0.000"), blob=b"", color=Color.RED),
    ],
)


def typed_pipeline(
    store: CheckpointStorage, seen: list[tuple[str, Any]], fail: list[bool]
) -> Clutch:
    clutch = Clutch("typed-values", checkpoint=config(store))

    @clutch.agent()
    async def take(data: dict[str, Any]) -> Order:
        get_context().metadata["order"] = ORDER.model_dump()
        return ORDER

    @clutch.agent()
    async def price(order: Order) -> Order:
        seen.append(("price", order))
        return order

    @clutch.agent()
    async def ship(order: Order) -> Order:
        seen.append(("ship", order))
        seen.append(("metadata", get_context().metadata["order"]))
        seen.append(("history", get_context().state.history[-1]["data"]))
        if fail and fail.pop():
            raise Flaky("ship failed on purpose")
        return order

    @clutch.agent()
    async def inspect(data: dict[str, Any]) -> dict[str, Any]:
        seen.append(("plain", data))
        return data

    return clutch


async def test_model_dump_values_round_trip_exactly_through_a_resume(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    whole: list[tuple[str, Any]] = []
    result = await typed_pipeline(checkpoint_store, whole, []).run({}, run_id="whole")

    before: list[tuple[str, Any]] = []
    with pytest.raises(Flaky):
        await typed_pipeline(checkpoint_store, before, [True]).run({}, run_id="cut")
    after: list[tuple[str, Any]] = []
    resumed = await typed_pipeline(await reopen_store(), after, []).resume_latest("cut")

    ship_input = after[0][1]
    assert type(ship_input) is Order and ship_input == ORDER
    assert before[1:4] == after[:3]
    assert before[:1] + after == whole
    assert repr(before[:1] + after) == repr(whole)
    plain = after[-1][1]
    assert type(plain["placed"]) is dt.datetime and plain["placed"].utcoffset() == dt.timedelta(
        hours=5
    )
    assert plain["placed_naive"].tzinfo is None
    assert type(plain["day"]) is dt.date
    assert type(plain["lines"][0]["sku"]) is uuid.UUID
    assert str(plain["lines"][0]["price"]) == "10.50"
    assert str(plain["lines"][1]["price"]) == "-0.000"
    assert plain["lines"][0]["blob"] == b"\x00\xff binary \n"
    assert plain["lines"][0]["color"] is Color.GREEN
    assert resumed == result == ORDER.model_dump()
    assert repr(resumed) == repr(result)


async def test_checkpoint_state_round_trips_the_values(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    await typed_pipeline(checkpoint_store, [], []).run({}, run_id="state")
    restarted = typed_pipeline(await reopen_store(), [], [])
    [*_, last] = await restarted.list_checkpoints("state")
    state = await restarted.get_checkpoint(last.checkpoint_id)
    assert repr(state.data) == repr(ORDER.model_dump())
    assert repr(state.metadata) == repr({"order": ORDER.model_dump()})
    assert [h["source"] for h in state.history] == ["input", "take", "price", "ship"]
    assert repr(state.history[1]["data"]) == repr(ORDER.model_dump())
    assert repr(await restarted.run({}, run_id="state")) == repr(ORDER.model_dump())
