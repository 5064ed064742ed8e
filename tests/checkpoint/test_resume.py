"""Resuming: from the newest checkpoint, from the input, from one checkpoint; what comes
back (data, position in every strategy, turn, history, metadata); a changed pipeline."""

from __future__ import annotations

import copy
import datetime as dt
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel, ValidationError

from nestegg import Clutch, Handover, Strategy, get_context
from nestegg.checkpoint.records import Commit, Owner
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.errors import (
    CheckpointNotFoundError,
    ConfigurationError,
    IncompatibleCheckpointError,
    IncompatibleDataError,
    RunNotFoundError,
    StorageUnavailableError,
)
from nestegg.testing.builders import make_run

from .conftest import Flaky, Pipeline, config, stored_view

Reopen = Callable[[], Awaitable[CheckpointStorage]]


# ------------------------------------------------------------------ resume_latest


async def test_resume_latest_continues_after_the_newest_checkpoint(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c", "d"), run_id="job")
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([])
    assert pipeline.calls == ["a", "b", "c"]

    restarted = Pipeline(await reopen_store(), ("a", "b", "c", "d"), run_id="job")
    assert await restarted.clutch.resume_latest() == ["a", "b", "c", "d"]
    assert restarted.calls == ["c", "d"]
    [info] = await restarted.clutch.list_runs()
    assert info.status == "completed" and info.steps == 4


async def test_resume_latest_of_a_failed_run_retries_exactly_the_failed_step(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c", "d", "e"))
    pipeline.fail.add("d")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="retry")
    with pytest.raises(Flaky):
        await pipeline.clutch.resume_latest("retry")
    assert pipeline.calls == ["a", "b", "c", "d", "d"]

    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("retry") == ["a", "b", "c", "d", "e"]
    assert pipeline.calls == ["a", "b", "c", "d", "d", "d", "e"]


async def test_a_resumed_run_goes_on_with_its_datetimes_in_their_time_zone(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    """A datetime in a time zone comes back in that zone, not at a fixed offset: a day
    added after the resume crosses the clock change as it would have without the stop."""
    berlin = ZoneInfo("Europe/Berlin")
    failing = [True]

    def pipeline(store: CheckpointStorage) -> Clutch:
        clutch = Clutch("zones", checkpoint=config(store, run_id="zoned"))

        @clutch.agent()
        async def book(data: dict[str, Any]) -> dict[str, Any]:
            return {"at": dt.datetime(2026, 3, 28, 12, 0, tzinfo=berlin)}

        @clutch.agent()
        async def next_day(data: dict[str, Any]) -> dict[str, Any]:
            if failing[0]:
                raise Flaky("stopped")
            return {"at": data["at"] + dt.timedelta(days=1)}

        return clutch

    with pytest.raises(Flaky):
        await pipeline(checkpoint_store).run({})
    failing[0] = False
    result = await pipeline(await reopen_store()).resume_latest()
    assert result["at"].tzinfo is berlin and result["at"].tzname() == "CEST"
    assert result["at"] == dt.datetime(2026, 3, 29, 12, 0, tzinfo=berlin)


async def test_resume_latest_starts_from_the_input_when_there_is_no_checkpoint(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, every_n_steps=100)
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["in"], run_id="bare")
    # A crash before any checkpoint: the run is left running, its owner gone, and none
    # of its checkpoints made it to the store.
    checkpoints = await checkpoint_store.list_checkpoints("bare")
    await checkpoint_store.delete_checkpoints("bare", [c.checkpoint_id for c in checkpoints])
    run = await checkpoint_store.get_run("bare")
    assert run is not None
    gone = Owner(host="elsewhere#00000000", pid=1, started="1")
    await checkpoint_store.claim_run(
        "bare", run.fence, gone, time.time() - 1, time.time(), reopen=True
    )
    assert await pipeline.clutch.list_checkpoints("bare") == []

    pipeline.fail.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("bare") == ["in", "a", "b", "c"]
    assert pipeline.calls == ["a", "b", "c"]
    resumed = [e for e in await pipeline.clutch.events("bare") if e.kind == "run_resumed"]
    assert resumed[-1].data["checkpoint_id"] is None and resumed[-1].data["seq"] == 0


async def test_a_run_killed_before_its_start_was_committed_logs_its_start_when_resumed(
    checkpoint_store: CheckpointStorage,
) -> None:
    # Stored and claimed, then its process died before the first commit (run_started).
    await checkpoint_store.setup()
    created = make_run("unstarted", pipeline="pipeline", input_value=["in"])
    await checkpoint_store.create_run(created)
    gone = Owner(host="elsewhere#00000000", pid=1, started="1")
    await checkpoint_store.claim_run("unstarted", created.fence, gone, time.time() - 1, time.time())
    pipeline = Pipeline(checkpoint_store)
    assert await pipeline.clutch.resume_latest("unstarted") == ["in", "a", "b", "c"]
    kinds = [e.kind for e in await pipeline.clutch.events("unstarted")]
    assert kinds[:3] == ["run_started", "run_interrupted", "run_resumed"]
    assert kinds[-1] == "run_completed"


async def test_resume_latest_of_a_run_failed_at_its_first_step_reruns_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    pipeline.fail.add("a")
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["x"], run_id="first")
    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("first") == ["x", "a", "b", "c"]
    assert pipeline.calls == ["a", "a", "b", "c"]


async def test_resume_latest_of_an_unknown_run_raises_run_not_found(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, run_id="configured")
    with pytest.raises(RunNotFoundError, match="configured"):
        await pipeline.clutch.resume_latest()
    with pytest.raises(RunNotFoundError, match="nope"):
        await pipeline.clutch.resume_latest("nope")
    unconfigured = Pipeline(checkpoint_store)
    with pytest.raises(ConfigurationError, match="run_id"):
        await unconfigured.clutch.resume_latest()
    assert pipeline.calls == [] and await checkpoint_store.get_run("nope") is None


async def test_resume_latest_of_a_completed_run_returns_its_result(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="complete")
    before = await stored_view(checkpoint_store, "complete")
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("complete") == ["a", "b", "c"]
    assert pipeline.calls == []
    assert await stored_view(checkpoint_store, "complete") == before


@pytest.mark.parametrize("completed", [False, True], ids=["failed", "completed"])
async def test_resume_of_a_run_of_another_pipeline_is_refused(
    checkpoint_store: CheckpointStorage, completed: bool
) -> None:
    """Failed or completed: a Clutch does not hand out another pipeline's result either."""
    pipeline = Pipeline(checkpoint_store)
    if completed:
        await pipeline.clutch.run([], run_id="mine")
    else:
        pipeline.fail.add("b")
        with pytest.raises(Flaky):
            await pipeline.clutch.run([], run_id="mine")
    before = await stored_view(checkpoint_store, "mine")
    stranger = Pipeline(checkpoint_store, name="stranger")
    message = "run 'mine' belongs to pipeline 'pipeline', not 'stranger'"
    with pytest.raises(ConfigurationError, match=f"^{message}$"):
        await stranger.clutch.resume_latest("mine")
    assert stranger.calls == []
    assert await stored_view(checkpoint_store, "mine") == before


# ------------------------------------------------------------------------ resume


async def test_resume_from_a_checkpoint_reruns_the_steps_after_it(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c", "d"), keep_latest=None)
    await pipeline.clutch.run([], run_id="again")
    checkpoints = await pipeline.clutch.list_checkpoints("again")
    assert [c.seq for c in checkpoints] == [1, 2, 3, 4]

    restarted = Pipeline(await reopen_store(), ("a", "b", "c", "d"), keep_latest=None)
    assert await restarted.clutch.resume(checkpoints[1].checkpoint_id) == ["a", "b", "c", "d"]
    assert restarted.calls == ["c", "d"]
    after = await restarted.clutch.list_checkpoints("again")
    assert [c.checkpoint_id for c in after[:2]] == [c.checkpoint_id for c in checkpoints[:2]]
    assert [c.seq for c in after] == [1, 2, 3, 4]
    [info] = await restarted.clutch.list_runs()
    assert info.status == "completed" and info.steps == 4


async def test_resume_of_an_unknown_checkpoint_raises_checkpoint_not_found(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="known")
    before = await stored_view(checkpoint_store, "known")
    with pytest.raises(CheckpointNotFoundError, match="0000-no-such"):
        await pipeline.clutch.resume("0000-no-such")
    with pytest.raises(CheckpointNotFoundError):
        await pipeline.clutch.get_checkpoint("0000-no-such")
    assert await stored_view(checkpoint_store, "known") == before


# ------------------------------------------------------------- what is restored


@dataclass
class Scenario:
    """A pipeline in one strategy whose agents trace what they see."""

    strategy: Strategy
    build: Callable[[Clutch, Trace], None]
    max_turns: int = 100
    uses_selector: bool = False


@dataclass
class Trace:
    """What each agent call saw; ``fail_at`` makes that call (1-based) raise once."""

    fail_at: int | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def see(self, name: str, data: Any) -> None:
        ctx = get_context()
        self.calls.append(
            {
                "agent": name,
                "data": copy.deepcopy(data),
                "turn": ctx.state.turn,
                "history": copy.deepcopy(ctx.state.history),
                "metadata": copy.deepcopy(ctx.metadata),
                "source": ctx.source,
            }
        )
        ctx.metadata[f"seen-{len(ctx.state.history)}"] = {"by": name, "turn": ctx.state.turn}
        if self.fail_at is not None and len(agent_calls(self)) == self.fail_at:
            self.failed.append(name)
            self.calls.pop()
            raise Flaky(f"{name} failed on purpose")


def tracing(trace: Trace, name: str, handover_to: str | None = None) -> Any:
    async def agent(data: list[str]) -> list[str]:
        trace.see(name, data)
        if handover_to is not None:
            raise Handover(handover_to, [*data, name])
        return [*data, name]

    agent.__name__ = agent.__qualname__ = name
    return agent


def _sequential(clutch: Clutch, trace: Trace) -> None:
    for name in ("a", "b", "c", "d"):
        clutch.agent()(tracing(trace, name))


def _sequential_with_handover(clutch: Clutch, trace: Trace) -> None:
    clutch.agent()(tracing(trace, "a", handover_to="c"))
    for name in ("b", "c", "d"):
        clutch.agent()(tracing(trace, name))


def _round_robin(clutch: Clutch, trace: Trace) -> None:
    for name in ("a", "b", "c"):
        clutch.agent()(tracing(trace, name))


def _graph(clutch: Clutch, trace: Trace) -> None:
    clutch.agent(edges=["c"])(tracing(trace, "a"))
    clutch.agent()(tracing(trace, "b"))
    clutch.agent(edges=["b"])(tracing(trace, "c"))


def _graph_with_handover(clutch: Clutch, trace: Trace) -> None:
    clutch.agent(edges=["b"])(tracing(trace, "a", handover_to="c"))
    clutch.agent(edges=["c"])(tracing(trace, "b"))
    clutch.agent(edges=["d"])(tracing(trace, "c"))
    clutch.agent()(tracing(trace, "d"))


def _selector(clutch: Clutch, trace: Trace) -> None:
    for name in ("a", "b", "c"):
        clutch.agent()(tracing(trace, name))

    @clutch.selector
    async def choose(data: list[str]) -> str | None:
        trace.calls.append({"agent": "<selector>", "data": list(data)})
        names = ["c", "a", "b"]
        return names[len(data)] if len(data) < len(names) else None


def _selector_with_handover(clutch: Clutch, trace: Trace) -> None:
    clutch.agent()(tracing(trace, "triage", handover_to="x"))
    clutch.agent()(tracing(trace, "x"))
    clutch.agent()(tracing(trace, "y"))

    @clutch.selector
    async def choose(data: list[str]) -> str | None:
        trace.calls.append({"agent": "<selector>", "data": list(data)})
        if not data:
            return "triage"
        return "y" if data[-1] == "x" else None


SCENARIOS = {
    "sequential": Scenario(Strategy.SEQUENTIAL, _sequential),
    "sequential-handover": Scenario(Strategy.SEQUENTIAL, _sequential_with_handover),
    "round-robin": Scenario(Strategy.ROUND_ROBIN, _round_robin, max_turns=7),
    "graph": Scenario(Strategy.GRAPH, _graph),
    "graph-handover": Scenario(Strategy.GRAPH, _graph_with_handover),
    "selector": Scenario(Strategy.SELECTOR, _selector, uses_selector=True),
    "selector-handover": Scenario(Strategy.SELECTOR, _selector_with_handover, uses_selector=True),
}

EXPECTED_AGENTS = {
    "sequential": ["a", "b", "c", "d"],
    "sequential-handover": ["a", "c", "d"],
    "round-robin": ["a", "b", "c", "a", "b", "c", "a"],
    "graph": ["a", "c", "b"],
    "graph-handover": ["a", "c", "d"],
    "selector": ["c", "a", "b"],
    "selector-handover": ["triage", "x", "y"],
}


def make_clutch(
    scenario: Scenario, store: CheckpointStorage, trace: Trace, **policy: Any
) -> Clutch:
    clutch = Clutch(
        "traced",
        strategy=scenario.strategy,
        max_turns=scenario.max_turns,
        checkpoint=config(store, **policy),
    )
    scenario.build(clutch, trace)
    return clutch


def agent_calls(trace: Trace) -> list[dict[str, Any]]:
    return [c for c in trace.calls if c["agent"] != "<selector>"]


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_resume_restores_position_data_turn_history_and_metadata(
    name: str, checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    scenario = SCENARIOS[name]
    expected_agents = EXPECTED_AGENTS[name]
    whole = Trace()
    result = await make_clutch(scenario, checkpoint_store, whole).run([], run_id="whole")
    assert [c["agent"] for c in agent_calls(whole)] == expected_agents
    assert result == expected_agents

    for fail_at in range(2, len(expected_agents) + 1):
        run_id = f"cut-{fail_at}"
        first = Trace(fail_at=fail_at)
        with pytest.raises(Flaky):
            await make_clutch(scenario, checkpoint_store, first).run([], run_id=run_id)
        assert first.failed == [expected_agents[fail_at - 1]]

        second = Trace()
        restarted = make_clutch(scenario, await reopen_store(), second)
        assert await restarted.resume_latest(run_id) == result
        done, redone = agent_calls(first), agent_calls(second)
        assert done + redone == agent_calls(whole), f"cut at call {fail_at}"
        assert redone[0]["agent"] == first.failed[0]
        if name == "selector-handover" and fail_at == 2:
            # The hand-over chose x: x runs again without asking the selector.
            assert second.calls[0]["agent"] == "x"


class Order(BaseModel):
    """An agent's typed input."""

    number: int
    lines: list[str]


async def test_resume_types_the_data_again_through_the_agent_annotation(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    received: list[Any] = []
    failures = [True]

    def build(store: CheckpointStorage) -> Clutch:
        clutch = Clutch("typed", checkpoint=config(store))

        @clutch.agent()
        async def take(data: dict[str, Any]) -> Order:
            return Order(number=data["number"], lines=["first"])

        @clutch.agent()
        async def ship(order: Order) -> dict[str, Any]:
            received.append(order)
            if failures and failures.pop():
                raise Flaky("ship failed on purpose")
            return {"shipped": order.number, "lines": order.lines}

        return clutch

    with pytest.raises(Flaky):
        await build(checkpoint_store).run({"number": 7}, run_id="typed-run")
    result = await build(await reopen_store()).resume_latest("typed-run")

    assert result == {"shipped": 7, "lines": ["first"]}
    assert [type(r) for r in received] == [Order, Order]
    assert received[0] == received[1] == Order(number=7, lines=["first"])


class OrderWithCustomer(BaseModel):
    """Order, changed since the run stored its data: a required field more."""

    number: int
    lines: list[str]
    customer: str


def typed_clutch(
    store: CheckpointStorage, model: type[BaseModel], *, fail: bool, selector: type | None = None
) -> Clutch:
    """Agents ``take`` (a dict in, an Order out) and ``ship`` (an Order in, typed as
    ``model``), in order, or picked by a selector whose input is typed as ``selector``;
    ``ship`` raises Flaky when ``fail``."""
    strategy = Strategy.SEQUENTIAL if selector is None else Strategy.SELECTOR
    clutch = Clutch("typed", strategy=strategy, checkpoint=config(store, keep_latest=None))

    @clutch.agent()
    async def take(data: dict[str, Any]) -> Order:
        return Order(number=data["number"], lines=["first"])

    async def ship(order: Any) -> dict[str, Any]:
        if fail:
            raise Flaky("ship failed on purpose")
        return {"shipped": order.number}

    clutch.agent()(typed(ship, model))
    if selector is not None:

        async def choose(order: Any) -> str | None:
            return {"input": "take", "take": "ship"}.get(get_context().source)

        clutch.selector(typed(choose, selector))
    return clutch


def typed(fn: Callable[..., Any], model: type[BaseModel]) -> Callable[..., Any]:
    """``fn`` with its first parameter annotated as ``model``."""
    fn.__annotations__["order"] = model
    return fn


@pytest.mark.parametrize("selector", [False, True], ids=["agent", "selector"])
async def test_resume_of_data_that_no_longer_fits_the_model_is_refused_changing_nothing(
    checkpoint_store: CheckpointStorage, selector: bool
) -> None:
    before_change = dict if selector else None
    clutch = typed_clutch(checkpoint_store, Order, fail=True, selector=before_change)
    with pytest.raises(Flaky):
        await clutch.run({"number": 7}, run_id="typed-run")
    [*_, last] = await clutch.list_checkpoints("typed-run")
    before = await stored_view(checkpoint_store, "typed-run")

    # ship's model changed; with a selector, the selector's, which picks ship
    model, picker = (Order, OrderWithCustomer) if selector else (OrderWithCustomer, None)
    changed = typed_clutch(checkpoint_store, model, fail=False, selector=picker)
    whose = "the selector" if selector else "agent 'ship'"
    said = (
        f"run 'typed-run': the stored data of step 1 no longer fits the model "
        f"OrderWithCustomer of {whose} (customer: Field required); nothing was changed: "
        "resume it once the model fits the data again"
    )
    with pytest.raises(IncompatibleDataError, match=f"^{re.escape(said)}$") as refused:
        await changed.resume_latest("typed-run")
    error = refused.value
    assert (error.run_id, error.step, error.agent) == ("typed-run", 1, None if selector else "ship")
    assert (error.model, error.reason) == ("OrderWithCustomer", "customer: Field required")
    with pytest.raises(IncompatibleDataError, match=f"^{re.escape(said)}$"):
        await changed.resume(last.checkpoint_id)
    assert await stored_view(checkpoint_store, "typed-run") == before

    fitting = typed_clutch(checkpoint_store, Order, fail=False, selector=before_change)
    assert await fitting.resume_latest("typed-run") == {"shipped": 7}


def input_clutch(store: CheckpointStorage, model: type[BaseModel], fail: bool) -> Clutch:
    """One agent, ``ship``, which takes the run's input as ``model`` (and raises Flaky
    when ``fail``)."""
    clutch = Clutch("typed-input", checkpoint=config(store))

    async def ship(order: Any) -> dict[str, Any]:
        if fail:
            raise Flaky("ship failed on purpose")
        return {"shipped": order.number}

    clutch.agent()(typed(ship, model))
    return clutch


async def test_resume_of_an_input_that_no_longer_fits_the_first_agent_names_the_input(
    checkpoint_store: CheckpointStorage,
) -> None:
    with pytest.raises(Flaky):
        await input_clutch(checkpoint_store, Order, True).run(
            {"number": 7, "lines": []}, run_id="in"
        )
    before = await stored_view(checkpoint_store, "in")
    with pytest.raises(IncompatibleDataError, match=r"^run 'in': the run's input no longer"):
        await input_clutch(checkpoint_store, OrderWithCustomer, False).resume_latest("in")
    assert await stored_view(checkpoint_store, "in") == before


async def test_a_new_run_whose_input_does_not_fit_the_first_agent_fails_in_its_step(
    checkpoint_store: CheckpointStorage,
) -> None:
    # its input never fit the model: the step fails on it, the run is stored failed (it
    # is not refused as data that a changed model no longer fits)
    clutch = input_clutch(checkpoint_store, OrderWithCustomer, False)
    with pytest.raises(ValidationError, match="customer"):
        await clutch.run({"number": 7, "lines": []}, run_id="unfit")
    run = await checkpoint_store.get_run("unfit")
    assert run is not None and run.status == "failed" and run.step_seq == 0


async def test_get_checkpoint_shows_the_state_a_checkpoint_restores(
    checkpoint_store: CheckpointStorage,
) -> None:
    trace = Trace()
    clutch = make_clutch(SCENARIOS["sequential"], checkpoint_store, trace, keep_latest=None)
    await clutch.run(["in"], run_id="shown")
    checkpoints = await clutch.list_checkpoints("shown")
    state = await clutch.get_checkpoint(checkpoints[1].checkpoint_id)

    assert state.run_id == "shown" and state.seq == 2 and state.turn == 2
    assert state.data == ["in", "a", "b"] and state.source == "b"
    assert state.history == [
        {"source": "input", "data": ["in"]},
        {"source": "a", "data": ["in", "a"]},
    ]
    assert state.metadata == {
        "seen-0": {"by": "a", "turn": 0},
        "seen-1": {"by": "b", "turn": 1},
    }
    assert state.checkpoint == checkpoints[1]
    # What agent c, the next one, saw in the run.
    assert trace.calls[2]["history"] == state.history
    assert trace.calls[2]["data"] == state.data and trace.calls[2]["turn"] == state.turn


# ------------------------------------------------------------ a changed pipeline


def _incompatible_cases() -> dict[str, tuple[Strategy, Any, Any]]:
    def sequential(trace: Trace, full: bool) -> Callable[[Clutch], None]:
        def build(clutch: Clutch) -> None:
            for name in ("a", "b", "c") if full else ("a", "b"):
                clutch.agent()(tracing(trace, name))

        return build

    def graph(trace: Trace, full: bool) -> Callable[[Clutch], None]:
        def build(clutch: Clutch) -> None:
            clutch.agent(edges=["b"])(tracing(trace, "a"))
            clutch.agent(edges=["c"] if full else [])(tracing(trace, "b"))
            if full:
                clutch.agent()(tracing(trace, "c"))

        return build

    def selector(trace: Trace, full: bool) -> Callable[[Clutch], None]:
        def build(clutch: Clutch) -> None:
            clutch.agent()(tracing(trace, "a"))
            clutch.agent()(tracing(trace, "b", handover_to="c"))
            if full:
                clutch.agent()(tracing(trace, "c"))

            @clutch.selector
            async def choose(data: list[str]) -> str | None:
                return {0: "a", 1: "b"}.get(len(data))

        return build

    return {
        "sequential": (Strategy.SEQUENTIAL, sequential, 100),
        "round-robin": (Strategy.ROUND_ROBIN, sequential, 5),
        "graph": (Strategy.GRAPH, graph, 100),
        "selector-handover": (Strategy.SELECTOR, selector, 100),
    }


@pytest.mark.parametrize("case", list(_incompatible_cases()))
async def test_resume_without_the_next_agent_raises_incompatible_and_changes_nothing(
    case: str, checkpoint_store: CheckpointStorage
) -> None:
    strategy, builder, max_turns = _incompatible_cases()[case]
    trace = Trace(fail_at=3)
    full = Clutch(
        "changing",
        strategy=strategy,
        max_turns=max_turns,
        checkpoint=config(checkpoint_store, keep_latest=None),
    )
    builder(trace, True)(full)
    with pytest.raises(Flaky):
        await full.run([], run_id="old")
    assert trace.failed == ["c"]
    checkpoints = await full.list_checkpoints("old")
    before = await stored_view(checkpoint_store, "old")
    runs_before = await full.list_runs()
    events_before = await full.events("old")

    later = Trace()
    changed = Clutch(
        "changing",
        strategy=strategy,
        max_turns=max_turns,
        checkpoint=config(checkpoint_store, keep_latest=None),
    )
    builder(later, False)(changed)
    with pytest.raises(IncompatibleCheckpointError, match="'c'"):
        await changed.resume_latest("old")
    with pytest.raises(IncompatibleCheckpointError, match="'c'"):
        await changed.resume(checkpoints[-1].checkpoint_id)

    assert later.calls == []
    assert await stored_view(checkpoint_store, "old") == before
    assert await changed.list_checkpoints("old") == checkpoints
    assert await changed.list_runs() == runs_before
    assert await changed.events("old") == events_before
    # The pipeline as it was still resumes the run.
    trace.fail_at = None
    assert await full.resume_latest("old") == (
        ["a", "b", "c", "a", "b"] if case == "round-robin" else ["a", "b", "c"]
    )


async def test_resume_from_an_agent_checkpoint_needs_that_agent(
    checkpoint_store: CheckpointStorage,
) -> None:
    taken: list[str] = []

    def build(with_b: bool) -> Clutch:
        clutch = Clutch("manual", checkpoint=config(checkpoint_store))

        @clutch.agent()
        async def a(data: list[str]) -> list[str]:
            return [*data, "a"]

        if with_b:

            @clutch.agent()
            async def b(data: list[str]) -> list[str]:
                taken.append(await clutch.checkpoint())
                return [*data, "b"]

        return clutch

    await build(True).run([], run_id="m")
    before = await stored_view(checkpoint_store, "m")
    with pytest.raises(IncompatibleCheckpointError, match="'b'"):
        await build(False).resume(taken[0])
    assert await stored_view(checkpoint_store, "m") == before


class DropsTheFirstStepCommit(MemoryCheckpointStorage):
    """A store whose first commit of a step fails as a server that dropped the
    connection; its other calls answer."""

    dropped = False

    async def commit(self, commit: Commit) -> None:
        if commit.steps and not self.dropped:
            self.dropped = True
            raise StorageUnavailableError("the server closed the connection unexpectedly")
        await super().commit(commit)


async def test_a_step_whose_commit_the_store_drops_leaves_the_run_resumable_not_failed() -> None:
    store = DropsTheFirstStepCommit()
    pipeline = Pipeline(store, ("a", "b"))
    with pytest.raises(StorageUnavailableError):
        await pipeline.clutch.run([], run_id="dropped")
    run = await store.get_run("dropped")
    assert run is not None and run.status == "running" and run.step_seq == 0
    assert "step_failed" not in [e.kind for e in await store.read_events("dropped")]
    assert await pipeline.clutch.resume_latest("dropped") == ["a", "b"]
    assert pipeline.calls == ["a", "a", "b"]
