"""Fork and time travel: ``clutch.fork(checkpoint_id, data, run_id)`` continues from a
checkpoint on a new run that records its parent; ``clutch.history(run_id)`` lists a run's
steps and checkpoints with their parents, and the runs forked from it.

The tests compare what is stored of the original run (and, for bad input, of every run)
before and after a fork: a fork writes only its own run, and bad input writes nothing.
Checked on every embedded store (memory, SQLite, file) and on PostgreSQL and Redis.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pydantic import BaseModel

import nestegg
from nestegg import Clutch, Handover, Strategy, Terminate, get_context
from nestegg.checkpoint.ownership import host_id
from nestegg.checkpoint.records import Owner, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.views import CheckpointInfo, RunHistory
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    CheckpointSerializationError,
    ConfigurationError,
    IncompatibleCheckpointError,
    IncompatibleDataError,
    InvalidIdentifierError,
    RunExistsError,
    RunNotFoundError,
)
from nestegg.testing import fixtures as store_fixtures
from nestegg.testing.fixtures import StoreFactory
from tests.cli.conftest import GONE_PID
from tests.registry import SERVER_KINDS

from .conftest import Flaky, Pipeline, Tamper, config, stored_view, wait_for

# Every registered store (tests/registry.py), for the server stores (PostgreSQL, Redis).

Reopen = Callable[[], Awaitable[CheckpointStorage]]
store_factory = store_fixtures.store_factory
store_name = store_fixtures.store_name
SERVER_STORES = [pytest.param(kind, marks=pytest.mark.server) for kind in SERVER_KINDS]
NAMES = ("a", "b", "c", "d")


async def stored_everything(store: CheckpointStorage) -> dict[str, Any]:
    """Everything stored of every run, journal entries included, as comparable values."""
    views: dict[str, Any] = {}
    for run in await store.list_runs():
        view = await stored_view(store, run.run_id)
        steps = range(1, run.step_seq + 2)
        view["journal"] = [await store.read_journal(run.run_id, step) for step in steps]
        views[run.run_id] = view
    return views


async def finished(pipeline: Pipeline, run_id: str = "orig") -> list[CheckpointInfo]:
    """Run ``pipeline`` to its end as ``run_id``; the checkpoints it keeps."""
    assert await pipeline.clutch.run([], run_id=run_id) == list(NAMES)
    pipeline.calls.clear()
    return await pipeline.clutch.list_checkpoints(run_id)


def tree_edges(*histories: RunHistory) -> dict[str, str | None]:
    """checkpoint id -> parent checkpoint id, over the given runs' histories."""
    return {c.info.checkpoint_id: c.parent_id for h in histories for c in h.checkpoints}


# ------------------------------------------------------------------------- fork


async def test_a_fork_continues_from_the_checkpoint_on_a_new_run(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)

    assert await pipeline.clutch.fork(checkpoints[1].checkpoint_id, run_id="fork") == list(NAMES)
    assert pipeline.calls == ["c", "d"]
    runs = {r.run_id: r for r in await pipeline.clutch.list_runs()}
    assert set(runs) == {"orig", "fork"}
    fork = runs["fork"]
    assert fork.status == "completed" and fork.steps == 4 and fork.pipeline == "pipeline"
    assert (fork.parent_run, fork.parent_checkpoint) == ("orig", checkpoints[1].checkpoint_id)
    assert (runs["orig"].parent_run, runs["orig"].parent_checkpoint) == (None, None)
    [first, *later] = await pipeline.clutch.list_checkpoints("fork")
    assert (first.seq, first.reason, first.run_id) == (2, "fork", "fork")
    assert [(c.seq, c.reason) for c in later] == [(3, "policy"), (4, "policy")]


async def test_a_fork_continues_with_the_data_it_is_given(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)

    result = await pipeline.clutch.fork(checkpoints[1].checkpoint_id, data=["x"], run_id="fork")
    assert result == ["x", "c", "d"]
    assert pipeline.calls == ["c", "d"]
    [first, *_] = await pipeline.clutch.list_checkpoints("fork")
    state = await pipeline.clutch.get_checkpoint(first.checkpoint_id)
    assert (state.data, state.seq, state.turn, state.next_agent) == (["x"], 2, 2, None)


async def test_a_fork_leaves_the_original_run_unchanged(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    before = await stored_everything(checkpoint_store)

    await pipeline.clutch.fork(checkpoints[0].checkpoint_id, data=["x"], run_id="one")
    await pipeline.clutch.fork(checkpoints[2].checkpoint_id, run_id="two")
    after = await stored_everything(checkpoint_store)
    assert set(after) == {"orig", "one", "two"}
    assert after["orig"] == before["orig"]
    assert await pipeline.clutch.resume_latest("orig") == list(NAMES)
    assert pipeline.calls == ["b", "c", "d", "d"]


async def test_a_fork_without_a_run_id_gets_a_new_one(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    await pipeline.clutch.fork(checkpoints[-1].checkpoint_id)
    await pipeline.clutch.fork(checkpoints[-1].checkpoint_id)
    forks = [r for r in await pipeline.clutch.list_runs() if r.run_id != "orig"]
    assert len(forks) == 2 and forks[0].run_id != forks[1].run_id
    assert all(f.run_id.startswith("run-") and f.parent_run == "orig" for f in forks)
    assert pipeline.calls == []


async def test_a_fork_logs_where_it_came_from(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    checkpoint_id = checkpoints[-2].checkpoint_id
    await pipeline.clutch.fork(checkpoint_id, run_id="fork")
    [forked, *rest] = await pipeline.clutch.events("fork")
    assert (forked.seq, forked.kind) == (1, "run_forked")
    assert forked.data == {"parent_run": "orig", "parent_checkpoint": checkpoint_id}
    assert [e.seq for e in rest] == list(range(2, len(rest) + 2))
    assert rest[0].kind == "step_started" and rest[-1].kind == "run_completed"
    assert "run_resumed" not in {e.kind for e in rest}
    [fork] = [r for r in await pipeline.clutch.list_runs() if r.run_id == "fork"]
    assert fork.fence == 1


async def test_a_fork_of_a_failed_run_leaves_it_failed_and_resumable(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="orig")
    pipeline.fail.clear()
    before = await stored_view(checkpoint_store, "orig")
    [*_, latest] = await pipeline.clutch.list_checkpoints("orig")

    assert await pipeline.clutch.fork(latest.checkpoint_id, run_id="fork") == list(NAMES)
    assert await stored_view(checkpoint_store, "orig") == before
    [orig] = await pipeline.clutch.list_runs("failed")
    assert orig.run_id == "orig" and orig.error is not None and orig.error["agent"] == "c"
    assert await pipeline.clutch.resume_latest("orig") == list(NAMES)
    assert pipeline.calls == ["a", "b", "c", "c", "d", "c", "d"]


def branching(store: CheckpointStorage, strategy: Strategy, calls: list[str]) -> Clutch:
    """A Clutch whose agents log themselves and append their name: ROUND_ROBIN cycles a,
    b, c for 5 turns, GRAPH runs a -> c -> b, SELECTOR picks c, a, b."""
    clutch = Clutch(
        "branching",
        strategy=strategy,
        max_turns=5 if strategy is Strategy.ROUND_ROBIN else 100,
        checkpoint=config(store, keep_latest=None),
    )
    edges = {"a": ["c"], "c": ["b"]} if strategy is Strategy.GRAPH else {}
    for name in ("a", "b", "c"):

        async def agent(data: list[str], name: str = name) -> list[str]:
            calls.append(name)
            return [*data, name]

        agent.__name__ = agent.__qualname__ = name
        clutch.agent(edges=edges.get(name))(agent)
    if strategy is Strategy.SELECTOR:

        @clutch.selector
        async def choose(data: list[str]) -> str | None:
            return ["c", "a", "b"][len(data)] if len(data) < 3 else None

    return clutch


@pytest.mark.parametrize(
    ("strategy", "order"),
    [
        (Strategy.ROUND_ROBIN, ["a", "b", "c", "a", "b"]),
        (Strategy.GRAPH, ["a", "c", "b"]),
        (Strategy.SELECTOR, ["c", "a", "b"]),
    ],
    ids=["round-robin", "graph", "selector"],
)
async def test_a_fork_continues_at_the_strategy_position_of_the_checkpoint(
    strategy: Strategy, order: list[str], checkpoint_store: CheckpointStorage
) -> None:
    calls: list[str] = []
    clutch = branching(checkpoint_store, strategy, calls)
    assert await clutch.run([], run_id="orig") == order
    checkpoints = await clutch.list_checkpoints("orig")
    calls.clear()
    assert await clutch.fork(checkpoints[1].checkpoint_id, run_id="fork") == order
    assert calls == order[2:]


async def test_a_fork_of_a_fork_names_the_fork_as_its_parent(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    await pipeline.clutch.fork(checkpoints[0].checkpoint_id, data=["x"], run_id="child")
    child_checkpoints = await pipeline.clutch.list_checkpoints("child")
    assert [c.seq for c in child_checkpoints] == [1, 2, 3, 4]

    grandchild = await pipeline.clutch.fork(child_checkpoints[0].checkpoint_id, run_id="grand")
    assert grandchild == ["x", "b", "c", "d"]
    runs = {r.run_id: r for r in await pipeline.clutch.list_runs()}
    assert runs["grand"].parent_run == "child"
    assert runs["grand"].parent_checkpoint == child_checkpoints[0].checkpoint_id


async def test_a_fork_outlives_the_deletion_of_its_parent(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    pipeline.fail.add("d")
    with pytest.raises(Flaky):
        await pipeline.clutch.fork(checkpoints[1].checkpoint_id, data=["x"], run_id="fork")
    assert await pipeline.clutch.delete_run("orig")
    assert await checkpoint_store.get_checkpoint(checkpoints[1].checkpoint_id) is None

    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("fork") == ["x", "c", "d"]
    history = await pipeline.clutch.history("fork")
    assert [s.agent for s in history.steps] == list(NAMES)
    assert history.run.parent_run == "orig"


async def test_a_failed_fork_resumes_with_the_data_it_was_given(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    before = await stored_view(checkpoint_store, "orig")
    pipeline.fail.add("c")
    with pytest.raises(Flaky, match="c failed on purpose"):
        await pipeline.clutch.fork(checkpoints[1].checkpoint_id, data=["x"], run_id="fork")

    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("fork") == ["x", "c", "d"]
    assert pipeline.calls == ["c", "c", "d"]
    assert await stored_view(checkpoint_store, "orig") == before


def history_reader(
    store: CheckpointStorage,
    seen: dict[tuple[str, str], list[Any]],
    fail: set[str],
    *,
    hand_over_first: bool = False,
) -> Clutch:
    """A Clutch of agents a, b, c, d that log the history data they see, per run; with
    ``hand_over_first``, a hands over to b without producing data."""
    clutch = Clutch("pipeline", checkpoint=config(store, keep_latest=None))
    for name in NAMES:

        async def agent(data: list[str], name: str = name) -> list[str]:
            ctx = get_context()
            seen[(ctx.run_id, name)] = [entry["data"] for entry in ctx.state.history]
            if name in fail:
                raise Flaky(f"{name} failed on purpose")
            if hand_over_first and name == "a":
                raise Handover("b")
            return [*data, name]

        agent.__name__ = agent.__qualname__ = name
        clutch.agent()(agent)
    return clutch


async def test_a_resumed_fork_restores_the_history_it_had(
    checkpoint_store: CheckpointStorage,
) -> None:
    seen: dict[tuple[str, str], list[Any]] = {}
    fail: set[str] = set()
    clutch = history_reader(checkpoint_store, seen, fail)
    assert await clutch.run([], run_id="orig") == list(NAMES)
    checkpoints = await clutch.list_checkpoints("orig")
    fail.add("d")
    with pytest.raises(Flaky):
        await clutch.fork(checkpoints[1].checkpoint_id, data=["x"], run_id="fork")
    lived = seen["fork", "d"]
    assert lived == [[], ["a"], ["x"]]

    [*_, latest] = await clutch.list_checkpoints("fork")
    restored = await clutch.get_checkpoint(latest.checkpoint_id)
    assert (restored.seq, restored.data) == (3, ["x", "c"])
    assert [entry["data"] for entry in restored.history] == lived
    fail.clear()
    assert await clutch.resume_latest("fork") == ["x", "c", "d"]
    assert seen["fork", "d"] == lived


def asking(store: CheckpointStorage, prompts: list[str], fail: set[str]) -> Clutch:
    """A Clutch of agents a, b, c, d that each make one journaled call (logged in
    ``prompts``), then fail if named in ``fail``, else append the reply."""

    async def complete(prompt: str) -> str:
        prompts.append(prompt)
        return prompt.upper()

    clutch = Clutch("journaled", checkpoint=config(store, keep_latest=None))
    for name in NAMES:

        async def agent(data: list[str], name: str = name) -> list[str]:
            reply: str = await nestegg.call(complete, f"{name} after {data}")
            if name in fail:
                raise Flaky(f"{name} failed on purpose")
            return [*data, reply]

        agent.__name__ = agent.__qualname__ = name
        clutch.agent()(agent)
    return clutch


async def test_a_fork_makes_and_journals_its_own_calls(
    checkpoint_store: CheckpointStorage,
) -> None:
    prompts: list[str] = []
    fail: set[str] = set()
    clutch = asking(checkpoint_store, prompts, fail)

    original = await clutch.run([], run_id="orig")
    checkpoints = await clutch.list_checkpoints("orig")
    before = await stored_everything(checkpoint_store)
    prompts.clear()
    fail.add("d")
    with pytest.raises(Flaky):
        await clutch.fork(checkpoints[1].checkpoint_id, run_id="fork")
    assert prompts == [f"c after {original[:2]}", f"d after {original[:3]}"]
    assert len(await checkpoint_store.read_journal("fork", 4)) == 1

    fail.clear()
    assert await clutch.resume_latest("fork") == original
    assert len(prompts) == 2
    after = await stored_everything(checkpoint_store)
    assert after["orig"] == before["orig"]


async def test_a_resumed_fork_restores_the_data_it_was_given_in_place_of_the_input(
    checkpoint_store: CheckpointStorage,
) -> None:
    seen: dict[tuple[str, str], list[Any]] = {}
    fail: set[str] = set()
    clutch = history_reader(checkpoint_store, seen, fail, hand_over_first=True)
    assert await clutch.run([], run_id="orig") == list(NAMES[1:])
    [handed_over, *_] = await clutch.list_checkpoints("orig")
    before = await stored_view(checkpoint_store, "orig")
    assert (handed_over.seq, seen["orig", "b"]) == (1, [])
    fail.add("d")
    with pytest.raises(Flaky):
        await clutch.fork(handed_over.checkpoint_id, data=["x"], run_id="fork")
    lived = seen["fork", "d"]
    assert lived == [["x"], ["x", "b"]]

    [*_, latest] = await clutch.list_checkpoints("fork")
    restored = await clutch.get_checkpoint(latest.checkpoint_id)
    assert (restored.seq, restored.data) == (3, ["x", "b", "c"])
    assert [entry["data"] for entry in restored.history] == lived
    fail.clear()
    assert await clutch.resume_latest("fork") == ["x", "b", "c", "d"]
    assert seen["fork", "d"] == lived
    assert await stored_view(checkpoint_store, "orig") == before


async def test_a_forks_parent_checkpoint_may_be_pruned_and_the_fork_goes_on(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    origin = checkpoints[1].checkpoint_id
    pruning = Pipeline(checkpoint_store, NAMES, keep_latest=1)
    pruning.fail.add("d")
    with pytest.raises(Flaky):
        await pruning.clutch.fork(origin, data=["x"], run_id="fork")
    [latest] = await pruning.clutch.list_checkpoints("fork")
    assert (latest.seq, latest.reason) == (3, "policy")
    fork = await pruning.clutch.history("fork")
    assert [(c.info, c.parent_id) for c in fork.checkpoints] == [(latest, origin)]

    assert await pruning.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 3}
    assert await checkpoint_store.get_checkpoint(origin) is None
    fork = await pruning.clutch.history("fork")
    assert fork.run.parent_checkpoint == fork.checkpoints[0].parent_id == origin
    pruning.fail.clear()
    assert await pruning.clutch.resume_latest("fork") == ["x", "c", "d"]


async def test_resuming_an_older_checkpoint_calls_again_from_it_on(
    checkpoint_store: CheckpointStorage,
) -> None:
    prompts: list[str] = []
    clutch = asking(checkpoint_store, prompts, set())
    original = await clutch.run([], run_id="orig")
    first, *_ = await clutch.list_checkpoints("orig")
    journal = [await checkpoint_store.read_journal("orig", step) for step in (1, 2, 3, 4)]
    prompts.clear()

    assert await clutch.resume(first.checkpoint_id) == original
    assert prompts == [f"{name} after {original[:at]}" for at, name in enumerate(NAMES)][1:]
    again = [await checkpoint_store.read_journal("orig", step) for step in (1, 2, 3, 4)]
    assert again[0] == journal[0]
    assert all(len(entries) == 1 for entries in again)


async def test_resuming_the_checkpoint_before_a_failed_step_replays_its_calls(
    checkpoint_store: CheckpointStorage,
) -> None:
    prompts: list[str] = []
    fail = {"c"}
    clutch = asking(checkpoint_store, prompts, fail)
    with pytest.raises(Flaky):
        await clutch.run([], run_id="orig")
    [*_, latest] = await clutch.list_checkpoints("orig")
    assert latest.seq == 2
    fail.clear()
    assert len(await clutch.resume(latest.checkpoint_id)) == len(NAMES)
    assert [p.split()[0] for p in prompts] == list(NAMES)


async def test_resuming_past_a_damaged_checkpoint_replays_the_calls_of_the_later_steps(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    prompts: list[str] = []
    fail = {"d"}
    clutch = asking(checkpoint_store, prompts, fail)
    with pytest.raises(Flaky):
        await clutch.run([], run_id="orig")
    [*_, latest] = await clutch.list_checkpoints("orig")
    await tamper.damage_checkpoint(latest.checkpoint_id, lambda raw: raw.replace(b"}", b"]", 1))
    fail.clear()
    with pytest.warns(CheckpointFallbackWarning):
        assert len(await clutch.resume_latest("orig")) == len(NAMES)
    assert [p.split()[0] for p in prompts] == list(NAMES)


async def test_a_fork_waits_no_longer_than_its_timeout_and_goes_on(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    gate = pipeline.gate("d")
    with pytest.raises(TimeoutError):
        await pipeline.clutch.fork(checkpoints[1].checkpoint_id, run_id="fork", timeout=0.05)
    await wait_for(pipeline.entered["d"])
    gate.set()
    for _ in range(200):
        runs = {r.run_id: r.status for r in await pipeline.clutch.list_runs()}
        if runs["fork"] == "completed":
            break
        await asyncio.sleep(0.01)
    assert runs == {"orig": "completed", "fork": "completed"}


@pytest.mark.parametrize("store_name", SERVER_STORES, indirect=True)
async def test_server_stores_fork_and_draw_the_tree(store_factory: StoreFactory) -> None:
    store = await store_factory()
    pipeline = Pipeline(store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    before = await stored_everything(store)
    checkpoint_id = checkpoints[1].checkpoint_id

    restarted = Pipeline(await store_factory(), NAMES, keep_latest=None)
    assert await restarted.clutch.fork(checkpoint_id, data=["x"], run_id="fork") == [
        "x",
        "c",
        "d",
    ]
    assert restarted.calls == ["c", "d"]
    after = await stored_everything(store)
    assert after["orig"] == before["orig"]
    fork = await restarted.clutch.history("fork")
    assert (fork.run.parent_run, fork.run.parent_checkpoint) == ("orig", checkpoint_id)
    assert fork.checkpoints[0].parent_id == checkpoint_id
    assert [f.run_id for f in (await restarted.clutch.history("orig")).forks] == ["fork"]


# ------------------------------------------------------------------ bad input


async def test_a_fork_of_an_unknown_checkpoint_raises_not_found_and_stores_nothing(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    message = "no checkpoint '0190aa00-nope' in the store"
    with pytest.raises(CheckpointNotFoundError, match=re.escape(message)):
        await pipeline.clutch.fork("0190aa00-nope", run_id="fork")
    assert await stored_everything(checkpoint_store) == before
    assert pipeline.calls == []


async def test_a_fork_of_a_malformed_checkpoint_id_is_an_invalid_identifier(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    with pytest.raises(InvalidIdentifierError, match=re.escape("checkpoint id '../orig'")):
        await pipeline.clutch.fork("../orig", run_id="fork")
    assert await stored_everything(checkpoint_store) == before


async def test_a_fork_to_a_malformed_run_id_is_refused_before_the_store_is_read(
    checkpoint_store: CheckpointStorage,
) -> None:
    """Even from a checkpoint that does not exist: the id is checked first."""
    pipeline = Pipeline(checkpoint_store, NAMES)
    await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    with pytest.raises(InvalidIdentifierError, match=re.escape("run id '../x'")):
        await pipeline.clutch.fork("01nosuchcheckpoint", run_id="../x")
    assert await stored_everything(checkpoint_store) == before


@pytest.mark.parametrize("taken", ["orig", "other", "failed"])
async def test_a_fork_to_a_taken_run_id_raises_run_exists_and_stores_nothing(
    taken: str, checkpoint_store: CheckpointStorage
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    await pipeline.clutch.run(["other"], run_id="other")
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["failed"], run_id="failed")
    pipeline.fail.clear()
    pipeline.calls.clear()
    before = await stored_everything(checkpoint_store)

    message = f"run {taken!r} exists; choose another run_id"
    with pytest.raises(RunExistsError, match=re.escape(message)) as raised:
        await pipeline.clutch.fork(checkpoints[1].checkpoint_id, run_id=taken)
    assert raised.value.run_id == taken
    assert await stored_everything(checkpoint_store) == before
    assert pipeline.calls == []


@pytest.mark.parametrize(
    ("run_id", "message"),
    [
        (
            "../escape",
            "run id '../escape' contains '..' at index 0 "
            "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)",
        ),
        (
            "a/b",
            "run id 'a/b' contains a path separator '/' at index 1 "
            "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)",
        ),
        ("", "run id must be a non-empty string, got ''"),
        ("r" * 201, "is 201 characters long; at most 200 are allowed"),
    ],
    ids=["dotdot", "slash", "empty", "long"],
)
async def test_a_fork_to_a_bad_run_id_raises_invalid_identifier_and_stores_nothing(
    run_id: str, message: str, checkpoint_store: CheckpointStorage
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    with pytest.raises(InvalidIdentifierError, match=re.escape(message)):
        await pipeline.clutch.fork(checkpoints[1].checkpoint_id, run_id=run_id)
    assert await stored_everything(checkpoint_store) == before
    assert pipeline.calls == []


async def test_a_fork_of_another_pipelines_checkpoint_raises_and_stores_nothing(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    other = Pipeline(checkpoint_store, NAMES, name="other")
    before = await stored_everything(checkpoint_store)
    checkpoint_id = checkpoints[1].checkpoint_id
    message = f"checkpoint {checkpoint_id!r} belongs to pipeline 'pipeline', not 'other'"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await other.clutch.fork(checkpoint_id, run_id="fork")
    assert await stored_everything(checkpoint_store) == before
    assert other.calls == []


async def test_a_fork_with_data_that_cannot_be_stored_raises_and_stores_nothing(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    message = "cannot store the value at data[1]: type object is not serializable"
    with pytest.raises(CheckpointSerializationError, match=re.escape(message)):
        await pipeline.clutch.fork(checkpoints[1].checkpoint_id, data=["x", object()])
    assert await stored_everything(checkpoint_store) == before
    assert pipeline.calls == []


async def test_a_fork_of_a_damaged_checkpoint_raises_corrupted_and_stores_nothing(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    checkpoint_id = checkpoints[1].checkpoint_id

    def flip(raw: bytes) -> bytes:
        assert b'"seq":2,' in raw
        return raw.replace(b'"seq":2,', b'"seq":1,')

    await tamper.damage_checkpoint(checkpoint_id, flip)
    before = await stored_everything(checkpoint_store)
    with pytest.raises(CheckpointCorruptedError, match=re.escape(checkpoint_id)):
        await pipeline.clutch.fork(checkpoint_id, run_id="fork")
    assert await stored_everything(checkpoint_store) == before
    assert pipeline.calls == []


async def test_a_fork_of_another_pipelines_damaged_checkpoint_names_the_pipeline(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    """The pipeline is checked before the checkpoint's state is read."""
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    checkpoint_id = checkpoints[1].checkpoint_id
    await tamper.damage_checkpoint(checkpoint_id, lambda raw: raw.replace(b'"seq":2,', b'"x":1,'))
    other = Pipeline(checkpoint_store, NAMES, name="other")
    message = f"checkpoint {checkpoint_id!r} belongs to pipeline 'pipeline', not 'other'"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await other.clutch.fork(checkpoint_id, run_id="fork")


async def test_a_fork_needs_checkpointing_and_a_consistent_pipeline(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    checkpoints = await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    plain = Clutch("plain")
    message = "Clutch 'plain' has no checkpointing: pass checkpoint=CheckpointConfig()"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await plain.fork(checkpoints[1].checkpoint_id)

    broken = Clutch("pipeline", order=["a", "ghost"], checkpoint=config(checkpoint_store))
    broken.agent()(pipeline.appender("a"))
    message = "order= names agent 'ghost', which is not registered on Clutch 'pipeline'"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await broken.fork(checkpoints[1].checkpoint_id, run_id="fork")
    assert await stored_everything(checkpoint_store) == before


async def test_a_fork_without_the_next_agent_raises_incompatible_and_stores_nothing(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    before = await stored_everything(checkpoint_store)
    shrunk = Pipeline(checkpoint_store, ("a", "b"))
    message = (
        f"run {checkpoints[1].run_id!r}: the checkpoint continues with agent 'c' (position 2 "
        "of the order), which this pipeline no longer has"
    )  # the run the checkpoint is of, not the fork that was not stored
    with pytest.raises(IncompatibleCheckpointError, match=f"^{re.escape(message)}$"):
        await shrunk.clutch.fork(checkpoints[1].checkpoint_id, run_id="fork")
    assert shrunk.calls == []
    assert await shrunk.clutch.list_interrupted() == []
    assert await stored_everything(checkpoint_store) == before


class Notes(BaseModel):
    notes: list[str]


def typed_clutch(store: CheckpointStorage, ran: list[str]) -> Clutch:
    """Two agents that take a Notes model; ``ran`` gets their names as they run."""
    clutch = Clutch("typed", strategy=Strategy.SEQUENTIAL, checkpoint=config(store))

    @clutch.agent()
    async def first(data: Notes) -> Notes:
        ran.append("first")
        return Notes(notes=[*data.notes, "first"])

    @clutch.agent()
    async def second(data: Notes) -> Notes:
        ran.append("second")
        return Notes(notes=[*data.notes, "second"])

    return clutch


async def test_a_fork_with_data_the_next_agents_model_refuses_raises_and_stores_nothing(
    checkpoint_store: CheckpointStorage,
) -> None:
    """As a resume of data that no longer fits: refused before the fork's run is stored."""
    ran: list[str] = []
    clutch = typed_clutch(checkpoint_store, ran)
    await clutch.run({"notes": []}, run_id="orig")
    [after_first] = [c for c in await clutch.list_checkpoints("orig") if c.seq == 1]
    before, ran_before = await stored_everything(checkpoint_store), list(ran)
    message = (
        f"fork of checkpoint {after_first.checkpoint_id!r} of run 'orig': the data given "
        "does not fit the model Notes of agent 'second' (notes: Input should be a valid "
        "list); nothing was stored: give data that fits it"
    )
    with pytest.raises(IncompatibleDataError, match=f"^{re.escape(message)}$") as refused:
        await clutch.fork(after_first.checkpoint_id, data={"notes": "x"}, run_id="f2")
    assert (refused.value.run_id, refused.value.agent, refused.value.fork_of) == (
        "orig",
        "second",
        after_first.checkpoint_id,
    )
    assert await stored_everything(checkpoint_store) == before
    assert ran == ran_before
    fitting = await clutch.fork(after_first.checkpoint_id, Notes(notes=["mine"]), run_id="f2")
    assert fitting == {"notes": ["mine", "second"]}


# ---------------------------------------------------------------------- history


async def test_history_lists_the_steps_and_the_checkpoints_with_their_parents(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    history = await pipeline.clutch.history("orig")

    assert history.run.run_id == "orig" and history.run.status == "completed"
    assert [(s.seq, s.agent, s.outcome, s.produced_data) for s in history.steps] == [
        (seq, name, "completed", True) for seq, name in enumerate(NAMES, start=1)
    ]
    starts = [s.started for s in history.steps]
    assert starts == sorted(starts) and all(s.tzinfo is not None for s in starts)
    assert all(s.duration >= 0 for s in history.steps)
    assert [c.info for c in history.checkpoints] == checkpoints
    ids = [c.checkpoint_id for c in checkpoints]
    assert [c.parent_id for c in history.checkpoints] == [None, *ids[:-1]]
    assert history.forks == []


async def test_history_shows_hand_overs_and_terminations(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch = Clutch("signals", checkpoint=config(checkpoint_store, keep_latest=None))

    @clutch.agent()
    async def triage(data: list[str]) -> list[str]:
        raise Handover("close")

    @clutch.agent()
    async def skipped(data: list[str]) -> list[str]:
        return [*data, "skipped"]

    @clutch.agent()
    async def close(data: list[str]) -> list[str]:
        raise Terminate([*data, "closed"])

    assert await clutch.run([], run_id="job") == ["closed"]
    history = await clutch.history("job")
    assert [(s.agent, s.outcome, s.produced_data) for s in history.steps] == [
        ("triage", "handover", False),
        ("close", "terminated", True),
    ]


async def test_history_draws_the_tree_of_a_run_and_its_forks(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    await pipeline.clutch.fork(checkpoints[1].checkpoint_id, data=["x"], run_id="child")
    await pipeline.clutch.fork(checkpoints[3].checkpoint_id, run_id="sibling")
    child_checkpoints = await pipeline.clutch.list_checkpoints("child")
    await pipeline.clutch.fork(child_checkpoints[-1].checkpoint_id, run_id="grand")

    orig = await pipeline.clutch.history("orig")
    child = await pipeline.clutch.history("child")
    sibling = await pipeline.clutch.history("sibling")
    grand = await pipeline.clutch.history("grand")
    assert sorted(f.run_id for f in orig.forks) == ["child", "sibling"]
    assert [f.run_id for f in child.forks] == ["grand"]
    assert sibling.forks == grand.forks == []

    assert child.checkpoints[0].info.reason == "fork"
    assert child.checkpoints[0].parent_id == checkpoints[1].checkpoint_id
    assert sibling.checkpoints[0].parent_id == checkpoints[3].checkpoint_id
    assert grand.checkpoints[0].parent_id == child_checkpoints[-1].checkpoint_id
    edges = tree_edges(orig, child, sibling, grand)
    roots = [c for c, parent in edges.items() if parent is None]
    assert roots == [checkpoints[0].checkpoint_id]
    assert all(parent in edges for parent in edges.values() if parent is not None)
    assert [s.agent for s in child.steps] == list(NAMES)


class _ListingsCounted(MemoryCheckpointStorage):
    """A memory store that counts the listings of runs made of it."""

    def __init__(self) -> None:
        super().__init__()
        self.listings = 0

    async def list_runs(self, **filters: Any) -> list[RunRecord]:
        self.listings += 1
        return await super().list_runs(**filters)


async def test_history_finds_forks_by_the_stores_index_without_listing_the_pipelines_runs() -> None:
    store = _ListingsCounted()
    pipeline = Pipeline(store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    await pipeline.clutch.fork(checkpoints[1].checkpoint_id, run_id="child")
    await pipeline.clutch.fork(checkpoints[2].checkpoint_id, run_id="sibling")
    store.listings = 0
    orig = await pipeline.clutch.history("orig")
    assert [f.run_id for f in orig.forks] == ["sibling", "child"]  # newest first
    assert store.listings == 0  # it listed every run of the pipeline, forks or not


async def test_history_of_a_failed_run_lists_the_steps_that_completed(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="orig")
    history = await pipeline.clutch.history("orig")
    assert history.run.status == "failed" and history.run.error is not None
    assert history.run.error["type"] == "Flaky"
    assert [s.agent for s in history.steps] == ["a", "b"]
    assert [c.info.seq for c in history.checkpoints] == [1, 2]


async def test_history_after_resuming_an_older_checkpoint_drops_what_came_after_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    assert await pipeline.clutch.resume(checkpoints[1].checkpoint_id) == list(NAMES)
    history = await pipeline.clutch.history("orig")
    assert [s.agent for s in history.steps] == list(NAMES)
    ids = [c.info.checkpoint_id for c in history.checkpoints]
    assert ids[:2] == [c.checkpoint_id for c in checkpoints[:2]]
    assert len(ids) == 4 and not set(ids[2:]) & {c.checkpoint_id for c in checkpoints}
    assert [c.parent_id for c in history.checkpoints] == [None, *ids[:-1]]


async def test_history_of_an_unknown_or_malformed_run_raises(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES)
    with pytest.raises(RunNotFoundError, match=re.escape("no run 'nope' in the store")):
        await pipeline.clutch.history("nope")
    message = (
        "run id '../x' contains '..' at index 0 "
        "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"
    )
    with pytest.raises(InvalidIdentifierError, match=re.escape(message)):
        await pipeline.clutch.history("../x")
    plain = Clutch("plain")
    with pytest.raises(ConfigurationError, match="has no checkpointing"):
        await plain.history("nope")


async def test_history_reads_what_another_process_stored(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    await pipeline.clutch.fork(checkpoints[0].checkpoint_id, run_id="fork")
    reader = Pipeline(await reopen_store(), NAMES)
    orig = await reader.clutch.history("orig")
    assert [f.run_id for f in orig.forks] == ["fork"]
    assert [c.info for c in orig.checkpoints] == checkpoints
    fork = await reader.clutch.history("fork")
    assert fork.checkpoints[0].parent_id == checkpoints[0].checkpoint_id


async def test_a_fork_whose_writing_stopped_before_its_first_commit_is_not_run_from_the_input(
    checkpoint_store: CheckpointStorage,
) -> None:
    # What a process killed between the fork's two writes leaves: the run, no steps, no
    # checkpoint. Starting it over from the input would run the parent's steps again.
    pipeline = Pipeline(checkpoint_store, NAMES, keep_latest=None)
    checkpoints = await finished(pipeline)
    parent = await checkpoint_store.get_run("orig")
    assert parent is not None
    torn = dataclasses.replace(
        parent,
        run_id="torn",
        status="running",
        owner=Owner(host=host_id(), pid=GONE_PID, started="gone"),  # as a fork stores it
        lease_until=None,
        result=None,
        step_seq=0,
        event_seq=0,
        parent_run="orig",
        parent_checkpoint=checkpoints[1].checkpoint_id,
    )
    await checkpoint_store.create_run(torn)
    before = await stored_everything(checkpoint_store)

    message = (
        f"run 'torn' is a fork of run 'orig' at checkpoint '{checkpoints[1].checkpoint_id}' "
        "and has no valid checkpoint to start from (its writing stopped before its first "
        "checkpoint was stored): delete_run('torn') and fork again"
    )
    with pytest.raises(CheckpointCorruptedError, match=re.escape(message)):
        await pipeline.clutch.resume_latest("torn")
    outcome = (await pipeline.clutch.recover())["torn"]
    assert isinstance(outcome, CheckpointCorruptedError)
    assert pipeline.calls == []
    assert await stored_everything(checkpoint_store) == before
