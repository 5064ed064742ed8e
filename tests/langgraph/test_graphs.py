"""LangGraph's own usage through real graphs on NestEggSaver: add_messages, interrupts and
Command(resume=...), history, update_state and forks, subgraphs, invoke and ainvoke."""

from __future__ import annotations

import operator
import re
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command

from nestegg.errors import CheckpointSerializationError
from tests.langgraph.conftest import SaverFactory, kinds
from tests.langgraph.graphs import build_chat, build_loop, loop_config

GRAPH_KINDS = kinds("memory", "file", "sqlite", "postgres", "redis")


def _contents(state: dict) -> list[str]:
    return [m.content for m in state["messages"]]


@pytest.mark.parametrize("saver_factory", GRAPH_KINDS, indirect=True)
def test_interrupt_resume_history_and_fork_with_invoke(saver_factory: SaverFactory) -> None:
    saver = saver_factory()
    app = build_chat(saver)
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}

    first = app.invoke({"messages": [("user", "hello")], "approved": False}, config)
    assert "__interrupt__" in first
    assert app.get_state(config).next == ("review",)

    done = app.invoke(Command(resume="yes"), config)
    assert done["approved"] is True
    assert _contents(done) == ["hello", "draft 1", "yes", "polished"]

    history = list(app.get_state_history(config))
    assert history[0].values == done and history[-1].values.get("messages", []) == []
    steps = [h.metadata["step"] for h in history]
    assert steps == sorted(steps, reverse=True)

    # Fork from the checkpoint before the review: a different answer this time.
    before_review = next(h for h in history if h.next == ("review",))
    assert _contents(before_review.values) == ["hello", "draft 1"]
    forked = app.update_state(before_review.config, {"messages": [("user", "also this")]})
    again = app.invoke(None, forked)
    assert "__interrupt__" in again
    fork_done = app.invoke(Command(resume="no"), config)
    assert fork_done["approved"] is False
    assert _contents(fork_done) == ["hello", "draft 1", "also this", "no", "polished"]
    # The first branch is still there, unchanged.
    assert app.get_state(history[0].config).values == done


@pytest.mark.parametrize("saver_factory", GRAPH_KINDS, indirect=True)
async def test_interrupt_and_resume_with_ainvoke_and_subgraph_state(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    app = build_chat(saver)
    config = {"configurable": {"thread_id": str(uuid.uuid4())}}
    await app.ainvoke({"messages": [("user", "hi")], "approved": False}, config)
    state = await app.aget_state(config)
    assert state.next == ("review",) and state.interrupts[0].value == {"question": "approve?"}
    done = await app.ainvoke(Command(resume="yes"), config)
    assert _contents(done) == ["hi", "draft 1", "yes", "polished"]
    # The subgraph checkpointed into a namespace of its own in the same thread.
    namespaces = {t.config["configurable"]["checkpoint_ns"] async for t in saver.alist(config)}
    assert "" in namespaces and any(ns.startswith("inner:") for ns in namespaces)
    history = [h async for h in app.aget_state_history(config)]
    assert len(history) >= 5


@pytest.mark.parametrize("saver_factory", GRAPH_KINDS, indirect=True)
def test_a_growing_list_is_rebuilt_at_every_checkpoint(saver_factory: SaverFactory) -> None:
    saver = saver_factory(pack_every=8)
    steps = 30
    app = build_loop(saver, steps)
    config = loop_config(str(uuid.uuid4()), steps)
    result = app.invoke({"items": [], "turn": 0}, config, durability="sync")
    assert len(result["items"]) == steps
    for snapshot in app.get_state_history(config):
        turn = snapshot.values.get("turn", 0)
        assert snapshot.values.get("items", []) == result["items"][:turn]
    # A fresh saver (nothing remembered) reads the same values back.
    other = type(saver)(saver.storage)
    assert other.get_tuple(config).checkpoint["channel_values"]["items"] == result["items"]
    # ... and continues the thread as deltas on what it read.
    thread_id = config["configurable"]["thread_id"]
    more = build_loop(other, steps + 5).invoke({"items": []}, loop_config(thread_id, steps + 5))
    assert more["items"][:steps] == result["items"] and len(more["items"]) == steps + 5
    other.close()


@pytest.mark.parametrize("saver_factory", GRAPH_KINDS, indirect=True)
async def test_a_thread_id_that_is_not_text_names_the_thread_its_graph_wrote(
    saver_factory: SaverFactory,
) -> None:
    # A graph stores str(thread_id); the saver's own methods, given the same UUID or
    # number, reach that thread, as LangGraph's savers do.
    saver = saver_factory()
    for thread_id in (uuid.uuid4(), 7):
        app = build_loop(saver, 2)
        config = loop_config(thread_id, 2)  # type: ignore[arg-type]
        app.invoke({"items": [], "turn": 0}, config)
        assert saver.get_tuple(config) is not None
        assert len(list(saver.list(config))) == 4
        assert await saver.aget_tuple(config) is not None
        saver.copy_thread(thread_id, f"{thread_id}-copy")
        assert len(list(saver.list({"configurable": {"thread_id": f"{thread_id}-copy"}}))) == 4
        saver.prune([thread_id])
        assert len(list(saver.list(config))) == 1
        saver.delete_thread(thread_id)
        assert saver.get_tuple({"configurable": {"thread_id": str(thread_id)}}) is None


class _Unstorable:
    """A value LangGraph's serializer cannot take."""


class _ListState(TypedDict):
    items: Annotated[list[Any], operator.add]


@pytest.mark.parametrize("saver_factory", GRAPH_KINDS, indirect=True)
def test_a_value_the_serializer_cannot_take_is_named_and_not_stored(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    graph = StateGraph(_ListState)
    graph.add_node("fetch", lambda state: {"items": ["ok", {"doc": _Unstorable()}]})
    graph.add_edge(START, "fetch")
    graph.add_edge("fetch", END)
    app = graph.compile(checkpointer=saver)

    # a node's write: the channel and the path in its value, the type (a TypeError, as
    # LangGraph's own savers raise)
    config = {"configurable": {"thread_id": "node"}}
    message = "channel 'items'[1]['doc']: type _Unstorable is not serializable"
    with pytest.raises(CheckpointSerializationError, match=re.escape(message)) as raised:
        app.invoke({"items": []}, config, durability="sync")
    assert isinstance(raised.value, TypeError)
    state = app.get_state(config)  # the checkpoint before the node, nothing of its write
    assert state.values == {"items": []} and state.next == ("fetch",)
    assert state.tasks[0].result is None

    # the graph's input, in a checkpoint's channel value
    config = {"configurable": {"thread_id": "input"}}
    message = "channel '__start__'['items'][0]: type _Unstorable is not serializable"
    with pytest.raises(CheckpointSerializationError, match=re.escape(message)):
        app.invoke({"items": [_Unstorable()]}, config, durability="sync")
    assert saver.get_tuple(config) is None
