"""What an agent sees of its context, compared with eggai-clutch 0.2.2 in local mode.

eggai-clutch builds a new context per step (``ClutchContext.next`` appends the previous
source and data to the history and counts a turn); an agent reads ``data``, ``source``,
``state.turn``, ``state.history``, ``state.members``, ``state.strategy`` and
``metadata``. The same pipelines, run by eggai-clutch 0.2.2, gave the contexts in
``context_parity_eggai_clutch_0_2_2.json``; nestegg must give the same, in plain runs and
in runs that failed and were resumed from a checkpoint. ``seen`` is what each agent read
when it began; ``kept`` what the context it kept said once the run was over (its step's
data, source, turn and history, and the metadata its agent wrote).

The file is recorded by running this module with eggai-clutch 0.2.2 installed (``make
bench`` installs it into .venv-bench), from the repository's root::

    .venv-bench/bin/python -m tests.test_context_parity > recorded.json
    mv recorded.json tests/context_parity_eggai_clutch_0_2_2.json
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from nestegg.checkpoint.stores.base import CheckpointStorage
from tests.checkpoint import conftest as checkpointed
from tests.checkpoint.conftest import Flaky, config

store_kind = checkpointed.store_kind
store_root = checkpointed.store_root
reopen_store = checkpointed.reopen_store
checkpoint_store = checkpointed.checkpoint_store

RECORDED = Path(__file__).with_name("context_parity_eggai_clutch_0_2_2.json")
KINDS = ("plain", "handover", "handover_nodata", "terminate", "terminate_none")
STRATEGIES = ("sequential", "round_robin", "graph", "selector")


def seen(ctx: Any, tag: str) -> list[Any]:
    """What the agent (or selector) ``tag`` sees of its context ``ctx``."""
    state = ctx.state
    return copy.deepcopy(
        [tag, ctx.source, ctx.data, state.turn, list(state.history), list(state.members),
         state.strategy, dict(ctx.metadata)]
    )  # fmt: skip


def watch(lib: Any, log: list[Any], kept: list[tuple[str, Any]] | None, tag: str) -> None:
    """Log what the agent (or selector) ``tag`` sees now, and keep its context in ``kept``."""
    ctx = lib.get_context()
    log.append(seen(ctx, tag))
    if kept is not None:
        kept.append((tag, ctx))


def build(
    lib: Any,
    strategy: str,
    kind: str,
    log: list[Any],
    fail_at: int = 0,
    kept: list[tuple[str, Any]] | None = None,
    **options: Any,
) -> Any:
    """Three agents a, b, c run by ``strategy``; ``kind`` says what a and b signal.

    ``fail_at``: the agent call (1-based) that raises Flaky (0: none); ``kept``: gets
    each agent's (and the selector's) tag and context, for :func:`views` after the run.
    """
    look = functools.partial(watch, lib, log, kept)
    chosen = lib.Strategy(strategy)
    clutch = lib.Clutch("parity", strategy=chosen, max_turns=6, **options)
    graph = chosen is lib.Strategy.GRAPH

    def enter(tag: str) -> None:
        look(tag)
        if fail_at and sum(entry[0] != "select" for entry in log) == fail_at:
            log.pop()
            raise Flaky(f"{tag} failed on purpose")

    @clutch.agent(edges=["b"] if graph else None)
    async def a(data):  # no annotation: eggai-clutch fails on Any
        enter("a")
        metadata = lib.get_context().metadata
        metadata["a"] = metadata.get("a", 0) + 1
        if kind == "handover" and metadata["a"] == 1:
            raise lib.Handover("c", {"handed": 1})
        if kind == "handover_nodata" and metadata["a"] == 1:
            raise lib.Handover("c")
        return {"a": metadata["a"]}

    @clutch.agent(edges=["c"] if graph else None)
    async def b(data):  # no annotation: eggai-clutch fails on Any
        enter("b")
        if kind == "terminate":
            raise lib.Terminate({"terminated": 1})
        if kind == "terminate_none":
            raise lib.Terminate(None)
        return {"b": 1}

    @clutch.agent()
    async def c(data):  # no annotation: eggai-clutch fails on Any
        enter("c")
        return {"c": 1}

    if chosen is lib.Strategy.SELECTOR:

        @clutch.selector
        async def select(data):  # no annotation: eggai-clutch fails on Any
            look("select")
            return ["a", "b", "c", None][min(lib.get_context().state.turn, 3)]

    return clutch


def nestegg_lib() -> Any:
    import nestegg

    return nestegg


def eggai_lib() -> Any:
    from eggai_clutch import Clutch, Handover, Strategy, Terminate  # type: ignore[import-not-found]
    from eggai_clutch.message import _current_context  # type: ignore[import-not-found]

    return SimpleNamespace(
        Clutch=Clutch,
        Strategy=Strategy,
        Handover=Handover,
        Terminate=Terminate,
        get_context=_current_context.get,
    )


def views(kept: list[tuple[str, Any]]) -> list[Any]:
    """What the contexts ``kept`` say now."""
    return [seen(ctx, tag) for tag, ctx in kept]


async def record(lib: Any) -> dict[str, Any]:
    """Every scenario's result, the contexts its agents saw and what the contexts they kept
    said after the run, run by ``lib``."""
    recorded: dict[str, Any] = {}
    for strategy in STRATEGIES:
        for kind in KINDS:
            log: list[Any] = []
            kept: list[tuple[str, Any]] = []
            result = await build(lib, strategy, kind, log, kept=kept).run({"input": 0})
            recorded[f"{strategy}/{kind}"] = {"result": result, "seen": log, "kept": views(kept)}
    return recorded


def expected() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(RECORDED.read_text())
    return loaded


async def test_agents_see_the_contexts_eggai_clutch_gives_them() -> None:
    assert json.loads(json.dumps(await record(nestegg_lib()))) == expected()


async def test_at_the_second_agent_the_history_holds_only_the_input() -> None:
    log: list[Any] = []
    await build(nestegg_lib(), "sequential", "plain", log).run({"input": 0})
    assert log[1][0] == "b" and log[1][4] == [{"source": "input", "data": {"input": 0}}]


@pytest.mark.parametrize("scenario", [f"{s}/{k}" for s in STRATEGIES for k in KINDS])
async def test_a_resumed_run_restores_the_contexts_eggai_clutch_gives(
    checkpoint_store: CheckpointStorage, scenario: str
) -> None:
    strategy, kind = scenario.split("/")
    reference = expected()[scenario]
    agent_calls = [entry for entry in reference["seen"] if entry[0] != "select"]
    lib = nestegg_lib()
    for fail_at in range(1, len(agent_calls) + 1):
        run_id = f"fail-at-{fail_at}"
        failing = build(lib, strategy, kind, [], fail_at, checkpoint=config(checkpoint_store))
        with pytest.raises(Flaky):
            await failing.run({"input": 0}, run_id=run_id)
        log: list[Any] = []
        kept: list[tuple[str, Any]] = []
        resumed = build(lib, strategy, kind, log, kept=kept, checkpoint=config(checkpoint_store))
        assert await resumed.resume_latest(run_id) == reference["result"]
        # The resumed run starts at the failed call (or the selector's choice of it) and
        # sees from there on what the uninterrupted run saw.
        assert log[0] in (agent_calls[fail_at - 1], *reference["seen"])
        assert json.loads(json.dumps(log)) == reference["seen"][-len(log) :]
        assert json.loads(json.dumps(views(kept))) == reference["kept"][-len(kept) :]
        assert len([e for e in log if e[0] != "select"]) == len(agent_calls) - fail_at + 1


if __name__ == "__main__":
    lines = [
        f"{json.dumps(k)}: {json.dumps(v)}" for k, v in asyncio.run(record(eggai_lib())).items()
    ]
    print("{\n" + ",\n".join(lines) + "\n}")
    sys.exit(0)
