"""What `nestegg show` and `nestegg events` tell while a step runs, after a crash and a
takeover, and of a failed step: each command runs as a process of its own, on every store.

The pipelines run in the test's own process (a step waits on an asyncio.Event, so the
commands see it in flight) or in a child killed with SIGKILL mid-step.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.formats import parse_journal
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import HOME_ENV, STORE_ENV
from nestegg.errors import RunWaiting
from tests.cli.conftest import delete_runs
from tests.cli.pipeline_app import FAIL_ENV, KILL_ENV, POLICY, build

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60
CHILD = """
import asyncio, sys
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from tests.cli.pipeline_app import POLICY, build

clutch = build("cli-test", CheckpointConfig(storage=open_store(sys.argv[1]), policy=POLICY))
asyncio.run(clutch.run({"name": "Killed"}, run_id=sys.argv[2], timeout=30))
"""


async def nestegg_cli(tmp_path: Path, *args: str) -> str:
    """The stdout of ``python -m nestegg.cli ARGS`` (run without blocking the loop)."""
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, FAIL_ENV, KILL_ENV)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nestegg.cli", *args,
        cwd=ROOT, env={**env, HOME_ENV: str(tmp_path / "home")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def shown(tmp_path: Path, url: str, run_id: str) -> dict[str, Any]:
    details: dict[str, Any] = orjson.loads(
        await nestegg_cli(tmp_path, "show", run_id, "--json", "--store", url)
    )
    return details


async def events(tmp_path: Path, url: str, run_id: str) -> list[dict[str, Any]]:
    lines = await nestegg_cli(tmp_path, "events", run_id, "--json", "--store", url)
    return [orjson.loads(line) for line in lines.splitlines()]


def timeline_row(text: str, seq: int) -> str:
    """The timeline row of step ``seq`` in the text of `nestegg show`."""
    rows = [line for line in text.splitlines() if line.split()[:1] == [str(seq)]]
    assert rows, text
    return rows[-1]


async def _follow_events(
    tmp_path: Path, url: str, run_id: str, interval: float = 0.05
) -> asyncio.subprocess.Process:
    """``nestegg events RUN --follow --json`` started in the background."""
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, FAIL_ENV, KILL_ENV)}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "nestegg.cli", "events", run_id, "--follow", "--json",
        "--poll-interval", str(interval), "--store", url,
        cwd=ROOT, env={**env, HOME_ENV: str(tmp_path / "home")},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


async def _next_line_of_kind(process: asyncio.subprocess.Process, kind: str) -> dict[str, Any]:
    """The first JSON line of ``kind`` the process prints (within the test's timeout)."""
    assert process.stdout is not None
    while True:
        line = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
        assert line, "the command ended first"
        row: dict[str, Any] = orjson.loads(line)
        if row["kind"] == kind:
            return row


async def _lines_through_first_call(process: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    """The JSON lines the process prints, up to and with its first ``call_journaled``."""
    assert process.stdout is not None
    rows: list[dict[str, Any]] = []
    while not rows or rows[-1]["kind"] != "call_journaled":
        line = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
        assert line, "the command ended first"
        rows.append(orjson.loads(line))
    return rows


async def _lines_to_the_end(process: asyncio.subprocess.Process) -> list[dict[str, Any]]:
    """The JSON lines the process prints until it ends (with status 0)."""
    rest, err = await asyncio.wait_for(process.communicate(), TIMEOUT)
    assert process.returncode == 0, err.decode()
    return [orjson.loads(line) for line in rest.decode().splitlines()]


def _calls(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(step, position) of the ``call_journaled`` rows, in the order printed."""
    calls = [row["data"] for row in rows if row["kind"] == "call_journaled"]
    return [(call["seq"], call["position"]) for call in calls]


def _where(rows: list[dict[str, Any]], kind: str, step: int | None = None) -> int:
    """The index of the first row of ``kind`` (of step ``step`` when given)."""
    return next(
        i for i, r in enumerate(rows)
        if r["kind"] == kind and (step is None or r["data"].get("seq") == step)
    )  # fmt: skip


@pytest.fixture
async def run_id(any_url: str) -> AsyncIterator[str]:
    chosen = f"live-{uuid.uuid4().hex[:8]}"
    yield chosen
    await delete_runs(any_url, (chosen,))


def live_clutch(store: CheckpointStorage) -> Clutch:
    """The sequential pipeline ``live`` on ``store``, its agents added by the test."""
    return Clutch(
        "live",
        strategy=Strategy.SEQUENTIAL,
        checkpoint=CheckpointConfig(storage=store, policy=POLICY),
    )


async def ask(topic: str) -> str:
    """Stands in for a paid call."""
    return f"about {topic}"


async def test_show_and_events_reveal_the_step_in_flight_and_its_journaled_calls(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    thinking, working = asyncio.Event(), asyncio.Event()
    store = open_store(any_url)
    clutch = live_clutch(store)

    @clutch.agent()
    async def think(data: dict) -> dict:
        await thinking.wait()  # no journaled call: the start is written on its own
        return data

    @clutch.agent()
    async def work(data: dict) -> dict:
        answer = await nestegg.call(ask, "eggs")
        await working.wait()
        return {**data, "answer": answer}

    try:
        run = asyncio.create_task(clutch.run({"n": 1}, run_id=run_id))
        await asyncio.sleep(0.3)
        first = (await shown(tmp_path, any_url, run_id))["step_in_flight"]
        assert (first["seq"], first["agent"], first["calls"]) == (1, "think", [])
        assert first["started"] is not None
        text = await nestegg_cli(tmp_path, "show", run_id, "--store", any_url)
        assert "think" in timeline_row(text, 1) and "running" in timeline_row(text, 1)
        thinking.set()
        await asyncio.sleep(0.3)

        second = (await shown(tmp_path, any_url, run_id))["step_in_flight"]
        assert (second["seq"], second["agent"]) == (2, "work")
        took = second["calls"][0]["duration"]
        assert isinstance(took, float) and 0 <= took < TIMEOUT  # how long the call took
        assert second["calls"] == [
            {"position": 0, "function": f"{__name__}.ask", "outcome": "returned", "duration": took}
        ]
        text = await nestegg_cli(tmp_path, "show", run_id, "--store", any_url)
        assert "running, 1 call journaled" in timeline_row(text, 2)
        logged = [(e["kind"], e["data"]) for e in await events(tmp_path, any_url, run_id)]
        assert logged[-1] == ("step_started", {"seq": 2, "agent": "work"})
        follower = await _follow_events(tmp_path, any_url, run_id)
        call = await _next_line_of_kind(follower, "call_journaled")
        assert call["seq"] is None
        assert call["data"] == {
            "seq": 2, "position": 0, "function": f"{__name__}.ask", "outcome": "returned",
            "duration": took,
        }  # fmt: skip
        working.set()
        assert (await run)["answer"] == "about eggs"
        rest, _ = await asyncio.wait_for(follower.communicate(), TIMEOUT)
        assert follower.returncode == 0  # --follow ends with the run
        followed = [orjson.loads(line)["kind"] for line in rest.decode().splitlines()]
        assert followed[-1] == "run_completed" and "call_journaled" not in followed
    finally:
        thinking.set()
        working.set()
        await store.close()
    done = await shown(tmp_path, any_url, run_id)
    assert done["step_in_flight"] is None and len(done["steps"]) == 2
    kinds = [e["kind"] for e in await events(tmp_path, any_url, run_id)]
    assert kinds.count("step_started") == 2  # each start written once


CALL_SECONDS = 0.2
FOLLOW_INTERVAL = 1.0
"""Longer than the calls made after the follower's first poll take together (and the
step after them): they are journaled, and their steps end, between two of its polls."""


async def slow_ask(topic: str) -> str:
    """Stands in for a paid call that takes a while."""
    await asyncio.sleep(CALL_SECONDS)
    return f"about {topic}"


async def test_follow_prints_each_journaled_call_once_before_its_step_ends_at_its_return(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    asked, followed = asyncio.Event(), asyncio.Event()
    store = open_store(any_url)
    clutch = live_clutch(store)
    durable_ask = nestegg.durable(slow_ask)

    @clutch.agent()
    async def research(data: dict) -> dict:
        answers = [await nestegg.call(ask, "eggs")]
        asked.set()
        await followed.wait()  # the follower printed that call: the rest come between polls
        answers += [await durable_ask(topic) for topic in ("hens", "nests", "yolks")]
        return {**data, "answers": answers}

    @clutch.agent()
    async def summarize(data: dict) -> dict:
        return {**data, "summary": await nestegg.call(ask, "all")}  # starts and ends unseen

    follower = None
    try:
        run = asyncio.create_task(clutch.run({"n": 1}, run_id=run_id))
        await asyncio.wait_for(asked.wait(), TIMEOUT)
        follower = await _follow_events(tmp_path, any_url, run_id, FOLLOW_INTERVAL)
        rows = await _lines_through_first_call(follower)
        followed.set()
        assert (await run)["summary"] == "about all"
        rows += await _lines_to_the_end(follower)
        journal = {
            (seq, record.position): parse_journal(record.body, "a journal entry")
            for seq in (1, 2)
            for record in await store.read_journal(run_id, seq)
        }
    finally:
        asked.set()
        followed.set()
        if follower is not None and follower.returncode is None:
            follower.kill()
            await follower.wait()
        await store.close()
    assert _calls(rows) == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0)]  # each once, in order
    calls = [row for row in rows if row["kind"] == "call_journaled"]
    for row in calls:
        step = row["data"]["seq"]
        assert _where(rows, "step_started", step) < rows.index(row)
        assert rows.index(row) < _where(rows, "step_completed", step)
        entry = journal[(step, row["data"]["position"])]  # its own time: when it returned
        returned = datetime.fromtimestamp(entry["started"] + entry["duration"], UTC)
        assert datetime.fromisoformat(row["at"]) == returned
    slow = [datetime.fromisoformat(row["at"]) for row in calls[1:4]]
    assert all(later - earlier >= timedelta(seconds=CALL_SECONDS / 2)
               for earlier, later in itertools.pairwise(slow))  # fmt: skip
    assert rows[-1]["kind"] == "run_completed"


async def test_follow_prints_the_calls_of_a_step_that_waits_before_the_wait(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    asked, followed = asyncio.Event(), asyncio.Event()
    store = open_store(any_url)
    clutch = live_clutch(store)

    @clutch.agent()
    async def approve(data: dict) -> dict:
        await nestegg.call(ask, "eggs")
        asked.set()
        await followed.wait()
        await nestegg.call(ask, "hens")  # then the run waits before the follower's next poll
        return {**data, "approved": await nestegg.wait_for("approval")}

    follower = None
    try:
        run = asyncio.create_task(clutch.run({"n": 1}, run_id=run_id))
        await asyncio.wait_for(asked.wait(), TIMEOUT)
        follower = await _follow_events(tmp_path, any_url, run_id, FOLLOW_INTERVAL)
        rows = await _lines_through_first_call(follower)
        followed.set()
        with pytest.raises(RunWaiting):
            await run
        rows += await _lines_to_the_end(follower)  # --follow ends when the run waits
    finally:
        asked.set()
        followed.set()
        if follower is not None and follower.returncode is None:
            follower.kill()
            await follower.wait()
        await store.close()
    assert _calls(rows) == [(1, 0), (1, 1), (1, 2)]  # the wait journals its deadline
    functions = [row["data"]["function"] for row in rows if row["kind"] == "call_journaled"]
    assert functions == [f"{__name__}.ask", f"{__name__}.ask", "nestegg.wait_for:deadline"]
    assert rows[-1]["kind"] == "run_waiting" and rows[-2]["kind"] == "call_journaled"


async def test_a_crash_and_its_takeover_are_on_the_timeline(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, FAIL_ENV)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, any_url, run_id],
        cwd=ROOT, env={**env, KILL_ENV: "1", HOME_ENV: str(tmp_path / "home")},
    )  # fmt: skip
    assert await asyncio.to_thread(child.wait, TIMEOUT) == -signal.SIGKILL
    before = await shown(tmp_path, any_url, run_id)
    assert before["run"]["interrupted"] is True
    assert (before["step_in_flight"]["seq"], before["step_in_flight"]["agent"]) == (2, "enrich")
    assert len(before["step_in_flight"]["calls"]) == 1
    text = await nestegg_cli(tmp_path, "show", run_id, "--store", any_url)
    assert "interrupted, 1 call journaled" in timeline_row(text, 2)

    store = open_store(any_url)
    try:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
        assert (await clutch.resume_latest(run_id))["report"] == "Killed: 3 items"
    finally:
        await store.close()
    logged = await events(tmp_path, any_url, run_id)
    kinds = [e["kind"] for e in logged]
    interrupted = logged[kinds.index("run_interrupted")]
    resumed = logged[kinds.index("run_interrupted") + 1]
    assert interrupted["data"]["owner"]["pid"] == child.pid
    assert interrupted["data"]["steps"] == 1
    assert resumed["kind"] == "run_resumed"
    assert resumed["data"]["previous"] == "interrupted"
    assert resumed["data"]["previous_owner"]["pid"] == child.pid
    assert kinds[-1] == "run_completed"


async def test_a_run_stopped_by_ctrl_c_in_a_step_shows_that_step_cancelled(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    gate = tmp_path / "gate"
    gate.touch()  # step 2 goes on at once: the child stalls in step 3, after its call
    store = open_store(any_url)
    await store.setup()
    child = _gated_child(any_url, run_id, gate, "run")
    try:
        while not await _has_called(store, run_id, 3):
            await asyncio.sleep(0.05)
        child.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(child.wait, TIMEOUT) != 0
    finally:
        if child.poll() is None:
            await _kill(child)
        await store.close()
    details = await shown(tmp_path, any_url, run_id)
    assert details["run"]["status"] == "cancelled" and details["run"]["steps"] == 2
    cancelled = details["step_in_flight"]
    assert (cancelled["seq"], cancelled["agent"], len(cancelled["calls"])) == (3, "conclude", 1)
    assert cancelled["started"] is not None
    text = await nestegg_cli(tmp_path, "show", run_id, "--store", any_url)
    row = timeline_row(text, 3)
    assert row.split()[:2] == ["3", "conclude"] and row.split()[2] != "-"  # its start
    assert row.endswith("cancelled, 1 call journaled")
    kinds = [e["kind"] for e in await events(tmp_path, any_url, run_id)]
    assert kinds[-2:] == ["step_started", "run_cancelled"]  # what show reads


async def test_a_failed_step_shows_its_start_and_duration(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    store = open_store(any_url)
    os.environ[FAIL_ENV] = "1"
    try:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
        with pytest.raises(RuntimeError, match="enrich broke"):
            await clutch.run({"name": "Broken"}, run_id=run_id)
    finally:
        del os.environ[FAIL_ENV]
        await store.close()
    failed = (await shown(tmp_path, any_url, run_id))["failed_step"]
    assert (failed["seq"], failed["agent"]) == (2, "enrich")
    assert failed["started"] is not None and failed["duration"] >= 0
    row = timeline_row(await nestegg_cli(tmp_path, "show", run_id, "--store", any_url), 2)
    assert row.split()[2] != "-" and "failed" in row  # STARTED holds a time


def test_a_followed_call_shows_its_duration_or_a_dash_when_unknown() -> None:
    from datetime import UTC, datetime

    from nestegg.cli.events import event_line

    def line(duration: float | None) -> str:
        data = {"seq": 2, "position": 0, "function": "m.ask", "outcome": "returned",
                "duration": duration}  # fmt: skip
        at = datetime(2026, 1, 1, tzinfo=UTC)
        return event_line({"seq": None, "at": at, "kind": "call_journaled", "data": data})

    assert line(0.25).endswith("function=m.ask outcome=returned duration=250ms")
    assert line(None).endswith("outcome=returned duration=-")  # journaled before durations


GATED_CHILD = """
import asyncio, sys
from pathlib import Path
from nestegg.checkpoint.stores import open_store
from tests.cli.test_live_view import gated_clutch

url, run_id, gate, start = sys.argv[1:]
clutch = gated_clutch(open_store(url), Path(gate), stall=True)
if start == "run":
    asyncio.run(clutch.run({"n": 1}, run_id=run_id))
else:
    asyncio.run(clutch.resume(start))
"""


def gated_clutch(store: CheckpointStorage, gate: Path, *, stall: bool) -> Clutch:
    """``live`` with three steps: ``prepare``; ``research``, a call and then a wait for the
    file ``gate``; ``conclude``, a call and then, if ``stall``, a wait for its process's
    end (a child killed there leaves the run interrupted in step 3)."""
    clutch = live_clutch(store)

    @clutch.agent()
    async def prepare(data: dict) -> dict:
        return data

    @clutch.agent()
    async def research(data: dict) -> dict:
        answer = await nestegg.call(ask, "eggs")
        while not gate.exists():
            await asyncio.sleep(0.02)
        return {**data, "answer": answer}

    @clutch.agent()
    async def conclude(data: dict) -> dict:
        summary = await nestegg.call(ask, "all")
        if stall:
            await asyncio.sleep(3600)
        return {**data, "summary": summary}

    return clutch


def _gated_child(url: str, run_id: str, gate: Path, start: str) -> subprocess.Popen[bytes]:
    """A process running (``start`` = ``run``) or resuming from checkpoint ``start`` the
    run ``run_id`` of :func:`gated_clutch`, stalling in its third step."""
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, FAIL_ENV, KILL_ENV)}
    return subprocess.Popen(
        [sys.executable, "-c", GATED_CHILD, url, run_id, str(gate), start], cwd=ROOT, env=env
    )


async def _has_called(store: CheckpointStorage, run_id: str, step: int) -> bool:
    """Whether step ``step`` of the run has journaled a call (read once the steps before
    it are committed: the run is whole in the store)."""
    run = await store.get_run(run_id)
    return (
        run is not None
        and run.step_seq >= step - 1
        and bool(await store.read_journal(run_id, step))
    )


async def _kill(child: subprocess.Popen[bytes]) -> None:
    child.kill()
    assert await asyncio.to_thread(child.wait, TIMEOUT) == -signal.SIGKILL


async def _read_calls(
    process: asyncio.subprocess.Process, rows: list[dict[str, Any]], calls: int
) -> None:
    """Read the JSON lines the process prints into ``rows`` until they hold ``calls``
    ``call_journaled`` lines."""
    assert process.stdout is not None
    while len(_calls(rows)) < calls:
        line = await asyncio.wait_for(process.stdout.readline(), TIMEOUT)
        assert line, "the command ended first"
        rows.append(orjson.loads(line))


async def test_follow_prints_the_calls_made_again_after_a_resume_from_an_older_checkpoint(
    tmp_path: Path, any_url: str, run_id: str
) -> None:
    gate = tmp_path / "gate"
    store = open_store(any_url)
    await store.setup()  # before the child starts: not two processes creating the schema
    followers: list[asyncio.subprocess.Process] = []
    children = [_gated_child(any_url, run_id, gate, "run")]
    seen: list[list[dict[str, Any]]] = [[], []]  # by the followers started in steps 2 and 3
    try:
        while not await _has_called(store, run_id, 2):
            await asyncio.sleep(0.05)
        followers.append(await _follow_events(tmp_path, any_url, run_id))
        await _read_calls(followers[0], seen[0], 1)
        gate.touch()
        await _read_calls(followers[0], seen[0], 2)  # step 3's call: it stalls after it
        followers.append(await _follow_events(tmp_path, any_url, run_id))
        await _read_calls(followers[1], seen[1], 1)
        await _kill(children[0])
        after_step_1 = [c for c in await store.list_checkpoints(run_id) if c.seq == 1]
        children.append(_gated_child(any_url, run_id, gate, after_step_1[0].checkpoint_id))
        await _read_calls(followers[0], seen[0], 4)  # steps 2 and 3 called again
        await _read_calls(followers[1], seen[1], 3)
        await _kill(children[1])
        clutch = gated_clutch(store, gate, stall=False)
        assert (await clutch.resume_latest(run_id))["summary"] == "about all"  # replays step 3
        for follower, rows in zip(followers, seen, strict=True):
            rows += await _lines_to_the_end(follower)
    finally:
        gate.touch()
        for child in children:
            if child.poll() is None:
                child.kill()
                await asyncio.to_thread(child.wait, TIMEOUT)
        for follower in followers:
            if follower.returncode is None:
                follower.kill()
                await follower.wait()
        await store.close()
    # Each follower prints a call made again after the resume from step 1's checkpoint
    # (the first: the ones it had printed; the second: also step 2's, committed before it
    # began), and not the call step 3 replays from the journal after the last resume.
    assert _calls(seen[0]) == [(2, 0), (3, 0), (2, 0), (3, 0)]
    assert _calls(seen[1]) == [(3, 0), (2, 0), (3, 0)]
    for rows in seen:
        resumed = _where(rows, "run_resumed")
        calls = [i for i, row in enumerate(rows) if row["kind"] == "call_journaled"]
        again = calls[-2:]
        assert resumed < again[0] and rows[again[0]]["data"]["seq"] == 2
        completed = [i for i, r in enumerate(rows) if r["kind"] == "step_completed" and i > resumed]
        assert again[0] < completed[0] < again[1] < completed[1]  # each before its step ends
        assert rows[-1]["kind"] == "run_completed"
    step_2 = [r["at"] for r in seen[0] if r["kind"] == "call_journaled" and r["data"]["seq"] == 2]
    assert step_2[0] != step_2[1]  # the second is another call: made again
