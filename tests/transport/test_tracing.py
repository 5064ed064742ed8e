"""One run, one trace across processes: a caller (this process, with the OpenTelemetry
SDK's in-memory exporters) and ``nestegg worker`` processes on a real broker (Redis
Streams, then RabbitMQ) that trace to files (:mod:`tests.transport.traced_apps`).

The caller's ``invoke_workflow`` span is the parent of every step's ``invoke_agent`` span,
whichever worker process ran it, also after a SIGKILLed worker's step was taken over
(whose journaled call is then marked replayed, and the run counted recovered by the
worker that took it over); the workers record the step metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from nestegg import Clutch
from nestegg.checkpoint.records import Owner
from nestegg.checkpoint.views import Event
from nestegg.constants import RUN_STARTED
from nestegg.errors import RunFailedError
from nestegg.transport.base import channel_name
from nestegg.transport.worker import Worker
from tests.otel_sdk import (
    TELEMETRY_ENV,
    Sdk,
    install_sdk,
    metrics_file,
    read_spans,
    reset_globals,
    spans_file,
)
from tests.transport.apps import STEPS, make_chain, make_slow, make_split
from tests.transport.conftest import Deployment, WorkerProcess, wait_until
from tests.transport.test_caller import serving
from tests.transport.test_workers import _effects_sync, uninterrupted_result

pytestmark = [pytest.mark.crash, pytest.mark.server]

TRACED = "tests.transport.traced_apps"
EFFECT = "execute_tool tests.transport.apps.side_effect"


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    """The SDK installed in this process (the caller's) for one test."""
    reset_globals()
    yield install_sdk()
    reset_globals()


@pytest.fixture
def telemetry_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The folder the traced worker processes write their spans and metrics to."""
    monkeypatch.setenv(TELEMETRY_ENV, str(tmp_path))
    return tmp_path


def hex_ids(span: Any) -> tuple[str, str]:
    """An in-memory span's trace and span ids as the worker files write them."""
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


def workflow_of(sdk: Sdk, pipeline: str) -> Any:
    (workflow,) = [s for s in sdk.finished() if s.name == f"invoke_workflow {pipeline}"]
    return workflow


def spans_of(folder: Path, worker: WorkerProcess) -> list[dict[str, Any]]:
    return read_spans(spans_file(folder, worker.process.pid))


def stop(worker: WorkerProcess, folder: Path) -> dict[str, list[list[Any]]]:
    """SIGTERM ``worker``; the metric points it wrote at exit ([attributes, value])."""
    worker.terminate()
    assert worker.wait(30) == 0, worker.errors()
    points: dict[str, list[list[Any]]] = json.loads(
        metrics_file(folder, worker.process.pid).read_text()
    )
    return points


async def run_and_stop(clutch: Clutch, run_id: str) -> Any:
    try:
        return await clutch.run({}, run_id=run_id, timeout=30)
    finally:
        await clutch.stop()


async def test_worker_steps_are_spans_of_the_callers_trace_with_their_metrics(
    deployment: Deployment, sdk: Sdk, telemetry_dir: Path
) -> None:
    worker = deployment.start_worker("chain", module=TRACED)
    assert await run_and_stop(make_chain(), "r1") == uninterrupted_result()
    points = stop(worker, telemetry_dir)
    workflow = workflow_of(sdk, "chain")
    trace_id, workflow_id = hex_ids(workflow)
    assert workflow.parent is None
    assert workflow.attributes["gen_ai.conversation.id"] == "r1"
    assert workflow.attributes["nestegg.run.status"] == "completed"
    assert workflow.attributes["nestegg.store"] == "redis"

    spans = spans_of(telemetry_dir, worker)
    steps = [s for s in spans if s["name"].startswith("invoke_agent")]
    assert [s["name"] for s in steps] == [
        f"invoke_agent {'ping' if seq % 2 else 'pong'}" for seq in range(1, STEPS + 1)
    ]
    fences = []
    for seq, step in enumerate(steps, start=1):
        assert (step["trace_id"], step["parent"]) == (trace_id, workflow_id)
        attributes = step["attributes"]
        fences.append(attributes.pop("nestegg.fence"))
        assert isinstance(attributes.pop("nestegg.checkpoint.id"), str)
        assert attributes == {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "ping" if seq % 2 else "pong",
            "gen_ai.conversation.id": "r1",
            "nestegg.run.id": "r1",
            "nestegg.step.seq": seq,
            "nestegg.step.outcome": "completed",
            "nestegg.store": "redis",
        }
    assert fences == sorted(fences) and fences[0] >= 1  # fences only grow: a worker may go on
    calls = [s for s in spans if s["name"] == EFFECT]
    assert [(c["trace_id"], c["parent"]) for c in calls] == [
        (trace_id, step["span_id"]) for step in steps
    ]
    assert [c["attributes"]["gen_ai.tool.call.id"] for c in calls] == [
        f"r1/{seq}/0" for seq in range(1, STEPS + 1)
    ]
    assert not any(c["attributes"]["nestegg.journal.replayed"] for c in calls)

    by_agent = sorted((p["gen_ai.agent.name"], v) for p, v in points["nestegg.steps"])
    assert by_agent == [("ping", STEPS // 2), ("pong", STEPS // 2)]
    assert sum(v for _, v in points["nestegg.step.duration"]) == STEPS
    assert [(p["nestegg.journal.replayed"], v) for p, v in points["nestegg.journal.calls"]] == [
        (False, STEPS)
    ]
    (commits,) = points["nestegg.checkpoint.commit.duration"]
    assert commits[0] == {"nestegg.store": "redis"} and commits[1] >= STEPS
    assert points["nestegg.runs"] == [
        [{"gen_ai.workflow.name": "chain", "nestegg.run.status": "completed"}, 1]
    ]
    assert "nestegg.runs" not in sdk.metrics()  # counted where the run ended, once
    assert "nestegg.runs.recovered" not in points  # nothing was interrupted


async def test_a_step_taken_over_from_a_killed_worker_stays_in_the_callers_trace(
    deployment: Deployment, sdk: Sdk, telemetry_dir: Path
) -> None:
    deployment.slow = 2.0
    first = deployment.start_worker("slow", module=TRACED)
    caller = make_slow()
    try:
        task = await caller.submit({}, run_id="r1")
        await wait_until(lambda: "r1:1" in _effects_sync(deployment), 20, "the first call")
        await wait_until(lambda: spans_of(telemetry_dir, first), 5, "the first call's span")
        first.kill()
        second = deployment.start_worker("slow", module=TRACED)
        result = await task.result(timeout=40)
    finally:
        await caller.stop()
    points = stop(second, telemetry_dir)
    assert result["crawled"] == result["after"] == second.process.pid
    trace_id, workflow_id = hex_ids(workflow_of(sdk, "slow"))

    (killed_call,) = spans_of(telemetry_dir, first)  # its step's span never ended
    assert killed_call["name"] == EFFECT and killed_call["trace_id"] == trace_id
    assert killed_call["attributes"]["nestegg.journal.replayed"] is False

    spans = spans_of(telemetry_dir, second)
    assert [s["name"] for s in spans] == [EFFECT, "invoke_agent crawl", "invoke_agent after"]
    replayed, crawl, after = spans
    for step in (crawl, after):
        assert (step["trace_id"], step["parent"]) == (trace_id, workflow_id)
        assert step["attributes"]["gen_ai.conversation.id"] == "r1"
    assert crawl["attributes"]["nestegg.step.seq"] == 1
    assert crawl["attributes"]["nestegg.fence"] > 1  # claimed again after the kill
    assert crawl["attributes"]["nestegg.resumed"] is True  # taken over
    assert "nestegg.resumed" not in after["attributes"]  # the run simply went on
    assert (replayed["trace_id"], replayed["parent"]) == (trace_id, crawl["span_id"])
    assert replayed["attributes"]["gen_ai.tool.call.id"] == "r1/1/0"
    assert replayed["attributes"]["nestegg.journal.replayed"] is True
    assert _effects_sync(deployment) == {"r1:1": 1}
    assert points["nestegg.journal.calls"] == [
        [{"gen_ai.workflow.name": "slow", "gen_ai.tool.name": "tests.transport.apps.side_effect",
          "nestegg.journal.replayed": True}, 1]
    ]  # fmt: skip
    assert points["nestegg.runs.recovered"] == [[{"gen_ai.workflow.name": "slow"}, 1]]


async def test_a_worker_killed_while_it_goes_on_with_a_run_is_counted_as_taken_over(
    deployment: Deployment, sdk: Sdk, telemetry_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.pace = 0.15  # ten steps of 0.15 to 0.2 s: more than one step in a worker's turn
    deployment.apply(monkeypatch)
    workers = [deployment.start_worker("chain", module=TRACED) for _ in range(2)]
    caller = make_chain()
    try:
        await caller.run({}, run_id="warm-up", timeout=30)  # both workers are up
        task = await caller.submit({}, run_id="victim")
        store = await caller._book().ready()
        while (run := await store.get_run("victim")) is None or run.step_seq < 2:
            await asyncio.sleep(0.01)
        assert run.owner is not None and run.fence == 2, "the worker went on with the run"
        (victim,) = [w for w in workers if w.process.pid == run.owner.pid]
        victim.kill()  # past the step of the message it took: that message is repointed
        result = await task.result(timeout=40)
    finally:
        await caller.stop()
    (survivor,) = [w for w in workers if w is not victim]
    points = stop(survivor, telemetry_dir)
    assert result == uninterrupted_result()
    steps = [
        s["attributes"]
        for s in spans_of(telemetry_dir, survivor)
        if s["name"].startswith("invoke_agent")
        and s["attributes"]["gen_ai.conversation.id"] == "victim"
    ]
    resumed = [step["nestegg.step.seq"] for step in steps if step.get("nestegg.resumed")]
    assert len(resumed) == 1 and resumed[0] > run.step_seq  # the step its owner died in
    assert points["nestegg.runs.recovered"] == [[{"gen_ai.workflow.name": "chain"}, 1]]


async def test_without_an_sdk_messages_and_events_carry_no_trace(
    deployment: Deployment,
) -> None:
    reset_globals()
    caller, worker = make_chain(), make_chain()
    try:
        async with serving(worker):
            assert await caller.run({}, run_id="plain", timeout=20) == uninterrupted_result()
        store = await caller._book().ready()
        (started,) = [e for e in await store.read_events("plain") if e.kind == RUN_STARTED]
    finally:
        await caller.stop()
        await worker.stop()
    assert Event.from_record(started).data == {}


async def test_a_swept_run_keeps_the_trace_its_first_message_carried(
    deployment: Deployment, sdk: Sdk
) -> None:
    caller, pinger = make_chain(), make_chain()
    try:
        task = await caller.submit({}, run_id="r1")
        store = await caller._book().ready()
        async with serving(pinger, agents=["ping"]):  # step 2's message waits for pong
            while (run := await store.get_run("r1")) is None or run.step_seq < 1:
                await asyncio.sleep(0.02)
        (ping,) = [s for s in sdk.finished() if s.name == "invoke_agent ping"]
        swept = await Worker(pinger, pinger.transport, sweep_after=0.0).sweep()
        assert swept == ["r1"]
        deliveries = pinger.transport.consume([channel_name("chain")], hold=5.0)
        delivery = await asyncio.wait_for(anext(deliveries), 10)
        await deliveries.aclose()  # type: ignore[attr-defined]
        task.cancel()
    finally:
        await caller.stop()
        await pinger.stop()
    message = delivery.message
    assert (message.run_id, message.seq) == ("r1", 2)
    trace_id, parent = f"{ping.context.trace_id:032x}", f"{ping.parent.span_id:016x}"
    assert set(message.trace) == {"traceparent"}
    assert message.trace["traceparent"].startswith(f"00-{trace_id}-{parent}-")


async def test_a_swept_run_whose_owner_died_is_taken_over_and_counted_recovered(
    deployment: Deployment, sdk: Sdk, caplog: pytest.LogCaptureFixture
) -> None:
    caller, worker = make_chain(), make_chain()
    gone = Owner(host="elsewhere", pid=1, started="gone")
    try:
        task = await caller.submit({}, run_id="r1")
        first = caller.transport.consume([channel_name("chain", "ping")], hold=5.0)
        await (await asyncio.wait_for(anext(first), 10)).ack()  # taken by the owner that dies
        await first.aclose()  # type: ignore[attr-defined]
        store = await caller._book().ready()
        now = time.time()
        await store.claim_run("r1", 1, gone, now + 0.2, now)  # its claim, never released
        await asyncio.sleep(0.3)  # its lease runs out
        assert await Worker(worker, worker.transport, sweep_after=0.0).sweep() == ["r1"]
        with caplog.at_level(logging.INFO, logger="nestegg"):
            async with serving(worker):
                assert await task.result(timeout=30) == uninterrupted_result()
    finally:
        await caller.stop()
        await worker.stop()
    steps = [s for s in sdk.finished() if s.name.startswith("invoke_agent")]
    assert [s.attributes["nestegg.step.seq"] for s in steps] == list(range(1, STEPS + 1))
    assert steps[0].attributes["nestegg.resumed"] is True
    assert steps[0].attributes["nestegg.fence"] == 3  # the dead owner's claim was 2
    assert not any("nestegg.resumed" in s.attributes for s in steps[1:])
    (taken,) = [r for r in caplog.records if "taken over" in r.getMessage()]
    assert (taken.run_id, taken.step) == ("r1", 1)  # type: ignore[attr-defined]
    metrics = sdk.metrics()
    assert metrics["nestegg.runs.recovered"] == [({"gen_ai.workflow.name": "chain"}, 1)]
    assert metrics["nestegg.runs"] == [
        ({"gen_ai.workflow.name": "chain", "nestegg.run.status": "completed"}, 1)
    ]


async def fail_a_split_run() -> None:
    """Run ``split`` to its third agent's failure, run id ``failing``, with a worker in
    this process."""
    caller, worker = make_split(), make_split()
    try:
        async with serving(worker):
            with pytest.raises(RunFailedError):
                await caller.run({"fail": "no"}, run_id="failing", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()


async def test_worker_steps_are_logged_under_the_nestegg_logger_with_extras(
    deployment: Deployment, caplog: pytest.LogCaptureFixture
) -> None:
    reset_globals()
    with caplog.at_level(logging.DEBUG, logger="nestegg"):
        await fail_a_split_run()
    records = [r for r in caplog.records if r.name == "nestegg"]
    steps = [(r.run_id, r.step, r.agent, r.outcome) for r in records if hasattr(r, "outcome")]
    assert steps == [
        ("failing", 1, "first", "completed"),
        ("failing", 2, "second", "completed"),
        ("failing", 3, "third", "failed"),
    ]
    (failed,) = [r for r in records if r.getMessage().startswith("run 'failing' failed")]
    assert failed.run_id == "failing"  # type: ignore[attr-defined]


async def test_a_run_failed_in_a_worker_is_an_error_of_the_callers_span(
    deployment: Deployment, sdk: Sdk
) -> None:
    await fail_a_split_run()
    workflow = workflow_of(sdk, "split")
    (third,) = [s for s in sdk.finished() if s.name == "invoke_agent third"]
    assert third.parent.span_id == workflow.context.span_id
    for span in (workflow, third):
        assert span.status.status_code == trace.StatusCode.ERROR
        assert span.attributes["error.type"] == "ValueError"
    assert workflow.attributes["nestegg.run.status"] == "failed"
    assert third.attributes["nestegg.step.outcome"] == "failed"
    assert sdk.metrics()["nestegg.runs"] == [  # the worker's count; the caller counts nothing
        ({"gen_ai.workflow.name": "split", "nestegg.run.status": "failed"}, 1)
    ]


async def test_a_worker_captures_content_only_when_asked(
    deployment: Deployment, sdk: Sdk, monkeypatch: pytest.MonkeyPatch
) -> None:
    caller, worker = make_split(), make_split()
    try:
        async with serving(worker):
            await caller.run({"x": 1}, run_id="quiet", timeout=20)
            monkeypatch.setenv("NESTEGG_CAPTURE_CONTENT", "true")
            await caller.run({"x": 1}, run_id="captured", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()
    firsts = {
        s.attributes["nestegg.run.id"]: s for s in sdk.finished() if s.name == "invoke_agent first"
    }
    assert "nestegg.step.input" not in firsts["quiet"].attributes
    assert firsts["captured"].attributes["nestegg.step.input"] == '{"x":1}'
    assert json.loads(firsts["captured"].attributes["nestegg.step.output"])["x"] == 1


async def test_a_run_refused_by_its_callers_on_request_is_traced_and_stored_as_a_local_one(
    deployment: Deployment, sdk: Sdk
) -> None:
    """The caller's span covers on_request as a local attempt's does (same attributes, error
    status), the run is counted failed, and its events and checkpoint are a local refused
    run's, its ``run_started`` holding the caller's span."""
    from nestegg.checkpoint.formats import parse_failure
    from tests.transport.apps import config, transport

    async def on_request(request: dict[str, Any]) -> None:
        raise PermissionError("not allowed")

    async def answer(data: dict[str, Any]) -> dict[str, Any]:
        return data

    saved: list[str] = []

    async def on_checkpoint(info: Any) -> None:
        saved.append(info.run_id)

    hooks: dict[str, Any] = {"on_request": on_request, "on_checkpoint": on_checkpoint}
    remote = Clutch("gate", transport=transport(), checkpoint=config(), **hooks)
    local = Clutch("gate-local", checkpoint=config(), **hooks)
    remote.agent()(answer)
    local.agent()(answer)
    try:
        with trace.get_tracer("test").start_as_current_span("request") as request:
            with pytest.raises(PermissionError):
                await remote.run({"q": 1}, run_id="remote", timeout=20)
        with pytest.raises(PermissionError):
            await local.run({"q": 1}, run_id="local")
        store = await remote._book().ready()
        logs = {r: await store.read_events(r) for r in ("remote", "local")}
        runs = {r: await store.get_run(r) for r in ("remote", "local")}
        kept = {r: await store.list_checkpoints(r) for r in ("remote", "local")}
    finally:
        await remote.stop()
        await local.stop()
    spans = {s.attributes["nestegg.run.id"]: s for s in sdk.finished() if s.name != "request"}
    assert (spans["remote"].name, spans["local"].name) == (
        "invoke_workflow gate",
        "invoke_workflow gate-local",
    )
    shapes = {}
    for r, span in spans.items():
        named = ("nestegg.run.id", "gen_ai.conversation.id", "gen_ai.workflow.name")
        attributes = {k: v for k, v in span.attributes.items() if k not in named}
        events = [(e.name, e.attributes["exception.type"]) for e in span.events]
        shapes[r] = (attributes, span.status.status_code, span.status.description, events)
    assert shapes["remote"] == shapes["local"]
    assert shapes["local"][0]["nestegg.run.status"] == "failed"
    assert shapes["local"][2:] == (
        "PermissionError: not allowed",
        [("exception", "PermissionError")],
    )
    context = request.get_span_context()
    assert spans["remote"].parent is not None and spans["remote"].parent.span_id == context.span_id
    started = Event.from_record(logs["remote"][0]).data
    workflow = spans["remote"].get_span_context()
    ids = f"00-{context.trace_id:032x}-{workflow.span_id:016x}-"
    assert set(started["trace"]) == {"traceparent"}
    assert started["trace"]["traceparent"].startswith(ids)  # the caller's workflow span
    kinds = {
        r: [(e.kind, sorted(Event.from_record(e).data)) for e in events]
        for r, events in logs.items()
    }
    assert (
        kinds["remote"]
        == kinds["local"]
        == [
            ("run_started", ["trace"]),
            ("checkpoint_saved", ["checkpoint_id", "reason", "seq"]),
            ("run_failed", ["steps"]),
        ]
    )
    assert [(c.seq, c.reason) for c in kept["remote"]] == [(c.seq, c.reason) for c in kept["local"]]
    assert saved == ["remote", "local"]
    counted = sdk.metrics()
    assert sorted(counted["nestegg.runs"], key=str) == [
        ({"gen_ai.workflow.name": "gate", "nestegg.run.status": "failed"}, 1),
        ({"gen_ai.workflow.name": "gate-local", "nestegg.run.status": "failed"}, 1),
    ]
    assert counted["nestegg.checkpoint.commit.duration"] == [({"nestegg.store": "redis"}, 2)]
    errors = {}
    for r, run in runs.items():
        assert run is not None and run.status == "failed"
        assert run.error is not None
        errors[r] = {k: v for k, v in parse_failure(run.error, r).items() if k != "traceback"}
    assert errors["remote"] == errors["local"]
    assert errors["local"]["hook"] == "on_request"
