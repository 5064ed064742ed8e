"""Small LangGraph graphs the saver tests run (also imported by the crash child)."""

from __future__ import annotations

import operator
import time
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import interrupt


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    approved: bool


def build_chat(checkpointer: Any) -> Any:
    """draft -> review (interrupts for a human answer) -> inner subgraph -> end."""

    def draft(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"draft {len(state['messages'])}")]}

    def review(state: ChatState) -> dict[str, Any]:
        answer = interrupt({"question": "approve?"})
        return {"approved": answer == "yes", "messages": [HumanMessage(content=str(answer))]}

    def polish(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="polished")]}

    inner = StateGraph(ChatState)
    inner.add_node("polish", polish)
    inner.add_edge(START, "polish")
    inner.add_edge("polish", END)

    graph = StateGraph(ChatState)
    graph.add_node("draft", draft)
    graph.add_node("review", review)
    graph.add_node("inner", inner.compile())
    graph.add_edge(START, "draft")
    graph.add_edge("draft", "review")
    graph.add_edge("review", "inner")
    graph.add_edge("inner", END)
    return graph.compile(checkpointer=checkpointer)


class LoopState(TypedDict):
    items: Annotated[list[str], operator.add]
    turn: int


def build_loop(checkpointer: Any, steps: int, size: int = 100, pause: float = 0.0) -> Any:
    """One node appending a ``size``-character item per step, ``steps`` times."""

    def step(state: LoopState) -> dict[str, Any]:
        if pause:
            time.sleep(pause)
        turn = state["turn"] + 1
        return {"items": [f"{turn:06d}:" + "x" * size], "turn": turn}

    def route(state: LoopState) -> str:
        return END if state["turn"] >= steps else "step"

    graph = StateGraph(LoopState)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route)
    return graph.compile(checkpointer=checkpointer)


def loop_config(thread_id: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": steps + 10}
