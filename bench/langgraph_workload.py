"""The checkpoint workload built as a LangGraph graph, for the anchors of the store benchmarks.

One node appends a ~1 KB message to a ``messages`` list (``operator.add`` reducer) and
loops back through a conditional edge until it has run ``steps`` times; the graph is
compiled with a checkpointer and invoked with ``durability="sync"`` (each checkpoint is
written before the next step starts).
"""

from __future__ import annotations

import operator
from typing import Annotated, Any, TypedDict

from harness import message
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import END, START, StateGraph

RECURSION_MARGIN = 10


class LoopState(TypedDict):
    messages: Annotated[list[dict[str, Any]], operator.add]
    turn: int


def build_loop(checkpointer: BaseCheckpointSaver[Any], steps: int) -> Any:
    """A compiled graph whose one node runs ``steps`` times."""

    def step(state: LoopState) -> dict[str, Any]:
        turn = state["turn"] + 1
        return {"messages": [message(turn)], "turn": turn}

    def route(state: LoopState) -> str:
        return END if state["turn"] >= steps else "step"

    graph = StateGraph(LoopState)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route)
    return graph.compile(checkpointer=checkpointer)


def loop_config(thread_id: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": steps + RECURSION_MARGIN}


def run_loop(app: Any, thread_id: str, steps: int) -> dict[str, Any]:
    """Invoke synchronously with durable checkpoints; checks that every step ran."""
    result: dict[str, Any] = app.invoke(
        {"messages": [], "turn": 0}, loop_config(thread_id, steps), durability="sync"
    )
    if result["turn"] != steps or len(result["messages"]) != steps:
        raise AssertionError(f"LangGraph ran {result['turn']} steps, not {steps}")
    return result


async def arun_loop(app: Any, thread_id: str, steps: int) -> dict[str, Any]:
    """Invoke asynchronously (async savers) with durable checkpoints."""
    result: dict[str, Any] = await app.ainvoke(
        {"messages": [], "turn": 0}, loop_config(thread_id, steps), durability="sync"
    )
    if result["turn"] != steps or len(result["messages"]) != steps:
        raise AssertionError(f"LangGraph ran {result['turn']} steps, not {steps}")
    return result
