"""A process running the loop graph on NestEggSaver, logging each node execution; the
crash test SIGKILLs it mid-graph and starts it again.

    python crash_child.py KIND LOCATION THREAD_ID STEPS LOG
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.langgraph.graphs import LoopState, loop_config  # noqa: E402


def open_store(kind: str, location: str) -> Any:
    if kind == "sqlite":
        from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

        return SQLiteCheckpointStorage(location)
    url, prefix = location.split("|")
    if kind == "postgres":
        from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

        return PostgresCheckpointStorage(url, table_prefix=prefix)
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    return RedisCheckpointStorage(url, prefix=prefix)


def main() -> None:
    import time

    from langgraph.graph import END, START, StateGraph

    from nestegg.langgraph import NestEggSaver

    kind, location, thread_id, steps_text, log = sys.argv[1:6]
    steps = int(steps_text)

    def step(state: LoopState) -> dict[str, Any]:
        turn = state["turn"] + 1
        with open(log, "a") as f:
            f.write(f"{turn}\n")
        time.sleep(0.01)
        return {"items": [f"item-{turn}"], "turn": turn}

    def route(state: LoopState) -> str:
        return END if state["turn"] >= steps else "step"

    graph = StateGraph(LoopState)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", route)
    with NestEggSaver(open_store(kind, location), close_storage=True) as saver:
        app = graph.compile(checkpointer=saver)
        config = loop_config(thread_id, steps)
        started = app.get_state(config).values
        result = app.invoke(None if started else {"items": [], "turn": 0}, config)
        print(result["turn"], len(result["items"]), flush=True)


if __name__ == "__main__":
    main()
