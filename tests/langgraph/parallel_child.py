"""A process running a graph ``a -> (p1 || p2) -> c`` (durability "sync"), where p1 ends
at once (logging each call) and p2 runs long; the crash test SIGKILLs it while p2 runs.

    python parallel_child.py SAVER LOCATION LOG run|state|resume

SAVER is a nestegg store kind (sqlite, postgres, redis) or ``langgraph`` (LangGraph's
SqliteSaver on the file LOCATION). ``run`` starts the thread (p2 sleeps a minute),
``state`` prints what the thread's newest checkpoint holds as JSON, ``resume`` runs it on
(p2 then ends at once).
"""

from __future__ import annotations

import json
import operator
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.langgraph.crash_child import open_store  # noqa: E402

CONFIG: Any = {"configurable": {"thread_id": "parallel"}}


class State(TypedDict):
    log: Annotated[list[str], operator.add]


@contextmanager
def saver_of(kind: str, location: str) -> Iterator[Any]:
    if kind == "langgraph":
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(location, check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
        return
    from nestegg.langgraph import NestEggSaver

    with NestEggSaver(open_store(kind, location), close_storage=True) as saver:
        yield saver


def build(checkpointer: Any, log: str, p2_seconds: float) -> Any:
    from langgraph.graph import END, START, StateGraph

    def a(state: State) -> dict[str, Any]:
        return {"log": ["a"]}

    def p1(state: State) -> dict[str, Any]:
        with open(log, "a") as f:
            f.write("p1\n")
        return {"log": ["p1"]}

    def p2(state: State) -> dict[str, Any]:
        time.sleep(p2_seconds)
        return {"log": ["p2"]}

    def c(state: State) -> dict[str, Any]:
        return {"log": ["c"]}

    graph = StateGraph(State)
    for node in (a, p1, p2, c):
        graph.add_node(node.__name__, node)
    graph.add_edge(START, "a")
    graph.add_edge("a", "p1")
    graph.add_edge("a", "p2")
    graph.add_edge(["p1", "p2"], "c")
    graph.add_edge("c", END)
    return graph.compile(checkpointer=checkpointer)


def state(app: Any, saver: Any) -> dict[str, Any]:
    """The thread's next nodes and pending writes, each named by its task's node."""
    snapshot = app.get_state(CONFIG)
    names = {task.id: task.name for task in snapshot.tasks}
    stored = saver.get_tuple(CONFIG)
    writes = [
        [names.get(task_id, task_id), ch, value] for task_id, ch, value in stored.pending_writes
    ]
    return {"next": list(snapshot.next), "pending_writes": writes}


def main() -> None:
    kind, location, log, mode = sys.argv[1:5]
    with saver_of(kind, location) as saver:
        app = build(saver, log, 60.0 if mode == "run" else 0.0)
        if mode == "run":
            app.invoke({"log": []}, CONFIG, durability="sync")
        elif mode == "state":
            print(json.dumps(state(app, saver)), flush=True)
        else:
            print(json.dumps(app.invoke(None, CONFIG, durability="sync")), flush=True)


if __name__ == "__main__":
    main()
