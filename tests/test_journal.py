"""Journaled calls: ``@nestegg.durable`` and ``await nestegg.call(...)`` inside the agents of
a checkpointed run.

A fake LLM counts the calls it really gets. Each call's outcome is committed as soon as it
returns; a step executed again (after a failure, a cancellation, or in a new process) gets
the recorded outcomes back in order without calling again; a different call at a position
raises NonDeterminismError unless it says ``replay="rerun"``; failures are journaled and
replayed as JournaledCallError; RetryPolicy retries before recording. Outside a
checkpointed run the calls are plain calls. The behaviour is checked on every embedded
store (memory, SQLite, file) and, for the core of it, on PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import functools
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel, Field, field_validator
from typing_extensions import TypedDict

import nestegg
from nestegg import Clutch, RetryPolicy, Strategy, get_context
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint import checkpointer as checkpointer_module
from nestegg.checkpoint.codec import unseal_value
from nestegg.checkpoint.records import Commit, JournalRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointSerializationError,
    ConfigurationError,
    JournaledCallError,
    ModuleNameMismatchError,
    NonDeterminismError,
    StorageError,
)
from nestegg.journal import argument_hash, function_name
from nestegg.journal_checks import replay_entry
from nestegg.journal_results import holds_structured_type
from nestegg.options import shown
from nestegg.testing import fixtures as store_fixtures
from nestegg.testing.fixtures import StoreFactory
from tests.checkpoint import conftest as checkpointed
from tests.checkpoint.conftest import Flaky, config, wait_for
from tests.registry import SERVER_KINDS

# The per-store fixtures of tests/checkpoint (memory, SQLite, file) and of every registered
# store (tests/registry.py).
store_kind = checkpointed.store_kind
store_root = checkpointed.store_root
reopen_store = checkpointed.reopen_store
checkpoint_store = checkpointed.checkpoint_store

Reopen = Callable[[], Awaitable[CheckpointStorage]]
store_factory = store_fixtures.store_factory
store_name = store_fixtures.store_name
SERVER_STORES = [pytest.param(kind, marks=pytest.mark.server) for kind in SERVER_KINDS]


class FakeLLM:
    """Stands in for a paid API: answers every prompt and logs each call it really gets.

    ``failures`` maps a prompt to the errors its next calls raise, one per call.
    """

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.failures: dict[str, list[Exception]] = {}
        self.threads: list[int] = []

    def _answer(self, prompt: str) -> str:
        self.prompts.append(prompt)
        pending = self.failures.get(prompt)
        if pending:
            raise pending.pop(0)
        return f"answer to {prompt}"

    async def complete(self, prompt: str, **options: Any) -> str:
        """The async client call."""
        return self._answer(prompt)

    def complete_sync(self, prompt: str) -> str:
        """The sync client call (run in a worker thread when journaled)."""
        self.threads.append(threading.get_ident())
        return self._answer(prompt)

    async def echo(self, value: Any) -> Any:
        """Returns ``value`` (to check what a replay gives back)."""
        self.prompts.append(repr(value))
        return value


COMPLETE = "tests.test_journal.FakeLLM.complete"
CALLS_PER_STEP = 2


def answer(prompt: str) -> str:
    return f"answer to {prompt}"


def step_entry(agent: str, turn: int) -> str:
    """What the agent ``agent`` of :class:`Journaled` appends at ``turn``."""
    prompts = [f"{agent}/{turn}/{i}" for i in range(CALLS_PER_STEP)]
    return f"{agent}=" + ";".join(answer(p) for p in prompts)


def step_prompts(agents: list[str]) -> list[str]:
    """The prompts the agents of :class:`Journaled` send, run one after another."""
    return [f"{agent}/{turn}/{i}" for turn, agent in enumerate(agents) for i in range(2)]


ORDERS = {
    Strategy.SEQUENTIAL: ["a", "b", "c"],
    Strategy.ROUND_ROBIN: ["a", "b", "a", "b", "a"],
    Strategy.GRAPH: ["a", "c", "b"],
    Strategy.SELECTOR: ["c", "a", "b"],
}
"""The agents each strategy runs with :class:`Journaled`, one per turn."""


class Journaled:
    """A checkpointed Clutch whose agents each make two journaled calls to ``llm`` (one
    through ``nestegg.call``, one through a ``@durable`` function) and append the answers.

    The agent of turn ``fail_turn`` raises Flaky after its calls. ``executed`` logs the
    agents that ran. GRAPH follows a -> c -> b; SELECTOR picks c, a, b; ROUND_ROBIN cycles
    over a and b.
    """

    def __init__(
        self,
        store: CheckpointStorage,
        strategy: Strategy = Strategy.SEQUENTIAL,
        *,
        run_id: str | None = None,
        **policy: Any,
    ) -> None:
        self.llm = FakeLLM()
        self.fail_turn: int | None = None
        self.executed: list[str] = []
        self.order = ORDERS[strategy]
        max_turns = len(self.order) if strategy is Strategy.ROUND_ROBIN else 100
        self.clutch = Clutch(
            "journaled",
            strategy=strategy,
            max_turns=max_turns,
            checkpoint=config(store, run_id, **policy),
        )
        edges = {"a": ["c"], "c": ["b"]} if strategy is Strategy.GRAPH else {}
        names = ["a", "b"] if strategy is Strategy.ROUND_ROBIN else ["a", "b", "c"]
        for name in names:
            self.clutch.agent(edges=edges.get(name))(self.asker(name))
        if strategy is Strategy.SELECTOR:
            picks = self.order

            @self.clutch.selector
            async def choose(data: list[str]) -> str | None:
                return picks[len(data)] if len(data) < len(picks) else None

    def asker(self, name: str) -> Callable[[list[str]], Awaitable[list[str]]]:
        ask = nestegg.durable(self.llm.complete)

        async def agent(data: list[str]) -> list[str]:
            turn = get_context().state.turn
            self.executed.append(name)
            first: str = await nestegg.call(self.llm.complete, f"{name}/{turn}/0")
            second: str = await ask(f"{name}/{turn}/1")
            if turn == self.fail_turn:
                raise Flaky(f"{name} failed after its calls")
            return [*data, f"{name}={first};{second}"]

        agent.__name__ = agent.__qualname__ = name
        return agent

    def expected(self) -> list[str]:
        return [step_entry(agent, turn) for turn, agent in enumerate(self.order)]


def one_agent(store: CheckpointStorage, body: Callable[[], Awaitable[Any]]) -> Clutch:
    """A checkpointed Clutch of one agent ``solo`` that returns ``[await body()]``."""
    clutch = Clutch("solo", checkpoint=config(store))

    async def solo(data: Any) -> list[Any]:
        return [await body()]

    clutch.agent()(solo)
    return clutch


async def journal_of(store: CheckpointStorage, run_id: str, step: int) -> list[dict[str, Any]]:
    """The decoded journal entries of one step, by position."""
    return [
        {"position": r.position, **unseal_value(r.body, "journal entry")}
        for r in await store.read_journal(run_id, step)
    ]


async def fail_then_resume(clutch: Clutch, fail: list[bool]) -> Any:
    """Run ``job`` until an agent raises Flaky, then clear ``fail`` and resume it."""
    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    return await clutch.resume_latest("job")


async def cancel_in_step(clutch: Clutch, called: asyncio.Event) -> None:
    """Start run ``job``, cancel it once ``called`` is set in its step, and check that it
    is stored cancelled: its resume replays the step's calls, failures included."""
    task = await clutch.submit([], run_id="job")
    await wait_for(called)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [info] = await clutch.list_runs()
    assert info.status == "cancelled"


class Reply(BaseModel):
    text: str


# ------------------------------------------------------------------ replay


async def test_a_failed_step_replays_its_recorded_calls(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Journaled(checkpoint_store)
    pipeline.fail_turn = 1
    with pytest.raises(Flaky, match="b failed after its calls"):
        await pipeline.clutch.run([], run_id="job")
    assert pipeline.llm.prompts == step_prompts(["a", "b"])

    pipeline.fail_turn = None
    assert await pipeline.clutch.resume_latest("job") == pipeline.expected()
    assert pipeline.executed == ["a", "b", "b", "c"]
    assert pipeline.llm.prompts == step_prompts(["a", "b", "c"])


async def test_a_new_process_replays_the_calls_from_the_store(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    first = Journaled(checkpoint_store)
    first.fail_turn = 2
    with pytest.raises(Flaky):
        await first.clutch.run([], run_id="job")

    restarted = Journaled(await reopen_store())
    assert await restarted.clutch.resume_latest("job") == restarted.expected()
    assert restarted.executed == ["c"]
    assert restarted.llm.prompts == []


@pytest.mark.parametrize("strategy", list(ORDERS), ids=lambda s: s.name.lower())
async def test_every_strategy_replays_the_calls_of_the_step_that_failed(
    strategy: Strategy, checkpoint_store: CheckpointStorage
) -> None:
    pipeline = Journaled(checkpoint_store, strategy)
    pipeline.fail_turn = 3 if strategy is Strategy.ROUND_ROBIN else 1
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="job")
    done = pipeline.order[: pipeline.fail_turn + 1]
    assert pipeline.llm.prompts == step_prompts(done)

    pipeline.fail_turn = None
    assert await pipeline.clutch.resume_latest("job") == pipeline.expected()
    assert pipeline.llm.prompts == step_prompts(pipeline.order)
    assert pipeline.executed == [*done, *pipeline.order[len(done) - 1 :]]


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_every_durability_replays_the_calls_of_the_step_that_failed(
    durability: str, checkpoint_store: CheckpointStorage
) -> None:
    pipeline = Journaled(checkpoint_store, durability=durability)
    pipeline.fail_turn = 2
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="job")
    pipeline.fail_turn = None
    assert await pipeline.clutch.resume_latest("job") == pipeline.expected()
    assert pipeline.llm.prompts == step_prompts(["a", "b", "c"])


async def test_a_cancelled_step_replays_the_calls_it_made(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    called, gate = asyncio.Event(), asyncio.Event()
    clutch = Clutch("cancel", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def slow(data: list[str]) -> list[str]:
        reply: str = await nestegg.call(llm.complete, "slow")
        called.set()
        await gate.wait()
        return [*data, reply]

    await cancel_in_step(clutch, called)
    gate.set()
    assert await clutch.resume_latest("job") == [answer("slow")]
    assert llm.prompts == ["slow"]


async def test_the_result_is_committed_as_soon_as_the_call_returns(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    llm = FakeLLM()
    other_handle = await reopen_store()
    seen: list[list[dict[str, Any]]] = []
    clutch = Clutch("early", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        seen.append(await journal_of(other_handle, "job", 1))
        reply: str = await nestegg.call(llm.complete, "question", temperature=0)
        seen.append(await journal_of(other_handle, "job", 1))
        return [*data, reply]

    before = time.time()
    await clutch.run([], run_id="job")
    after = time.time()
    digest = argument_hash(("question",), {"temperature": 0})
    entry = {"position": 0, "function": COMPLETE, "args": digest, "result": answer("question")}
    [recorded] = seen[1]
    started, duration = recorded.pop("started"), recorded.pop("duration")
    assert seen == [[], [entry]]
    assert before <= started <= after and 0 <= duration <= after - started


async def test_a_call_records_how_long_it_took_and_a_replay_keeps_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch = Clutch("timed", checkpoint=config(checkpoint_store))
    failing = {"armed": True}

    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "done"

    @clutch.agent()
    async def waiter(data: list[str]) -> list[str]:
        reply: str = await nestegg.call(slow, 0.05)
        if failing.pop("armed", False):
            raise RuntimeError("after the call")
        return [*data, reply]

    with pytest.raises(RuntimeError):
        await clutch.run([], run_id="job")
    [first] = await journal_of(checkpoint_store, "job", 1)
    assert 0.05 <= first["duration"] < 5
    assert await clutch.resume_latest("job") == ["done"]
    assert await journal_of(checkpoint_store, "job", 1) == [first]  # replayed, not rewritten


async def test_replayed_results_come_back_equal_and_in_order(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    values: list[Any] = [
        "text",
        42,
        None,
        (1, "two"),
        {1: "int key", "nested": [1.5, {"x": b"raw"}]},
        {"a", "b"},
        dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC),
    ]
    runs: list[list[Any]] = []
    fail = [True]
    clutch = Clutch("values", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def collect(data: list[str]) -> list[str]:
        runs.append([await nestegg.call(llm.echo, value) for value in values])
        if fail[0]:
            raise Flaky("collect failed")
        return data

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    await clutch.resume_latest("job")
    first, replayed = runs
    assert replayed == first == values
    assert [type(v) for v in replayed] == [type(v) for v in values]
    assert len(llm.prompts) == len(values)


async def test_a_pydantic_result_is_replayed_as_the_same_model(
    checkpoint_store: CheckpointStorage,
) -> None:
    class Completion(BaseModel):
        text: str

    results: list[Any] = []
    fail = [True]

    async def create(prompt: str) -> Completion:
        return Completion(text=answer(prompt))

    clutch = Clutch("model", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        results.append(await nestegg.call(create, "q"))
        if fail[0]:
            raise Flaky("asker failed")
        return data

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    await clutch.resume_latest("job")
    assert results == [Completion(text=answer("q"))] * 2


async def test_replayed_results_are_rebuilt_as_the_return_annotation(
    checkpoint_store: CheckpointStorage,
) -> None:
    async def many(prompt: str) -> list[Reply]:
        return [Reply(text=prompt), Reply(text=prompt * 2)]

    async def maybe(prompt: str) -> Reply | None:
        return None if prompt == "none" else Reply(text=prompt)

    @nestegg.durable
    def decorated(prompt: str) -> Reply:
        return Reply(text=prompt)

    def unannotated(prompt: str):  # type: ignore[no-untyped-def]
        return Reply(text=prompt)

    runs: list[list[Any]] = []
    fail = [True]
    clutch = Clutch("annotated", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        runs.append(
            [
                await nestegg.call(many, "a"),
                await nestegg.call(maybe, "b"),
                await nestegg.call(maybe, "none"),
                await decorated("c"),
                await nestegg.call(unannotated, "d"),
            ]
        )
        if fail[0]:
            raise Flaky("asker failed")
        return data

    await fail_then_resume(clutch, fail)
    first, replayed = runs
    assert (
        replayed[:4]
        == first[:4]
        == [
            [Reply(text="a"), Reply(text="aa")],
            Reply(text="b"),
            None,
            Reply(text="c"),
        ]
    )
    assert first[4] == Reply(text="d")
    assert replayed[4] == {"text": "d"}  # without a return annotation: what model_dump() gave


async def test_a_recorded_result_that_does_not_fit_the_annotation_raises_non_determinism(
    checkpoint_store: CheckpointStorage,
) -> None:
    async def mislabelled(prompt: str) -> Reply:
        return prompt  # type: ignore[return-value]

    fail = [True]
    clutch = Clutch("mislabelled", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        await nestegg.call(mislabelled, "q")
        if fail[0]:
            raise Flaky("asker failed")
        return data

    name = f"{mislabelled.__module__}.{mislabelled.__qualname__}"
    message = (
        f"step 1, call 0: the journal recorded a result of {name} that does not fit its "
        "return annotation Reply ("
    )
    with pytest.raises(NonDeterminismError, match=re.escape(message)):
        await fail_then_resume(clutch, fail)


class Message(BaseModel):
    from_: str = Field(alias="from")


class Labelled(TypedDict):
    reply: Reply
    score: float


class Incomplete(BaseModel):
    """A model that is never fully defined: validating one raises PydanticUserError."""

    later: Later  # type: ignore[name-defined]  # noqa: F821


@dataclasses.dataclass
class Point:
    x: int


async def test_a_model_with_aliased_fields_is_replayed(
    checkpoint_store: CheckpointStorage,
) -> None:
    async def receive(sender: str) -> Message:
        return Message.model_validate({"from": sender})

    results: list[Any] = []
    fail = [True]
    clutch = Clutch("aliased", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        results.append(await nestegg.call(receive, "ann"))
        if fail[0]:
            raise Flaky("asker failed")
        return data

    await fail_then_resume(clutch, fail)
    assert results == [Message.model_validate({"from": "ann"})] * 2


async def test_only_annotations_holding_a_model_dataclass_or_typed_dict_rebuild(
    checkpoint_store: CheckpointStorage,
) -> None:
    async def ratio(prompt: str) -> float:
        return 3

    async def ratios(prompt: str) -> dict[str, list[float]]:
        return {prompt: [1, 2.5]}

    async def replies(prompt: str) -> dict[str, Reply | None]:
        return {prompt: Reply(text=prompt), "none": None}

    async def labelled(prompt: str) -> Labelled:
        return {"reply": Reply(text=prompt), "score": 1}

    runs: list[list[Any]] = []
    fail = [True]
    clutch = Clutch("annotated", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        runs.append(
            [
                await nestegg.call(ratio, "a"),
                await nestegg.call(ratios, "b"),
                await nestegg.call(replies, "c"),
                await nestegg.call(labelled, "d"),
            ]
        )
        if fail[0]:
            raise Flaky("asker failed")
        return data

    await fail_then_resume(clutch, fail)
    first, replayed = runs
    assert replayed == first
    assert replayed[0] == 3 and type(replayed[0]) is int
    assert replayed[1] == {"b": [1, 2.5]} and type(replayed[1]["b"][0]) is int
    assert replayed[2] == {"c": Reply(text="c"), "none": None}
    assert replayed[3] == {"reply": Reply(text="d"), "score": 1.0}


def test_structured_types_are_found_anywhere_in_the_annotation() -> None:
    holding = [Reply, list[Reply], Reply | None, dict[str, Reply], tuple[int, Point], Labelled]
    holding += [Awaitable[list[Reply]], dict[str, list[Labelled | None]]]
    plain = [float, int | None, list[float], dict[str, Any], tuple[int, ...], Any, None]
    assert all(holds_structured_type(hint) for hint in holding)
    assert not any(holds_structured_type(hint) for hint in plain)


async def test_any_failure_to_rebuild_a_result_raises_non_determinism(
    checkpoint_store: CheckpointStorage,
) -> None:
    replaying = [False]

    class Checked(BaseModel):
        text: str

        @field_validator("text")
        @classmethod
        def looked_up(cls, value: str) -> str:
            if replaying[0]:
                raise KeyError(value)
            return value

    async def checked(prompt: str) -> Checked:
        return Checked(text=prompt)

    async def incomplete(prompt: str) -> Incomplete:
        return {"later": prompt}  # type: ignore[return-value]

    fail = [True]
    failures = [
        (checked, Checked, "KeyError: 'q')"),
        (incomplete, Incomplete, "PydanticUserError: "),
    ]
    for fn, model, cause in failures:
        fail[0], replaying[0] = True, False
        clutch = Clutch("unfit", checkpoint=config(checkpoint_store))

        async def asker(data: list[str], fn: Any = fn) -> list[str]:
            await nestegg.call(fn, "q")
            if fail[0]:
                raise Flaky("asker failed")
            return data

        clutch.agent()(asker)
        with pytest.raises(Flaky):
            await clutch.run([], run_id=fn.__name__)
        fail[0], replaying[0] = False, True
        name = f"{fn.__module__}.{fn.__qualname__}"
        message = (
            f"step 1, call 0: the journal recorded a result of {name} that cannot be rebuilt "
            f"as its return annotation {model.__qualname__} ({cause}"
        )
        with pytest.raises(NonDeterminismError, match=re.escape(message)):
            await clutch.resume_latest(fn.__name__)


async def test_calls_past_the_recorded_ones_are_made(checkpoint_store: CheckpointStorage) -> None:
    llm = FakeLLM()
    attempt = [0]
    clutch = Clutch("growing", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        attempt[0] += 1
        replies = [await nestegg.call(llm.complete, f"q{i}") for i in range(attempt[0] + 1)]
        if attempt[0] == 1:
            raise Flaky("asker failed")
        return [*data, *replies]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    assert await clutch.resume_latest("job") == [answer("q0"), answer("q1"), answer("q2")]
    assert llm.prompts == ["q0", "q1", "q2"]


async def test_concurrent_calls_replay_by_the_order_they_were_made(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    fail = [True]

    async def slow(prompt: str, delay: float) -> str:
        await asyncio.sleep(delay)
        return await llm.complete(prompt)

    clutch = Clutch("gather", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def fan_out(data: list[str]) -> list[str]:
        replies = await asyncio.gather(
            nestegg.call(slow, "late", 0.05), nestegg.call(slow, "early", 0.0)
        )
        if fail[0]:
            raise Flaky("fan_out failed")
        return [*data, *replies]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    assert llm.prompts == ["early", "late"]
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("late"), answer("early")]
    assert llm.prompts == ["early", "late"]
    assert [e["result"] for e in await journal_of(checkpoint_store, "job", 1)] == [
        answer("late"),
        answer("early"),
    ]


async def test_a_durable_sync_function_runs_in_a_worker_thread_and_is_journaled(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    ask = nestegg.durable(llm.complete_sync)
    fail = [True]
    clutch = Clutch("sync", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        reply: str = await ask("q")
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, reply]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("q")]
    assert llm.prompts == ["q"]
    assert len(llm.threads) == 1 and llm.threads[0] != threading.get_ident()
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["function"] == "tests.test_journal.FakeLLM.complete_sync"


async def test_durable_works_with_and_without_parentheses(
    checkpoint_store: CheckpointStorage,
) -> None:
    made: list[str] = []

    @nestegg.durable
    async def bare(prompt: str) -> str:
        made.append(prompt)
        return prompt.upper()

    @nestegg.durable(retry=RetryPolicy(attempts=2, backoff=0))
    def called(prompt: str) -> str:
        made.append(prompt)
        return prompt * 2

    fail = [True]
    clutch = Clutch("decorated", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        replies = [await bare("x"), await called("y")]
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, *replies]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    assert await clutch.resume_latest("job") == ["X", "yy"]
    assert made == ["x", "y"]
    assert bare.__name__ == "bare" and called.__name__ == "called"
    assert [e["function"] for e in await journal_of(checkpoint_store, "job", 1)] == [
        "tests.test_journal.test_durable_works_with_and_without_parentheses.<locals>.bare",
        "tests.test_journal.test_durable_works_with_and_without_parentheses.<locals>.called",
    ]


@pytest.mark.parametrize("store_name", SERVER_STORES, indirect=True)
async def test_server_stores_replay_the_recorded_calls(
    store_factory: StoreFactory,
) -> None:
    pipeline = Journaled(await store_factory())
    pipeline.fail_turn = 1
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="job")

    restarted = Journaled(await store_factory())
    assert await restarted.clutch.resume_latest("job") == restarted.expected()
    assert restarted.executed == ["b", "c"]
    assert restarted.llm.prompts == step_prompts(["a", "b", "c"])[4:]
    assert await restarted.clutch.delete_run("job")
    assert await (await store_factory()).read_journal("job", 2) == []


# ------------------------------------------------------ identity and non-determinism


async def test_another_function_at_a_position_raises_non_determinism(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    fail = [True]
    clutch = Clutch("changed", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        fn = llm.complete if fail[0] else llm.echo
        reply: str = await nestegg.call(fn, "q")
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, reply]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    digest = argument_hash(("q",), {})
    message = (
        f"step 1, call 0: the journal recorded {COMPLETE}(args {digest}) but the step now "
        f"calls tests.test_journal.FakeLLM.echo(args {digest}); was the function renamed or "
        "moved, or the agent changed to call another one? Give a function a fixed name with "
        "durable(name=...); replay='rerun' calls again, paying for the call again"
    )
    with pytest.raises(NonDeterminismError, match=re.escape(message)):
        await clutch.resume_latest("job")
    assert llm.prompts == ["q"]
    [info] = await clutch.list_runs()
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "NonDeterminismError"


def named_asker(
    checkpoint_store: CheckpointStorage, llm: FakeLLM, fail: list[bool], names: list[str]
) -> Clutch:
    """A pipeline whose one agent calls ``llm.complete("q")`` journaled by the next of
    ``names``, then raises Flaky while ``fail[0]``."""
    clutch = Clutch("renamed", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        reply: str = await nestegg.durable(llm.complete, name=names.pop(0))("q")
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, reply]

    return clutch


async def test_the_function_named_by_another_module_path_fails_the_run_until_named_so(
    checkpoint_store: CheckpointStorage,
) -> None:
    # The test module journaled as scratch.tests.test_journal, imported as
    # tests.test_journal (loaded under that name), then as the journal names it.
    llm = FakeLLM()
    fail = [True]
    names = [f"scratch.{COMPLETE}", COMPLETE, f"scratch.{COMPLETE}"]
    clutch = named_asker(checkpoint_store, llm, fail, names)
    digest = argument_hash(("q",), {})
    message = (
        f"step 1, call 0: the journal recorded scratch.{COMPLETE}(args {digest}) but the "
        f"step now calls {COMPLETE}(args {digest}); the same function, its module "
        "imported as 'tests.test_journal' but journaled as 'scratch.tests.test_journal' "
        "(the run was started from another directory or with another PYTHONPATH): resume "
        "the run with its module imported as the journal names it "
        "(--app scratch.tests.test_journal:ATTR), or from the directory and PYTHONPATH it "
        "was started with; its journaled calls are then replayed"
    )
    with pytest.raises(ModuleNameMismatchError, match=re.escape(message)) as raised:
        await fail_then_resume(clutch, fail)
    assert (raised.value.journaled_module, raised.value.imported_module) == (
        "scratch.tests.test_journal",
        "tests.test_journal",
    )
    [info] = await clutch.list_runs()
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "ModuleNameMismatchError"
    assert await clutch.resume_latest("job") == ["answer to q"]
    assert llm.prompts == ["q"]  # replayed: not paid again


async def test_a_durable_name_changed_by_a_prefix_is_another_function(
    checkpoint_store: CheckpointStorage,
) -> None:
    # durable(name="tools.search") renamed to name="search": no module is named "".
    llm = FakeLLM()
    fail = [True]
    names = ["tools.search", "search"]
    clutch = named_asker(checkpoint_store, llm, fail, names)
    digest = argument_hash(("q",), {})
    message = (
        f"step 1, call 0: the journal recorded tools.search(args {digest}) but the step now "
        f"calls search(args {digest}); was the function renamed or moved, or the agent "
        "changed to call another one?"
    )
    with pytest.raises(NonDeterminismError, match=re.escape(message)) as raised:
        await fail_then_resume(clutch, fail)
    assert type(raised.value) is NonDeterminismError
    assert llm.prompts == ["q"]


@pytest.mark.parametrize(
    ("journaled", "now", "args"),
    [
        (f"scratch.{COMPLETE}", COMPLETE, "other"),  # other arguments too
        ("scratch.pipe.complete", "pipe.complete", "same"),  # no module pipe is loaded
        ("tools.search", "search", "same"),  # no module part now
        ("search", "tools.search", "same"),  # no module part in the journal
        (f"x{COMPLETE}", COMPLETE, "same"),  # not on a module boundary
        ("FakeLLM.complete", COMPLETE, "same"),  # the journal's name without its module
    ],
)
def test_only_the_same_call_by_a_loaded_module_path_is_a_module_mismatch(
    journaled: str, now: str, args: str
) -> None:
    recorded = {"function": journaled, "args": "same", "result": 1}
    with pytest.raises(NonDeterminismError) as raised:
        replay_entry(recorded, now, args, 1, 0)
    assert type(raised.value) is NonDeterminismError


async def test_other_arguments_at_a_position_raise_non_determinism(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    prompt = ["first wording"]
    clutch = Clutch("reworded", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        reply: str = await nestegg.call(llm.complete, prompt[0])
        if prompt[0] == "first wording":
            raise Flaky("asker failed")
        return [*data, reply]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    prompt[0] = "second wording"
    old = argument_hash(("first wording",), {})
    new = argument_hash(("second wording",), {})
    message = (
        f"step 1, call 0: the journal recorded {COMPLETE}(args {old}) but the step now "
        f"calls {COMPLETE}(args {new}); an argument differs from the recorded call's: does "
        "it change between runs (a timestamp, a random id, data read anew)? "
    )
    with pytest.raises(NonDeterminismError, match=re.escape(message)) as raised:
        await clutch.resume_latest("job")
    assert str(raised.value).endswith("replay='rerun' calls again, paying for the call again")
    assert llm.prompts == ["first wording"]
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["args"] == old and entry["result"] == answer("first wording")


async def test_keyword_order_does_not_change_the_call(checkpoint_store: CheckpointStorage) -> None:
    llm = FakeLLM()
    fail = [True]
    clutch = Clutch("kwargs", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        if fail[0]:
            reply: str = await nestegg.call(llm.complete, "q", model="m", temperature=0)
            raise Flaky("asker failed")
        reply = await nestegg.call(llm.complete, "q", temperature=0, model="m")
        return [*data, reply]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("q")]
    assert llm.prompts == ["q"]


async def test_rerun_calls_again_and_records_the_new_result(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    prompt = ["old"]
    fail = [True]
    clutch = Clutch("rerun", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        fresh: str = await nestegg.call(llm.complete, prompt[0], replay="rerun")
        kept: str = await nestegg.call(llm.complete, "kept")
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, fresh, kept]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    prompt[0] = "new"
    with pytest.raises(Flaky):
        await clutch.resume_latest("job")
    assert llm.prompts == ["old", "kept", "new"]
    assert [e["result"] for e in await journal_of(checkpoint_store, "job", 1)] == [
        answer("new"),
        answer("kept"),
    ]
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("new"), answer("kept")]
    assert llm.prompts == ["old", "kept", "new", "new"]


async def test_objects_json_cannot_hold_are_hashed_by_their_type() -> None:
    class Client:
        pass

    assert argument_hash((Client(),), {}) == argument_hash((Client(),), {})
    assert argument_hash((Client(),), {}) != argument_hash((object(),), {})
    assert argument_hash((1,), {"a": 1, "b": 2}) == argument_hash((1,), {"b": 2, "a": 1})
    assert argument_hash((1,), {}) != argument_hash(("1",), {})
    assert function_name(FakeLLM().complete) == COMPLETE
    assert function_name(nestegg.durable(FakeLLM().complete)) == COMPLETE


HASH_OF_A_SET = """
from nestegg.journal import argument_hash
words = {f"word{i}" for i in range(32)}
print(argument_hash((words, frozenset(words)), {"tags": {"x", "y", "z", "w"}}))
"""


def test_the_hash_of_a_set_is_the_same_in_every_process() -> None:
    hashes = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", HASH_OF_A_SET], env=env, capture_output=True, check=True
        )
        hashes.add(out.stdout.strip())
    assert len(hashes) == 1
    assert argument_hash(({"b", "a"},), {}) == argument_hash((["a", "b"],), {})


async def test_a_durable_function_can_have_parameters_named_retry_replay_and_fn(
    checkpoint_store: CheckpointStorage,
) -> None:
    made: list[tuple[str, int, str]] = []

    @nestegg.durable(retry=RetryPolicy(attempts=1))
    async def send(fn: str, retry: int, replay: str) -> str:
        made.append((fn, retry, replay))
        return f"{fn}/{retry}/{replay}"

    results: list[list[str]] = []
    fail = [True]
    clutch = Clutch("named", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        results.append(
            [await send(fn="f", retry=2, replay="never"), await send("g", 3, replay="rerun")]
        )
        if fail[0]:
            raise Flaky("asker failed")
        return data

    await fail_then_resume(clutch, fail)
    assert results == [["f/2/never", "g/3/rerun"]] * 2
    assert made == [("f", 2, "never"), ("g", 3, "rerun")]
    assert [e["args"] for e in await journal_of(checkpoint_store, "job", 1)] == [
        argument_hash((), {"fn": "f", "retry": 2, "replay": "never"}),
        argument_hash(("g", 3), {"replay": "rerun"}),
    ]


async def test_call_passes_an_fn_keyword_to_the_function() -> None:
    def echo(value: int = 0, fn: int = 0) -> tuple[int, int]:
        return value, fn

    assert await nestegg.call(echo, fn=1) == (0, 1)
    assert await nestegg.call(echo, 2, fn=3) == (2, 3)


async def test_a_partial_with_other_bound_arguments_raises_non_determinism(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    model = ["small"]
    fail = [True]
    clutch = Clutch("partial", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        create = functools.partial(llm.complete, model=model[0])
        reply: str = await nestegg.call(create, "q")
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, reply]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    model[0] = "large"
    with pytest.raises(NonDeterminismError, match=re.escape(COMPLETE)):
        await clutch.resume_latest("job")


async def test_a_partial_is_journaled_as_its_function_called_with_its_bound_arguments(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    ask = nestegg.durable(llm.complete)
    assert function_name(functools.partial(llm.complete, model="m")) == COMPLETE
    assert function_name(functools.partial(ask, "q")) == COMPLETE
    clutch = one_agent(
        checkpoint_store,
        lambda: nestegg.call(functools.partial(functools.partial(ask, model="m"), "q")),
    )
    assert await clutch.run([], run_id="job") == [answer("q")]
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["function"] == COMPLETE
    assert entry["args"] == argument_hash(("q",), {"model": "m"})


async def test_calling_a_durable_function_through_call_journals_it_once(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    ask = nestegg.durable(llm.complete)
    fail = [True]
    clutch = Clutch("nested", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        first: str = await nestegg.call(ask, "one")
        second: str = await ask("two")
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, first, second]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    assert len(await checkpoint_store.read_journal("job", 1)) == 2
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("one"), answer("two")]
    assert llm.prompts == ["one", "two"]


async def test_calls_inside_a_journaled_call_are_plain_calls(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    ask = nestegg.durable(llm.complete)

    @nestegg.durable
    async def research(topic: str) -> str:
        return ";".join([await ask(f"{topic} 1"), await ask(f"{topic} 2")])

    fail = [True]
    clutch = Clutch("nested", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        replies = [await research("x"), await ask("after")]
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, *replies]

    expected = [f"{answer('x 1')};{answer('x 2')}", answer("after")]
    assert await fail_then_resume(clutch, fail) == expected
    assert llm.prompts == ["x 1", "x 2", "after"]
    functions = [e["function"] for e in await journal_of(checkpoint_store, "job", 1)]
    assert functions == [function_name(research), COMPLETE]


async def test_calling_a_durable_function_takes_its_options_unless_the_call_sets_them(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [ConnectionError("reset")]
    ask = nestegg.durable(llm.complete, retry=RetryPolicy(attempts=2, backoff=0))
    fresh = nestegg.durable(llm.complete, replay="rerun")
    fail = [True]
    clutch = Clutch("options", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        replies: list[str] = [await nestegg.call(ask, "q"), await nestegg.call(fresh, "f")]
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, *replies]

    assert await fail_then_resume(clutch, fail) == [answer("q"), answer("f")]
    assert llm.prompts == ["q", "q", "f", "f"]

    llm.failures["r"] = [ConnectionError("down")]
    with pytest.raises(ConnectionError, match="down"):
        await nestegg.call(ask, "r", retry=RetryPolicy(attempts=1))


def selecting_clutch(
    store: CheckpointStorage, llm: FakeLLM, fail: list[bool], selector_calls: list[str]
) -> Clutch:
    """A selector that makes ``selector_calls`` journaled calls before it picks a worker
    whose second step fails while ``fail[0]``."""
    clutch = Clutch("selecting", strategy=Strategy.SELECTOR, checkpoint=config(store))

    @clutch.selector
    async def choose(data: list[str]) -> str | None:
        for prompt in selector_calls:
            await nestegg.call(llm.complete, f"{prompt} after {len(data)}")
        return "worker" if len(data) < 2 else None

    @clutch.agent()
    async def worker(data: list[str]) -> list[str]:
        reply: str = await nestegg.call(llm.complete, f"work {len(data)}")
        if len(data) == 1 and fail[0]:
            raise Flaky("worker failed")
        return [*data, reply]

    return clutch


async def test_calls_in_a_selector_do_not_break_the_replay(
    checkpoint_store: CheckpointStorage,
) -> None:
    fail = [True]
    clutch = selecting_clutch(checkpoint_store, FakeLLM(), fail, ["choose"])
    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("work 0"), answer("work 1")]


async def test_a_selector_call_is_replayed_when_its_step_runs_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    fail = [True]
    clutch = selecting_clutch(checkpoint_store, llm, fail, ["choose", "confirm"])
    assert await fail_then_resume(clutch, fail) == [answer("work 0"), answer("work 1")]
    assert llm.prompts == [
        *("choose after 0", "confirm after 0", "work 0"),
        *("choose after 1", "confirm after 1", "work 1"),
        *("choose after 2", "confirm after 2"),
    ]
    assert [(e["position"], e["result"]) for e in await journal_of(checkpoint_store, "job", 2)] == [
        (-2, answer("confirm after 1")),
        (-1, answer("choose after 1")),
        (0, answer("work 1")),
    ]


async def test_a_call_in_on_response_is_a_plain_call(checkpoint_store: CheckpointStorage) -> None:
    llm = FakeLLM()

    async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
        await nestegg.call(llm.complete, "after the run")

    clutch = Clutch("hooked", on_response=on_response, checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        return [*data, await nestegg.call(llm.complete, "inside")]

    await clutch.run([], run_id="job")
    assert llm.prompts == ["inside", "after the run"]
    assert await checkpoint_store.read_journal("job", 2) == []


async def test_the_execution_refuses_to_journal_a_call_when_no_step_journals(
    checkpoint_store: CheckpointStorage,
) -> None:
    made: list[str] = []
    refused: list[Exception] = []

    async def invoke() -> str:
        made.append("call")
        return "made"

    async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
        execution = get_context()._execution
        assert execution is not None and not execution.journaling
        try:
            await execution.journaled(COMPLETE, "digest", "record", invoke)
        except RuntimeError as error:
            refused.append(error)

    clutch = Clutch("hooked", on_response=on_response, checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def idle(data: list[str]) -> list[str]:
        return data

    await clutch.run([], run_id="job")
    assert made == []
    assert [str(e) for e in refused] == [
        "journaled() needs a step that journals calls: check journaling"
    ]


# ---------------------------------------------------------- failures and retries


async def test_a_failed_call_is_journaled_and_replayed_as_journaled_call_error(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [ValueError("quota exceeded")]
    called, gate = asyncio.Event(), asyncio.Event()
    clutch = Clutch("solo", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def solo(data: list[str]) -> list[str]:
        try:
            return [await nestegg.call(llm.complete, "q")]
        except ValueError:  # interrupted before the failure fails the step
            called.set()
            await gate.wait()
            raise

    await cancel_in_step(clutch, called)
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["error"] == {
        "type": "ValueError",
        "module": "builtins",
        "message": "quota exceeded",
    }
    assert "result" not in entry

    gate.set()
    message = f"{COMPLETE} failed: ValueError: quota exceeded"
    with pytest.raises(JournaledCallError, match=re.escape(message)) as raised:
        await clutch.resume_latest("job")
    assert llm.prompts == ["q"]
    error = raised.value
    assert (error.function, error.error_type, error.error_message) == (
        COMPLETE,
        "ValueError",
        "quota exceeded",
    )
    [info] = await clutch.list_runs()
    assert info.status == "failed" and info.error is not None
    assert info.error["type"] == "JournaledCallError"


class QuotaExceeded(LookupError):
    """An API client's error class, with an ``__init__`` of its own."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"over {limit} calls")


@pytest.mark.parametrize(
    ("error", "caught_as"),
    [
        (ValueError("not found"), ValueError),
        (TimeoutError("slow API"), OSError),
        (KeyError("k"), LookupError),
        (QuotaExceeded(10), QuotaExceeded),
        (TimeoutError("slow API"), (TimeoutError, JournaledCallError)),
    ],
    ids=["ValueError", "TimeoutError", "KeyError", "class-of-a-module", "either"],
)
async def test_a_replayed_failure_is_caught_by_the_except_clause_that_caught_the_call(
    checkpoint_store: CheckpointStorage,
    error: Exception,
    caught_as: type[Exception] | tuple[type[Exception], ...],
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [error]
    called, gate = asyncio.Event(), asyncio.Event()
    caught: list[tuple[str, str, bool]] = []
    clutch = Clutch("fallback", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        try:
            reply: str = await nestegg.call(llm.complete, "q")
        except caught_as as failure:
            replayed = isinstance(failure, JournaledCallError)
            caught.append((type(failure).__name__, str(failure), replayed))
            reply = "fallback"
        called.set()
        await gate.wait()
        return [*data, reply]

    await cancel_in_step(clutch, called)
    gate.set()
    assert await clutch.resume_latest("job") == ["fallback"]
    assert llm.prompts == ["q"]  # replayed, not called again
    kind = type(error).__qualname__
    replayed = ("JournaledCallError", f"{COMPLETE} failed: {kind}: {error}", True)
    assert caught == [(kind, str(error), False), replayed]


async def test_rerun_calls_again_after_a_recorded_failure(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [ConnectionError("reset")]
    clutch = one_agent(checkpoint_store, lambda: nestegg.call(llm.complete, "q", replay="rerun"))
    with pytest.raises(ConnectionError):
        await clutch.run([], run_id="job")
    assert await clutch.resume_latest("job") == [answer("q")]
    assert llm.prompts == ["q", "q"]
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["result"] == answer("q") and "error" not in entry


async def test_retry_makes_the_attempts_before_recording_the_result(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [ConnectionError("reset"), ConnectionError("reset again")]
    policy = RetryPolicy(attempts=3, backoff=0)
    fail = [True]
    clutch = Clutch("retry", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        reply: str = await nestegg.call(llm.complete, "q", retry=policy)
        if fail[0]:
            raise Flaky("asker failed")
        return [*data, reply]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    assert llm.prompts == ["q"] * 3
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["result"] == answer("q")
    fail[0] = False
    assert await clutch.resume_latest("job") == [answer("q")]
    assert llm.prompts == ["q"] * 3


async def test_retry_records_the_last_failure_and_a_resume_of_the_failed_run_calls_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [ConnectionError(f"reset {i}") for i in range(1, 4)]
    policy = RetryPolicy(attempts=2, backoff=0)
    clutch = one_agent(checkpoint_store, lambda: nestegg.call(llm.complete, "q", retry=policy))

    with pytest.raises(ConnectionError, match="reset 2"):
        await clutch.run([], run_id="job")
    assert llm.prompts == ["q", "q"]
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["error"]["message"] == "reset 2"
    assert await clutch.resume_latest("job") == [answer("q")]  # its attempts again
    assert llm.prompts == ["q"] * 4
    [entry] = await journal_of(checkpoint_store, "job", 1)
    assert entry["result"] == answer("q") and "error" not in entry


@pytest.mark.parametrize("resume", ["latest", "checkpoint"])
async def test_a_failed_runs_resume_calls_again_from_the_first_failure_of_its_failed_step(
    checkpoint_store: CheckpointStorage, resume: str
) -> None:
    llm = FakeLLM()
    llm.failures["b"] = [ValueError("b is down")]
    llm.failures["c"] = [ConnectionError("c is down")]
    once = RetryPolicy(attempts=1)
    clutch = Clutch("outage", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        paid: str = await nestegg.call(llm.complete, "a", retry=once)
        try:
            fell: str = await nestegg.call(llm.complete, "b", retry=once)
        except ValueError:
            fell = "fallback"
        last: str = await nestegg.call(llm.complete, "c", retry=once)
        return [*data, paid, fell, last]

    with pytest.raises(ConnectionError, match="c is down"):
        await clutch.run([], run_id="job")
    assert llm.prompts == ["a", "b", "c"]
    if resume == "latest":
        result = await clutch.resume_latest("job")
    else:
        [checkpoint] = await clutch.list_checkpoints("job")
        result = await clutch.resume(checkpoint.checkpoint_id)

    assert result == [answer("a"), answer("b"), answer("c")]
    assert llm.prompts == ["a", "b", "c", "b", "c"]  # "a" replayed, not paid again
    entries = await journal_of(checkpoint_store, "job", 1)
    assert [(e["position"], e.get("result")) for e in entries] == [
        (0, answer("a")),
        (1, answer("b")),
        (2, answer("c")),
    ]
    assert not any("error" in e for e in entries)


@pytest.mark.parametrize("overflow", [False, True])
async def test_a_failed_runs_resume_interrupted_midway_leaves_no_entry_of_the_failed_attempt(
    checkpoint_store: CheckpointStorage, monkeypatch: pytest.MonkeyPatch, overflow: bool
) -> None:
    """The resume of a failed run drops its failed step's entries from the first failure on
    before it calls again: interrupted after it made the failed call again (which now
    succeeds and takes the step another way), the next resume replays what this attempt
    made, not what the failed attempt made after its failure. With ``overflow`` the entries
    kept do not fit in the opening commit: written just after it, they replay all the same
    ("a" is not paid again)."""
    llm = FakeLLM()
    llm.failures["b"] = [ValueError("b is down")]
    llm.failures["d"] = [ConnectionError("d is down")]
    once = RetryPolicy(attempts=1)
    called, gate = asyncio.Event(), asyncio.Event()
    attempts: list[int] = []
    running: list[asyncio.Task[Any] | None] = []
    clutch = Clutch("outage", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        attempts.append(1)
        paid: str = await nestegg.call(llm.complete, "a", retry=once)
        try:
            reply: str = await nestegg.call(llm.complete, "b", retry=once)
        except ValueError:  # the failed attempt's way: "c", then "d", which fails the run
            await nestegg.call(llm.complete, "c", retry=once)
            await nestegg.call(llm.complete, "d", retry=once)
            return [*data, paid, "fallback"]
        if len(attempts) == 2:  # the failed run's resume: stop it here, "b" made again
            running.append(asyncio.current_task())
            called.set()
            await gate.wait()
        other: str = await nestegg.call(llm.complete, "x", retry=once)
        return [*data, paid, reply, other]

    with pytest.raises(ConnectionError, match="d is down"):
        await clutch.run([], run_id="job")
    if overflow:
        monkeypatch.setattr(checkpointer_module, "COMMIT_MAX_BYTES", 1)
    resumed = asyncio.ensure_future(clutch.resume_latest("job"))
    await wait_for(called)
    assert running[0] is not None
    running[0].cancel()  # the step's task: the run is cancelled there
    with pytest.raises(asyncio.CancelledError):
        await resumed
    [info] = await clutch.list_runs()
    assert info.status == "cancelled"
    entries = await journal_of(checkpoint_store, "job", 1)
    assert [(e["position"], e.get("result")) for e in entries] == [
        (0, answer("a")),
        (1, answer("b")),
    ]

    gate.set()
    assert await clutch.resume_latest("job") == [answer("a"), answer("b"), answer("x")]
    assert llm.prompts == ["a", "b", "c", "d", "b", "x"]  # "a" and the new "b" paid once


class _JournalHiccup(MemoryCheckpointStorage):
    """A memory store whose next commit that carries journal entries alone fails once."""

    hiccup = False

    async def commit(self, commit: Commit) -> None:
        if self.hiccup and commit.journal and not commit.events and commit.truncate_after is None:
            self.hiccup = False
            raise StorageError("the store hiccupped")
        await super().commit(commit)


async def test_a_failed_runs_resume_whose_later_entries_fail_to_be_written_leaves_no_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # its heartbeat went on renewing the lease: the run looked held by a live process
    llm = FakeLLM()
    llm.failures["d"] = [ConnectionError("d is down")]
    store = _JournalHiccup()
    lease = dt.timedelta(seconds=0.3)
    clutch = Clutch("outage", checkpoint=CheckpointConfig(storage=store, lease=lease))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        once = RetryPolicy(attempts=1)
        return [*data, *[await nestegg.call(llm.complete, p, retry=once) for p in "abcd"]]

    with pytest.raises(ConnectionError, match="d is down"):
        await clutch.run([], run_id="job")
    monkeypatch.setattr(checkpointer_module, "COMMIT_MAX_BYTES", 1)  # kept ones come after
    store.hiccup = True
    with pytest.raises(StorageError, match="hiccupped"):
        await clutch.resume_latest("job")
    before = await store.get_run("job")
    await asyncio.sleep(0.5)  # more than a renewal's interval, a third of the lease
    after = await store.get_run("job")
    assert before is not None and after is not None
    assert after.lease_until == before.lease_until  # no renewal: its lease runs out
    await asyncio.sleep(0.3)
    assert await clutch.resume_latest("job") == [answer(p) for p in "abcd"]
    # the entries the hiccup lost are made again, as after a crash there
    assert llm.prompts == ["a", "b", "c", "d", "a", "b", "c", "d"]


async def test_a_failed_runs_resume_with_a_damaged_entry_in_its_failed_step_fails_it_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    # it raised before its opening commit: the run stayed claimed by this process
    llm = FakeLLM()
    llm.failures["b"] = [ConnectionError("b is down")]
    once = RetryPolicy(attempts=1)
    clutch = Clutch("outage", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        return [*data, *[await nestegg.call(llm.complete, p, retry=once) for p in "ab"]]

    with pytest.raises(ConnectionError, match="b is down"):
        await clutch.run([], run_id="job")
    run = await checkpoint_store.get_run("job")
    assert run is not None
    garbage = JournalRecord("job", 1, 0, b"not a journal entry")
    await checkpoint_store.commit(Commit("job", run.fence, journal=[garbage]))
    with pytest.raises(CheckpointCorruptedError, match="journal entry 1/0 of run 'job'"):
        await clutch.resume_latest("job")
    [info] = await clutch.list_runs()
    assert info.status == "failed"
    assert llm.prompts == ["a", "b"]


async def test_retry_leaves_errors_it_is_not_for_to_be_recorded_at_once(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    llm.failures["q"] = [ValueError("bad request"), ValueError("bad request")]
    policy = RetryPolicy(attempts=5, backoff=0, on=(TimeoutError, ConnectionError))
    clutch = one_agent(checkpoint_store, lambda: nestegg.call(llm.complete, "q", retry=policy))
    with pytest.raises(ValueError, match="bad request"):
        await clutch.run([], run_id="job")
    assert llm.prompts == ["q"]


async def test_retry_backoff_doubles_between_attempts() -> None:
    attempts: list[float] = []

    async def flaky() -> str:
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise TimeoutError("slow")
        return "ok"

    assert await nestegg.call(flaky, retry=RetryPolicy(attempts=3, backoff=0.05)) == "ok"
    first_wait, second_wait = attempts[1] - attempts[0], attempts[2] - attempts[1]
    assert first_wait >= 0.05 and second_wait >= 0.1


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"attempts": 0}, "RetryPolicy.attempts must be an int >= 1, got 0"),
        ({"attempts": -2}, "RetryPolicy.attempts must be an int >= 1, got -2"),
        ({"attempts": 2.5}, "RetryPolicy.attempts must be an int >= 1, got 2.5"),
        ({"attempts": "3"}, "RetryPolicy.attempts must be an int >= 1, got '3'"),
        (
            {"attempts": True},
            "RetryPolicy.attempts must be an int >= 1, got True (a bool, not a number)",
        ),
        (
            {"backoff": -0.5},
            "RetryPolicy.backoff must be a finite number of seconds >= 0, got -0.5",
        ),
    ],
)
async def test_retry_policy_rejects_bad_values(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        RetryPolicy(**settings)


@pytest.mark.parametrize(
    "settings",
    [
        {"backoff": math.nan},
        {"backoff": math.inf},
        {"backoff": "1"},
        {"backoff": None},
        {"backoff": True},
        {"attempts": True},
        {"on": ("TimeoutError",)},
        {"on": (int,)},
        {"on": TimeoutError},
        {"on": [TimeoutError]},
        {"on": (KeyboardInterrupt,)},
    ],
    ids=[
        "nan",
        "inf",
        "str",
        "none",
        "backoff-bool",
        "attempts-bool",
        "on-str",
        "on-int",
        "on-bare-class",
        "on-list",
        "on-base-exception",
    ],
)
async def test_retry_policy_rejects_values_it_cannot_use(settings: dict[str, Any]) -> None:
    [(field, value)] = settings.items()
    with pytest.raises(ConfigurationError, match=re.escape(f"RetryPolicy.{field} must be")) as e:
        RetryPolicy(**settings)
    assert str(e.value).endswith((repr(value), shown(value))) or f"got {value!r}:" in str(e.value)


async def test_replay_must_be_record_or_rerun(checkpoint_store: CheckpointStorage) -> None:
    llm = FakeLLM()
    message = "replay must be 'record' or 'rerun', got 'always'"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await nestegg.call(llm.complete, "q", replay="always")  # type: ignore[arg-type]
    clutch = one_agent(
        checkpoint_store,
        lambda: nestegg.call(llm.complete, "q", replay="never"),  # type: ignore[arg-type]
    )
    with pytest.raises(ConfigurationError, match=re.escape(message.replace("always", "never"))):
        await clutch.run([], run_id="job")
    assert llm.prompts == []
    assert await checkpoint_store.read_journal("job", 1) == []


async def test_durable_rejects_a_bad_replay_when_it_decorates() -> None:
    with pytest.raises(ConfigurationError, match="replay must be 'record' or 'rerun'"):
        nestegg.durable(replay="always")  # type: ignore[call-overload]


async def test_durable_and_call_reject_what_they_cannot_use() -> None:
    llm = FakeLLM()
    message = "retry must be a nestegg.RetryPolicy or None, got 3"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        nestegg.durable(retry=3)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await nestegg.call(llm.complete, "q", retry=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=re.escape("durable() decorates a function")):
        nestegg.durable("ask")  # type: ignore[call-overload]
    assert llm.prompts == []


async def test_call_refuses_what_is_not_callable_naming_it() -> None:
    # a raw TypeError: 'int' object is not callable, from deep inside
    message = "call() calls a function (sync or async), got 5 (type int, not callable)"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await nestegg.call(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=re.escape("got 'ask' (type str, not callable)")):
        await nestegg.call("ask", "q")  # type: ignore[arg-type]


async def test_a_result_that_cannot_be_stored_fails_the_step_naming_the_function(
    checkpoint_store: CheckpointStorage,
) -> None:
    llm = FakeLLM()
    clutch = one_agent(checkpoint_store, lambda: nestegg.call(llm.echo, threading.Lock()))
    message = "cannot store the value at result of tests.test_journal.FakeLLM.echo: type lock"
    with pytest.raises(CheckpointSerializationError, match=re.escape(message)):
        await clutch.run([], run_id="job")
    assert await checkpoint_store.read_journal("job", 1) == []
    [info] = await clutch.list_runs()
    assert info.status == "failed"


async def huge_count() -> dict[str, int]:
    """A call whose result has an int of more digits than Python reads back."""
    return {"count": 10**5000}


async def test_a_result_with_an_int_too_large_fails_the_step_naming_where(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch = one_agent(checkpoint_store, lambda: nestegg.call(huge_count))
    where = "result of tests.test_journal.huge_count.count: type int is not serializable"
    with pytest.raises(CheckpointSerializationError, match=re.escape(where)) as raised:
        await clutch.run([], run_id="job")
    assert (raised.value.path, raised.value.type_name) == (
        "result of tests.test_journal.huge_count.count",
        "int",
    )
    assert "more than 4,300 digits" in str(raised.value)
    assert await checkpoint_store.read_journal("job", 1) == []
    [info] = await clutch.list_runs()
    assert info.status == "failed" and info.steps == 0
    assert info.error is not None and info.error["type"] == "CheckpointSerializationError"


async def bits(number: int, sizes: set[int]) -> int:
    """A call that takes ints of any size."""
    return max(n.bit_length() for n in {number, *sizes})


@pytest.mark.parametrize("big", [2**64, -(2**63) - 1, 10**5000], ids=["2**64", "-2**63-1", "huge"])
async def test_a_call_taking_an_int_past_64_bits_is_journaled(
    big: int, checkpoint_store: CheckpointStorage
) -> None:
    clutch = one_agent(checkpoint_store, lambda: nestegg.call(bits, big, sizes={big}))
    assert await clutch.run([], run_id="job") == [big.bit_length()]
    assert len(await checkpoint_store.read_journal("job", 1)) == 1
    assert argument_hash((big,), {}) == argument_hash((big,), {})
    assert argument_hash((big,), {}) != argument_hash((big + 1,), {})


@dataclasses.dataclass
class Wide:
    """A dataclass, which orjson writes itself (no default= sees it)."""

    number: int
    kind: str = "wide"


class WideEnum(enum.Enum):
    BIG = 2**70


@pytest.mark.parametrize(
    "wide",
    [
        Wide(2**70),
        [Wide(2**70)],
        {"in": Wide(-(2**70))},
        WideEnum.BIG,
        {2**70: "a key"},
        {Wide(2**70).kind: {2**64}},
    ],
    ids=["dataclass", "list", "nested", "enum", "key", "set"],
)
def test_an_int_past_64_bits_anywhere_in_the_arguments_is_hashed(wide: Any) -> None:
    digest = argument_hash((wide,), {"at": wide})
    assert digest == argument_hash((wide,), {"at": wide})
    assert argument_hash((wide,), {}) != argument_hash(([wide],), {})


def test_an_int_past_64_bits_is_hashed_apart_from_any_text() -> None:
    # as text, hexadecimal or not, in a value or as a key: a changed argument is seen
    for big in (2**64, -(2**63) - 1):
        for text in (f"<int {big:#x}>", f"{big:#x}", str(big)):
            assert argument_hash((big,), {}) != argument_hash((text,), {})
            assert argument_hash(([big, big],), {}) != argument_hash(([big, text],), {})
            assert argument_hash(({big: 1},), {}) != argument_hash(({text: 1},), {})
            assert argument_hash((Wide(big),), {}) != argument_hash((Wide(text),), {})  # type: ignore[arg-type]


@dataclasses.dataclass
class Spot:
    x: int
    y: list[int]


class Size(BaseModel):
    width: int


class Color(enum.Enum):
    RED = "red"


HASHED_BEFORE = {
    "7eda455a147de8969b73031e": ((2**63 - 1, -(2**63), 2**64 - 1, 1.5, None, True, "é"), {}),
    "4e303556bd5dcbb03f101887": (
        ({"b": [1, (2, 3)], 1: "one"}, {3, 1, 2}, b"\x00\xff"),
        {"k": frozenset({"a"})},
    ),
    "f3adcf4e8b9cbeaf2f239bc8": (
        (Spot(1, [2]), Size(width=3), Color.RED),
        {"at": Spot(-(2**63), [2**64 - 1])},
    ),
    "1fe19861e25ed848eea569e6": (
        ("<int 0x10000000000000000>",),
        {"0x10000000000000000": "<int -0x8000000000000001>"},
    ),
}
"""Arguments with the hashes the journals of earlier versions hold for them."""


@pytest.mark.parametrize("digest", list(HASHED_BEFORE))
def test_arguments_without_a_wide_int_hash_as_they_did(digest: str) -> None:
    args, kwargs = HASHED_BEFORE[digest]
    assert argument_hash(args, kwargs) == digest


# ------------------------------------------------------------------ plain calls


async def test_without_checkpointing_every_call_is_made() -> None:
    llm = FakeLLM()
    ask = nestegg.durable(llm.complete)
    clutch = Clutch("plain")

    @clutch.agent()
    async def asker(data: list[str]) -> list[str]:
        return [*data, await ask("q"), await nestegg.call(llm.complete_sync, "r")]

    assert await clutch.run([]) == [answer("q"), answer("r")]
    assert await clutch.run([]) == [answer("q"), answer("r")]
    assert llm.prompts == ["q", "r", "q", "r"]


async def test_outside_an_agent_the_calls_are_plain_calls() -> None:
    llm = FakeLLM()
    llm.failures["q"] = [TimeoutError("slow")]
    ask = nestegg.durable(llm.complete_sync)
    assert await ask("p") == answer("p")
    assert await ask("p") == answer("p")
    policy = RetryPolicy(attempts=2, backoff=0)
    assert await nestegg.call(llm.complete, "q", retry=policy) == answer("q")
    assert llm.prompts == ["p", "p", "q", "q"]
    llm.failures["q"] = [ConnectionError("down")]
    with pytest.raises(ConnectionError, match="down"):
        await nestegg.call(llm.complete, "q")
    assert llm.prompts == ["p", "p", "q", "q", "q"]


# --------------------------------------------------------------------- lifetime


async def test_the_journal_is_kept_with_the_run_and_deleted_with_it(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Journaled(checkpoint_store)
    assert await pipeline.clutch.run([], run_id="job") == pipeline.expected()
    journals = [await journal_of(checkpoint_store, "job", step) for step in (1, 2, 3)]
    assert [[e["result"] for e in journal] for journal in journals] == [
        [answer(f"{agent}/{turn}/{i}") for i in range(CALLS_PER_STEP)]
        for turn, agent in enumerate("abc")
    ]

    assert await pipeline.clutch.delete_run("job")
    reopened = await reopen_store()
    for step in (1, 2, 3):
        assert await reopened.read_journal("job", step) == []
    assert await pipeline.clutch.run([], run_id="job") == pipeline.expected()
    assert pipeline.llm.prompts == step_prompts(["a", "b", "c"]) * 2


async def test_each_run_has_its_own_journal(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Journaled(checkpoint_store)
    pipeline.fail_turn = 1
    for run_id in ("one", "two"):
        with pytest.raises(Flaky):
            await pipeline.clutch.run([], run_id=run_id)
    pipeline.fail_turn = None
    assert await pipeline.clutch.resume_latest("one") == pipeline.expected()
    assert await pipeline.clutch.resume_latest("two") == pipeline.expected()
    last_step = step_prompts(["a", "b", "c"])[4:]
    assert pipeline.llm.prompts == step_prompts(["a", "b"]) * 2 + last_step * 2


async def test_resuming_an_older_checkpoint_calls_again_in_the_steps_it_drops(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Journaled(checkpoint_store, keep_latest=None)
    assert await pipeline.clutch.run([], run_id="job") == pipeline.expected()
    first, *_ = await pipeline.clutch.list_checkpoints("job")
    assert await pipeline.clutch.resume(first.checkpoint_id) == pipeline.expected()
    assert pipeline.executed == ["a", "b", "c", "b", "c"]
    assert pipeline.llm.prompts == step_prompts(["a", "b", "c"]) + step_prompts(["a", "b", "c"])[2:]
