"""Traces and metrics (nestegg.telemetry) with the OpenTelemetry SDK's in-memory exporters:
the span tree of a run, its attributes, errors, replayed calls and the link of a resumed
attempt, the metrics, content capture, trace context in message headers, logging; and no
spans at all without an SDK."""

from __future__ import annotations

import ast
import asyncio
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace

from nestegg import Clutch, RunWaiting, call, get_context, otel, telemetry, wait_for
from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage, SQLiteCheckpointStorage
from nestegg.checkpoint.stores.base import CheckpointStorage
from tests.cli.conftest import damage_newest_event_batch, tear
from tests.otel_sdk import Sdk, install_sdk, reset_globals

PIPELINE = "enrich"


@pytest.fixture
def sdk() -> Iterator[Sdk]:
    """The SDK installed as the global providers for one test."""
    reset_globals()
    installed = install_sdk()
    yield installed
    reset_globals()
    telemetry.configure(capture_content=None)


@pytest.fixture
def no_sdk() -> Iterator[None]:
    """No tracer or meter provider configured (OpenTelemetry imported all the same)."""
    reset_globals()
    yield
    reset_globals()


async def llm(prompt: str) -> str:
    """The fake model every agent calls."""
    return prompt.upper()


class Flaky:
    """Makes the agent ``b`` fail once, after its first call, while ``armed``."""

    def __init__(self) -> None:
        self.armed = False
        self.executions: list[int | None] = []


def pipeline(store: Path | CheckpointStorage, flaky: Flaky | None = None) -> Clutch:
    """Three sequential agents (a makes one journaled call, b two, c none) on ``store`` (or
    a SQLite store at that path)."""
    flaky = flaky or Flaky()
    if isinstance(store, Path):
        store = SQLiteCheckpointStorage(store)
    clutch = Clutch(PIPELINE, checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def a(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "a": await call(llm, "one")}

    @clutch.agent()
    async def b(data: dict[str, Any]) -> dict[str, Any]:
        first = await call(llm, "two")
        if flaky.armed:
            flaky.armed = False
            raise ValueError("the model timed out")
        return {**data, "b": first + await call(llm, "three")}

    @clutch.agent()
    async def c(data: dict[str, Any]) -> dict[str, Any]:
        context = get_context()
        flaky.executions.append(None if context is None else id(context._execution))
        return {**data, "c": True}

    return clutch


async def close(clutch: Clutch) -> None:
    """Close the store the test gave ``clutch``."""
    config = clutch.checkpoint_config
    assert config is not None and config.storage is not None
    await config.storage.close()


def by_name(spans: list[Any]) -> dict[str, list[Any]]:
    named: dict[str, list[Any]] = {}
    for span in spans:
        named.setdefault(span.name, []).append(span)
    return named


async def test_a_run_is_a_workflow_span_with_agent_and_tool_spans(sdk: Sdk, tmp_path: Path) -> None:
    clutch = pipeline(tmp_path / "runs.db")
    assert await clutch.run({}, run_id="r1") == {"a": "ONE", "b": "TWOTHREE", "c": True}
    await close(clutch)
    spans = by_name(sdk.finished())
    (workflow,) = spans["invoke_workflow enrich"]
    assert workflow.parent is None
    assert workflow.kind == trace.SpanKind.INTERNAL
    assert dict(workflow.attributes) == {
        "gen_ai.operation.name": "invoke_workflow",
        "gen_ai.workflow.name": PIPELINE,
        "gen_ai.conversation.id": "r1",
        "nestegg.run.id": "r1",
        "nestegg.resumed": False,
        "nestegg.strategy": "sequential",
        "nestegg.store": "sqlite",
        "nestegg.fence": 1,
        "nestegg.run.status": "completed",
    }
    steps = [spans[f"invoke_agent {name}"][0] for name in "abc"]
    checkpoints = [c.checkpoint_id for c in await clutch.list_checkpoints("r1")]
    for seq, (step, name) in enumerate(zip(steps, "abc", strict=True), start=1):
        assert step.parent.span_id == workflow.context.span_id
        assert step.context.trace_id == workflow.context.trace_id
        assert dict(step.attributes) == {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": name,
            "gen_ai.conversation.id": "r1",
            "nestegg.run.id": "r1",
            "nestegg.step.seq": seq,
            "nestegg.step.outcome": "completed",
            "nestegg.checkpoint.id": checkpoints[seq - 1],
        }
    tools = spans["execute_tool tests.test_telemetry.llm"]
    assert [(t.parent.span_id, t.attributes["gen_ai.tool.call.id"]) for t in tools] == [
        (steps[0].context.span_id, "r1/1/0"),
        (steps[1].context.span_id, "r1/2/0"),
        (steps[1].context.span_id, "r1/2/1"),
    ]
    assert dict(tools[2].attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "tests.test_telemetry.llm",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": "r1/2/1",
        "nestegg.run.id": "r1",
        "nestegg.step.seq": 2,
        "nestegg.journal.position": 1,
        "nestegg.journal.replayed": False,
    }
    assert len(sdk.finished()) == 1 + 3 + 3


async def test_metrics_count_steps_calls_runs_and_time_commits(sdk: Sdk, tmp_path: Path) -> None:
    clutch = pipeline(tmp_path / "runs.db")
    await clutch.run({}, run_id="r1")
    await close(clutch)
    points = sdk.metrics()
    labels = {"gen_ai.workflow.name": PIPELINE, "nestegg.step.outcome": "completed"}
    assert sorted((p["gen_ai.agent.name"], v) for p, v in points["nestegg.steps"]) == [
        ("a", 1), ("b", 1), ("c", 1)
    ]  # fmt: skip
    assert all({**p, **labels} == p for p, _ in points["nestegg.steps"])
    assert sorted(v for _, v in points["nestegg.step.duration"]) == [1, 1, 1]
    calls = {"gen_ai.workflow.name": PIPELINE, "gen_ai.tool.name": "tests.test_telemetry.llm"}
    assert points["nestegg.journal.calls"] == [({**calls, "nestegg.journal.replayed": False}, 3)]
    completed = {"gen_ai.workflow.name": PIPELINE, "nestegg.run.status": "completed"}
    assert points["nestegg.runs"] == [(completed, 1)]
    # one per step (the first with the run's opening), the final one
    assert points["nestegg.checkpoint.commit.duration"] == [({"nestegg.store": "sqlite"}, 4)]
    assert "nestegg.runs.recovered" not in points


async def test_a_failed_step_is_an_error_and_the_resume_replays_and_links(
    sdk: Sdk, tmp_path: Path
) -> None:
    flaky = Flaky()
    flaky.armed = True
    clutch = pipeline(tmp_path / "runs.db", flaky)
    with pytest.raises(ValueError, match="timed out"):
        await clutch.run({}, run_id="r1")
    first = by_name(sdk.finished())
    (failed_run,) = first["invoke_workflow enrich"]
    (failed_step,) = first["invoke_agent b"]
    for span in (failed_run, failed_step):
        assert span.status.status_code == trace.StatusCode.ERROR
        assert span.attributes["error.type"] == "ValueError"
        assert [e.name for e in span.events] == ["exception"]
    assert failed_step.attributes["nestegg.step.outcome"] == "failed"
    assert failed_run.attributes["nestegg.run.status"] == "failed"
    sdk.spans.clear()

    assert (await clutch.resume_latest("r1"))["b"] == "TWOTHREE"
    await close(clutch)
    spans = by_name(sdk.finished())
    (resumed,) = spans["invoke_workflow enrich"]
    assert resumed.attributes["nestegg.resumed"] is True
    assert resumed.attributes["nestegg.fence"] == 2
    assert resumed.attributes["nestegg.checkpoint.id"]
    assert [(link.context.trace_id, link.context.span_id) for link in resumed.links] == [
        (failed_run.context.trace_id, failed_run.context.span_id)
    ]
    tools = spans["execute_tool tests.test_telemetry.llm"]
    assert [(t.attributes["gen_ai.tool.call.id"], t.attributes["nestegg.journal.replayed"])
            for t in tools] == [("r1/2/0", True), ("r1/2/1", False)]  # fmt: skip
    points = sdk.metrics()
    calls = sorted((p["nestegg.journal.replayed"], v) for p, v in points["nestegg.journal.calls"])
    assert calls == [(False, 3), (True, 1)]  # a, b: 0 at first; b: 1 on resume
    runs = sorted((p["nestegg.run.status"], v) for p, v in points["nestegg.runs"])
    assert runs == [("completed", 1), ("failed", 1)]
    outcomes = sorted(
        (p["gen_ai.agent.name"], p["nestegg.step.outcome"], v) for p, v in points["nestegg.steps"]
    )
    assert outcomes == [("a", "completed", 1), ("b", "completed", 1), ("b", "failed", 1),
                        ("c", "completed", 1)]  # fmt: skip


async def test_without_an_sdk_no_span_is_made(no_sdk: None, tmp_path: Path) -> None:
    flaky = Flaky()
    clutch = pipeline(tmp_path / "runs.db", flaky)
    assert otel.tracer() is None and otel.meter_instruments() is None
    assert await clutch.run({}, run_id="r1")
    await close(clutch)
    assert flaky.executions and all(e is not None for e in flaky.executions)
    assert telemetry.inject_context() == {}


async def test_the_run_reports_nothing_without_an_sdk(no_sdk: None, tmp_path: Path) -> None:
    seen: list[Any] = []
    clutch = pipeline(tmp_path / "runs.db")

    @clutch.agent()
    async def d(data: dict[str, Any]) -> dict[str, Any]:
        context = get_context()
        assert context is not None
        seen.append(context._execution.telemetry)  # type: ignore[union-attr]
        return data

    await clutch.run({}, run_id="r1")
    await close(clutch)
    assert seen == [None]


async def test_content_is_captured_only_when_asked(
    sdk: Sdk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clutch = pipeline(tmp_path / "runs.db")
    await clutch.run({"topic": "x"}, run_id="off")
    assert not any(
        key in span.attributes
        for span in sdk.finished()
        for key in ("nestegg.step.input", "gen_ai.tool.call.arguments")
    )
    sdk.spans.clear()
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "SPAN_ONLY")
    await clutch.run({"topic": "x"}, run_id="env")
    assert by_name(sdk.finished())["invoke_agent a"][0].attributes["nestegg.step.input"] == (
        '{"topic":"x"}'
    )
    monkeypatch.delenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
    sdk.spans.clear()
    telemetry.configure(capture_content=True)
    await clutch.run({"topic": "x"}, run_id="param")
    await close(clutch)
    spans = by_name(sdk.finished())
    step = spans["invoke_agent a"][0]
    assert step.attributes["nestegg.step.output"] == '{"topic":"x","a":"ONE"}'
    tool = spans["execute_tool tests.test_telemetry.llm"][0]
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"args":["one"],"kwargs":{}}'
    assert tool.attributes["gen_ai.tool.call.result"] == '"ONE"'


HUGE = 2**70
"""An int past 64 bits, which orjson does not write."""


class Unprintable:
    """An argument whose repr fails: its content cannot be captured."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


async def measure(value: Any, of: Any = None) -> int:
    """A journaled call taking any argument."""
    return len(str(value))


async def test_captured_content_holds_huge_ints_and_never_fails_a_run(
    sdk: Sdk, tmp_path: Path
) -> None:
    telemetry.configure(capture_content=True)
    clutch = Clutch(
        PIPELINE, checkpoint=CheckpointConfig(storage=SQLiteCheckpointStorage(tmp_path / "runs.db"))
    )

    @clutch.agent()
    async def big(data: dict[str, Any]) -> dict[str, Any]:
        digits = await call(measure, HUGE)
        return {**data, "digits": digits, "more": await call(measure, -HUGE, of=Unprintable())}

    assert await clutch.run({"n": HUGE}, run_id="huge") == {
        "n": HUGE,
        "digits": 22,
        "more": 23,
    }
    await close(clutch)
    spans = by_name(sdk.finished())
    step = spans["invoke_agent big"][0]
    assert step.attributes["nestegg.step.input"] == f'{{"n":"{HUGE}"}}'
    assert step.attributes["nestegg.step.output"] == (f'{{"n":"{HUGE}","digits":22,"more":23}}')
    first, second = spans["execute_tool tests.test_telemetry.measure"]
    assert first.attributes["gen_ai.tool.call.arguments"] == f'{{"args":["{HUGE}"],"kwargs":{{}}}}'
    assert first.attributes["gen_ai.tool.call.result"] == "22"
    arguments = str(second.attributes["gen_ai.tool.call.arguments"])
    assert arguments.startswith("<not captured: ")  # a repr that fails: a placeholder
    assert second.attributes["gen_ai.tool.call.result"] == "23"
    assert otel.to_json({"n": [HUGE]}) == f'{{"n":["{HUGE}"]}}'
    assert otel.to_json({HUGE: {HUGE}}) == f'{{"{HUGE}":["{HUGE}"]}}'


async def test_latest_experimental_conventions_name_the_workflow_as_an_agent(
    sdk: Sdk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
    clutch = pipeline(tmp_path / "runs.db")
    await clutch.run({}, run_id="r1")
    await close(clutch)
    (workflow,) = by_name(sdk.finished())["invoke_workflow enrich"]
    assert workflow.attributes["gen_ai.agent.name"] == PIPELINE
    assert "gen_ai.workflow.name" not in workflow.attributes


async def test_trace_context_travels_in_message_headers(sdk: Sdk, tmp_path: Path) -> None:
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("enqueue") as sender:
        headers = telemetry.inject_context()
    assert set(headers) == {"traceparent"}
    clutch = pipeline(tmp_path / "runs.db")
    with telemetry.continue_trace(headers):
        await clutch.run({}, run_id="r1")
    await close(clutch)
    (workflow,) = by_name(sdk.finished())["invoke_workflow enrich"]
    assert workflow.context.trace_id == sender.get_span_context().trace_id
    assert workflow.parent.span_id == sender.get_span_context().span_id
    assert trace.get_current_span().get_span_context().is_valid is False


async def test_a_run_without_checkpointing_is_traced_too(sdk: Sdk) -> None:
    clutch = Clutch("plain")

    @clutch.agent()
    async def only(data: dict[str, Any]) -> dict[str, Any]:
        return {"answer": await call(llm, "x")}

    assert await clutch.run({}) == {"answer": "X"}
    spans = by_name(sdk.finished())
    (workflow,) = spans["invoke_workflow plain"]
    assert "nestegg.store" not in workflow.attributes
    assert spans["invoke_agent only"][0].parent.span_id == workflow.context.span_id
    assert "execute_tool tests.test_telemetry.llm" not in spans  # plain runs journal nothing


async def test_logging_goes_to_the_nestegg_logger_with_extras(
    no_sdk: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clutch = pipeline(tmp_path / "runs.db")
    with caplog.at_level(logging.DEBUG, logger="nestegg"):
        await clutch.run({}, run_id="r1")
    await close(clutch)
    records = [r for r in caplog.records if r.name == "nestegg"]
    steps = [(r.run_id, r.step, r.agent) for r in records if hasattr(r, "agent")]  # type: ignore[attr-defined]
    assert steps == [("r1", 1, "a"), ("r1", 2, "b"), ("r1", 3, "c")]
    messages = [r.getMessage() for r in records]
    assert messages[0] == "run r1 of enrich started"
    assert messages[-1] == "run r1 of enrich completed"
    assert sum("call 0 tests.test_telemetry.llm: executed" in m for m in messages) == 2


def test_the_library_is_quiet_by_default_and_never_prints() -> None:
    logger = logging.getLogger("nestegg")
    assert any(isinstance(h, logging.NullHandler) for h in logger.handlers)
    package = Path(telemetry.__file__).parent
    printing = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in package.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "print"
    ]
    assert printing == []


NO_OTEL_SCRIPT = """
import asyncio, logging, sys
block = sys.argv[1] == "block"
if block:
    sys.modules["opentelemetry"] = None  # as if the extra were not installed
logging.basicConfig(level=logging.DEBUG if block else logging.WARNING)
from nestegg import Clutch, call, telemetry
from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage

async def llm(prompt):
    return prompt.upper()

async def main():
    clutch = Clutch("p", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))

    @clutch.agent()
    async def a(data):
        return {"a": await call(llm, "x")}

    assert await clutch.run({}, run_id="r1") == {"a": "X"}
    assert telemetry.inject_context() == {}
    with telemetry.continue_trace({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}):
        pass
    assert "opentelemetry.trace" not in sys.modules

asyncio.run(main())
print("ok")
"""


@pytest.mark.parametrize("mode", ["not-imported", "block"])
def test_runs_without_opentelemetry_imported_or_installed(mode: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", NO_OTEL_SCRIPT, mode], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"
    if mode == "block":  # DEBUG logging on: the run was reported to the log, without spans
        assert "run r1 step 1 (a): completed" in done.stderr


def test_the_console_example_prints_the_spans_and_metrics_of_a_resumed_run() -> None:
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "examples/otel_console.py"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count('"name": "invoke_workflow research"') == 2
    assert out.count('"name": "invoke_agent search"') == 2
    assert out.count('"error.type": "TimeoutError"') == 2  # the failed step and its attempt
    assert '"nestegg.journal.replayed": true' in out
    assert '"nestegg.resumed": true' in out
    for metric in ("nestegg.steps", "nestegg.journal.calls", "nestegg.runs"):
        assert f'"name": "{metric}"' in out


async def test_a_cancelled_run_is_not_an_error(sdk: Sdk) -> None:
    clutch = Clutch("waits", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))
    started = asyncio.Event()

    @clutch.agent()
    async def slow(data: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await asyncio.sleep(60)
        return data

    task = await clutch.submit({}, run_id="r1")
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task.result()
    (workflow,) = by_name(sdk.finished())["invoke_workflow waits"]
    assert workflow.attributes["nestegg.run.status"] == "cancelled"
    assert workflow.status.status_code == trace.StatusCode.UNSET
    assert sdk.metrics()["nestegg.runs"] == [
        ({"gen_ai.workflow.name": "waits", "nestegg.run.status": "cancelled"}, 1)
    ]


class UnreadableEvents(MemoryCheckpointStorage):
    """A store whose event log cannot be read (everything else works)."""

    async def read_events(self, run_id: str, since_seq: int = 0, limit: int | None = None) -> Any:
        raise OSError("the event log is unreadable")


@pytest.mark.parametrize(
    ("torn", "told"),
    [
        (False, "no link to its earlier attempt: the event log is unreadable"),
        (
            True,
            "no link to its earlier attempt: the event log of run 'r1' is damaged (a torn batch)",
        ),
    ],
)
async def test_a_resume_whose_earlier_trace_cannot_be_read_runs_without_a_link(
    sdk: Sdk, caplog: pytest.LogCaptureFixture, tmp_path: Path, torn: bool, told: str
) -> None:
    # torn: a SQLite store whose failed run's newest event batch is cut short
    flaky = Flaky()
    flaky.armed = True
    clutch = pipeline(tmp_path / "runs.db" if torn else UnreadableEvents(), flaky)
    with pytest.raises(ValueError):
        await clutch.run({}, run_id="r1")
    if torn:
        damage_newest_event_batch(f"sqlite:///{tmp_path / 'runs.db'}", "r1", tear)
    sdk.spans.clear()
    with caplog.at_level(logging.WARNING, logger="nestegg"):
        assert (await clutch.resume_latest("r1"))["c"] is True
    (workflow,) = by_name(sdk.finished())["invoke_workflow enrich"]
    assert list(workflow.links) == []
    assert told in caplog.text


async def test_a_run_that_waits_for_a_signal_is_not_an_error(sdk: Sdk, tmp_path: Path) -> None:
    clutch = Clutch("approvals", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))

    @clutch.agent()
    async def ask(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "answer": await wait_for("approval")}

    with pytest.raises(RunWaiting):
        await clutch.run({}, run_id="r1")
    await close(clutch)
    spans = by_name(sdk.finished())
    (workflow,) = spans["invoke_workflow approvals"]
    (step,) = spans["invoke_agent ask"]
    assert workflow.attributes["nestegg.run.status"] == "waiting"
    assert step.attributes["nestegg.step.outcome"] == "waiting"
    for span in (workflow, step):
        assert span.status.status_code == trace.StatusCode.UNSET
        assert "error.type" not in span.attributes
    assert sdk.metrics()["nestegg.runs"] == [
        ({"gen_ai.workflow.name": "approvals", "nestegg.run.status": "waiting"}, 1)
    ]


@pytest.mark.parametrize(
    "module", ["nestegg.checkpoint.stores.file", "nestegg.langgraph", "nestegg.checkpoint"]
)
def test_any_module_of_the_package_keeps_the_library_quiet(module: str) -> None:
    # nestegg's own package gives its logger the NullHandler, whatever module is imported
    # first: a program that configured no logging gets none of nestegg's lines on stderr.
    code = (
        f"import logging, {module}\n"
        "print([type(h).__name__ for h in logging.getLogger('nestegg').handlers])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "['NullHandler']\n", "")
