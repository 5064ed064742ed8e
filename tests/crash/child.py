"""The child program of the crash tests: runs (or resumes) one checkpointed pipeline.

Run as ``python child.py --store URL --strategy S --run-id R --steps N --log FILE``. The
pipeline is deterministic: every agent folds its name (and the answers of its calls) into
the data, so the final result depends only on the input and the strategy, never on where
the process was killed. Each agent execution first appends one line
``run_id/agent/turn/pid`` to the execution log (one ``os.write`` on an ``O_APPEND``
descriptor: the line is in the file before the agent does anything else), then makes
``--calls`` journaled calls to a fake LLM that logs each call it really makes to
``--calls-log`` (``run_id/agent/turn/position/pid``), then sleeps a small random time so
a SIGKILL can land mid-step. ``--durability`` chooses the policy's durability (``sync``
by default).

Modes (``--mode``):

- ``run``: ``run()`` the first time, ``resume_latest()`` once the run exists; prints the
  result as JSON (exits 4 with ``{"failed": ...}`` when ``--fail-turn`` fired).
- ``resume``: ``resume_latest()`` only, after an optional barrier (``--barrier DIR``: write
  ``ready-<pid>``, wait for ``go``); exits 3 with ``{"locked": ...}`` on RunLockedError.
- ``start-many``: starts ``--runs K`` runs ``<run-id>-<i>`` at once; prints their results.
- ``recover``: ``recover()``; prints ``{run_id: result}`` (exits 4 if a run raised).

The module is also imported by the tests, which build the same pipeline in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nestegg import Clutch, Strategy, call, get_context, handover
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy, open_store
from nestegg.checkpoint.config import DURABILITIES, Durability
from nestegg.checkpoint.stores import store_class
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import RunExistsError, RunLockedError

PIPELINE_NAME = "crash_pipeline"
STRATEGIES = ("sequential", "round_robin", "graph", "selector")
EXIT_LOCKED = 3
EXIT_RUN_FAILED = 4
BARRIER_POLL_S = 0.002
BARRIER_TIMEOUT_S = 30.0
MODULUS = 1_000_003
ANSWER_MODULUS = 997
CALL_SLEEP_MS = (0.5, 3.0)

Agent = Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


class StepFailure(RuntimeError):
    """The failure an agent raises once, after its third journaled call (``--fail-turn``)."""


def _append(fd: int | None, line: str) -> None:
    if fd is not None:
        os.write(fd, f"{line}\n".encode())


def _open_log(path: Path | None) -> int | None:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None


class Workload:
    """What every agent does: log its execution, make journaled calls, sleep, fold the data.

    Args:
        log: the execution log (None: count nothing).
        sleep_ms: the range of the agent's random sleep, in milliseconds.
        calls: how many journaled calls to the fake LLM each agent makes.
        calls_log: where the fake LLM logs each call it really makes (its side effect).
        fail_turn: the agent at this turn raises StepFailure after its third call, once:
            when ``fail_flag`` exists (it removes the flag first).
        fail_flag: the file that arms ``fail_turn``.
    """

    def __init__(
        self,
        log: Path | None = None,
        sleep_ms: tuple[float, float] = (0.0, 0.0),
        *,
        calls: int = 0,
        calls_log: Path | None = None,
        fail_turn: int | None = None,
        fail_flag: Path | None = None,
    ) -> None:
        self.log_fd = _open_log(log)
        self.calls_fd = _open_log(calls_log)
        self.sleep_ms = sleep_ms
        self.calls = calls
        self.fail_turn = fail_turn
        self.fail_flag = fail_flag

    async def work(self, agent: str, data: dict[str, Any]) -> dict[str, Any]:
        """One execution of ``agent`` on ``data``; returns the folded data."""
        ctx = get_context()
        turn = ctx.state.turn
        _append(self.log_fd, f"{ctx.run_id}/{agent}/{turn}/{os.getpid()}")
        answers = 0
        for position in range(self.calls):
            answers += await call(self.complete, agent, turn, position)
            if position == 2 and turn == self.fail_turn and self._disarm():
                raise StepFailure(f"{agent} failed after its third call")
        low, high = self.sleep_ms
        if high > 0:
            await asyncio.sleep(random.uniform(low, high) / 1000)
        return fold(data, agent, answers)

    async def complete(self, agent: str, turn: int, position: int) -> int:
        """The fake LLM: takes a moment, logs the call (its side effect), answers."""
        if self.sleep_ms[1] > 0:
            await asyncio.sleep(random.uniform(*CALL_SLEEP_MS) / 1000)
        _append(self.calls_fd, f"{get_context().run_id}/{agent}/{turn}/{position}/{os.getpid()}")
        return (sum(agent.encode()) * (turn + 1) + position) % ANSWER_MODULUS

    def _disarm(self) -> bool:
        if self.fail_flag is None or not self.fail_flag.exists():
            return False
        self.fail_flag.unlink()
        return True

    def close(self) -> None:
        """Close the log files."""
        for fd in (self.log_fd, self.calls_fd):
            if fd is not None:
                os.close(fd)
        self.log_fd = self.calls_fd = None


def initial_input(seed: int = 0) -> dict[str, Any]:
    """The input of run number ``seed``."""
    return {"seed": seed, "count": 0, "total": seed, "trail": []}


def fold(data: dict[str, Any], agent: str, answers: int = 0) -> dict[str, Any]:
    """The data after ``agent`` worked on it: deterministic in the data, the name and the
    answers of its calls."""
    count = data["count"] + 1
    total = (data["total"] * 31 + sum(agent.encode()) * count + answers) % MODULUS
    return {**data, "count": count, "total": total, "trail": [*data["trail"], agent]}


def _folding_agent(name: str, work: Workload) -> Agent:
    async def agent(data: dict[str, Any]) -> dict[str, Any]:
        return await work.work(name, data)

    agent.__name__ = agent.__qualname__ = name
    return agent


def _sequential(clutch: Clutch, steps: int, work: Workload) -> None:
    for index in range(steps):
        clutch.agent()(_folding_agent(f"s{index:03d}", work))


def _round_robin(clutch: Clutch, steps: int, work: Workload) -> None:
    for name in ("alpha", "beta", "gamma"):
        clutch.agent()(_folding_agent(name, work))


def _graph(clutch: Clutch, steps: int, work: Workload) -> None:
    """fetch -> enrich -> review, and review hands back to enrich until enough steps."""
    clutch.agent(["enrich"])(_folding_agent("fetch", work))
    clutch.agent(["review"])(_folding_agent("enrich", work))

    async def review(data: dict[str, Any]) -> dict[str, Any]:
        folded = await work.work("review", data)
        if folded["count"] < steps:
            handover("enrich", folded)
        return folded

    clutch.agent()(review)


def _selector(clutch: Clutch, steps: int, work: Workload) -> None:
    """The selector routes by the data; ``right`` sometimes hands over to ``left``."""
    clutch.agent()(_folding_agent("left", work))
    clutch.agent()(_folding_agent("middle", work))

    async def right(data: dict[str, Any]) -> dict[str, Any]:
        folded = await work.work("right", data)
        if folded["count"] % 4 == 0 and folded["count"] < steps:
            handover("left", folded)
        return folded

    clutch.agent()(right)

    @clutch.selector
    async def route(data: dict[str, Any]) -> str | None:
        if data["count"] >= steps:
            return None
        return ("left", "middle", "right")[data["total"] % 3]


_BUILDERS = {
    "sequential": (Strategy.SEQUENTIAL, _sequential),
    "round_robin": (Strategy.ROUND_ROBIN, _round_robin),
    "graph": (Strategy.GRAPH, _graph),
    "selector": (Strategy.SELECTOR, _selector),
}


def build_pipeline(
    strategy: str,
    steps: int,
    work: Workload,
    checkpoint: CheckpointConfig | None,
) -> Clutch:
    """The crash-test pipeline of ``strategy``, about ``steps`` steps long.

    Args:
        strategy: one of STRATEGIES.
        steps: how many steps an uninterrupted run takes (about, for SELECTOR/GRAPH: the
            run stops once the data counts this many).
        work: what every agent does.
        checkpoint: the checkpoint configuration, or None for a plain run.
    """
    kind, build = _BUILDERS[strategy]
    max_turns = steps if kind is Strategy.ROUND_ROBIN else steps + 10
    clutch = Clutch(PIPELINE_NAME, strategy=kind, max_turns=max_turns, checkpoint=checkpoint)
    build(clutch, steps, work)
    return clutch


def open_test_store(url: str, prefix: str | None = None) -> CheckpointStorage:
    """The store at ``url``; a server store under its own table or key ``prefix``."""
    if prefix is None:
        return open_store(url)
    scheme = urlsplit(url).scheme
    cls = store_class(scheme)
    if scheme.startswith("redis"):
        store: CheckpointStorage = cls(url, prefix=prefix)
    else:
        store = cls(url, table_prefix=prefix)
    return store


def checkpoint_config(
    store: CheckpointStorage, run_id: str | None = None, durability: Durability = "sync"
) -> CheckpointConfig:
    """Checkpoint after every step, committed by ``durability`` (by default before the next
    step starts)."""
    policy = CheckpointPolicy(every_n_steps=1, durability=durability)
    return CheckpointConfig(storage=store, policy=policy, run_id=run_id)


async def _wait_barrier(barrier: Path) -> None:
    (barrier / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + BARRIER_TIMEOUT_S
    while not (barrier / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go file in {barrier}")
        await asyncio.sleep(BARRIER_POLL_S)


async def _run_or_resume(clutch: Clutch, args: argparse.Namespace) -> tuple[Any, int]:
    try:
        try:
            result = await clutch.run(initial_input(), timeout=None, run_id=args.run_id)
        except RunExistsError:
            result = await clutch.resume_latest(args.run_id)
    except StepFailure as failure:
        return {"failed": str(failure)}, EXIT_RUN_FAILED
    return result, 0


async def _resume(clutch: Clutch, args: argparse.Namespace) -> tuple[Any, int]:
    if args.barrier:
        await _wait_barrier(Path(args.barrier))
    try:
        return await clutch.resume_latest(args.run_id), 0
    except RunLockedError as error:
        return {"locked": str(error)}, EXIT_LOCKED


async def _start_many(clutch: Clutch, args: argparse.Namespace) -> tuple[Any, int]:
    run_ids = [f"{args.run_id}-{index}" for index in range(args.runs)]
    results = await asyncio.gather(
        *(
            clutch.run(initial_input(index), timeout=None, run_id=run_id)
            for index, run_id in enumerate(run_ids)
        )
    )
    return dict(zip(run_ids, results, strict=True)), 0


async def _recover(clutch: Clutch, args: argparse.Namespace) -> tuple[Any, int]:
    outcomes = await clutch.recover()
    failed = {k: repr(v) for k, v in outcomes.items() if isinstance(v, BaseException)}
    if failed:
        return {"failed": failed}, EXIT_RUN_FAILED
    return outcomes, 0


_MODES = {
    "run": _run_or_resume,
    "resume": _resume,
    "start-many": _start_many,
    "recover": _recover,
}


async def main(args: argparse.Namespace) -> int:
    """Run the chosen mode, print its outcome as JSON and return the exit code."""
    work = Workload(
        Path(args.log),
        (args.min_sleep_ms, args.max_sleep_ms),
        calls=args.calls,
        calls_log=Path(args.calls_log) if args.calls_log else None,
        fail_turn=args.fail_turn,
        fail_flag=Path(args.fail_flag) if args.fail_flag else None,
    )
    store = open_test_store(args.store, args.prefix)
    config = checkpoint_config(store, args.run_id, args.durability)
    clutch = build_pipeline(args.strategy, args.steps, work, config)
    try:
        outcome, code = await _MODES[args.mode](clutch, args)
    finally:
        await store.close()
        work.close()
    sys.stdout.write(json.dumps(outcome, sort_keys=True) + "\n")
    sys.stdout.flush()
    return code


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the child."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="store URL")
    parser.add_argument("--prefix", default=None, help="table / key prefix of a server store")
    parser.add_argument("--strategy", required=True, choices=STRATEGIES)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--log", required=True, help="execution log file")
    parser.add_argument("--mode", default="run", choices=sorted(_MODES))
    parser.add_argument("--durability", default="sync", choices=DURABILITIES)
    parser.add_argument("--runs", type=int, default=1, help="runs of start-many")
    parser.add_argument("--barrier", default=None, help="directory of the resume barrier")
    parser.add_argument("--min-sleep-ms", type=float, default=1.0)
    parser.add_argument("--max-sleep-ms", type=float, default=20.0)
    parser.add_argument("--calls", type=int, default=0, help="journaled calls per agent")
    parser.add_argument("--calls-log", default=None, help="where the fake LLM logs its calls")
    parser.add_argument("--fail-turn", type=int, default=None, help="turn whose agent fails")
    parser.add_argument("--fail-flag", default=None, help="file that arms --fail-turn once")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
