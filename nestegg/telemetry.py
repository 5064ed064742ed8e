"""OpenTelemetry traces and metrics of runs, steps and journaled calls, and log records.

With ``pip install 'nestegg[otel]'`` (``opentelemetry-api`` only) and an SDK configured by
the application, every run attempt is an ``invoke_workflow {pipeline}`` span, every step an
``invoke_agent {agent}`` span under it and every journaled call an ``execute_tool
{function}`` span under its step, named and attributed as the OpenTelemetry GenAI semantic
conventions say, plus nestegg's own ``nestegg.*`` attributes (a call served from the
journal carries ``nestegg.journal.replayed=true``). A resumed attempt links to the span of
the attempt it continues, whose trace context is kept in the run's opening event (the
attempts' spans and counts are :mod:`nestegg.telemetry_attempts`'). Metrics go to the
global meter provider.

Nothing of it runs unless an SDK is configured: whether a tracer provider, a meter provider
or a DEBUG level on the ``nestegg`` logger is set is looked up once per run attempt (and
OpenTelemetry is not even imported unless the application imported it); without any, the
step loop runs exactly as it does without this module.

Step data and call arguments and results are recorded on spans only when asked for:
:func:`configure` ``(capture_content=True)``, ``NESTEGG_CAPTURE_CONTENT=true`` or
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``true``, ``SPAN_ONLY`` or
``SPAN_AND_EVENT``). ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` names the
workflow on its span with ``gen_ai.agent.name`` (the latest experimental GenAI conventions)
instead of ``gen_ai.workflow.name``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nestegg import otel
from nestegg.constants import RUN_RESUMED, RUN_STARTED, TRACE_KEY
from nestegg.otel import (
    AGENT_NAME,
    CHECKPOINT_ID,
    CONVERSATION_ID,
    JOURNAL_POSITION,
    OPERATION,
    REPLAYED,
    RUN_ID,
    RUN_STATUS,
    STEP_INPUT,
    STEP_OUTCOME,
    STEP_OUTPUT,
    STEP_SEQ,
    STORE,
    TOOL_ARGUMENTS,
    TOOL_CALL_ID,
    TOOL_NAME,
    TOOL_RESULT,
    TOOL_TYPE,
    WORKFLOW_NAME,
    Instruments,
    continue_trace,
    extract_context,
    inject_context,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from nestegg.agents import AgentNode
    from nestegg.execution import RunExecution

__all__ = [
    "RunTelemetry",
    "capture_content",
    "configure",
    "continue_trace",
    "ended_by",
    "extract_context",
    "inject_context",
    "latest_conventions",
    "step_runner",
    "store_name",
    "store_shown",
    "stored_trace",
    "timed_commit",
]

log = logging.getLogger("nestegg")  # with a NullHandler: nestegg/__init__.py

CAPTURE_ENV = "NESTEGG_CAPTURE_CONTENT"
GENAI_CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
STABILITY_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST_GENAI = "gen_ai_latest_experimental"
_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})


_settings: dict[str, bool | None] = {"capture_content": None}


def configure(*, capture_content: bool | None = None) -> None:
    """Set what the spans of runs started from now on record.

    Args:
        capture_content: record step data (``nestegg.step.input``/``output``) and the
            arguments and results of journaled calls (``gen_ai.tool.call.arguments``/
            ``result``) on spans; None: as the environment says (off by default).

    Example:
        >>> nestegg.telemetry.configure(capture_content=True)
    """
    _settings["capture_content"] = capture_content


def capture_content() -> bool:
    """Whether spans record step data and call arguments and results (see :func:`configure`)."""
    chosen = _settings["capture_content"]
    if chosen is not None:
        return chosen
    values = (os.environ.get(CAPTURE_ENV, ""), os.environ.get(GENAI_CAPTURE_ENV, ""))
    return any(value.strip().lower() in _CAPTURE_VALUES for value in values)


def latest_conventions() -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest experimental GenAI
    conventions."""
    values = os.environ.get(STABILITY_ENV, "").split(",")
    return LATEST_GENAI in (value.strip() for value in values)


async def stored_trace(store: Any, run_id: str) -> dict[str, str]:
    """The trace context (W3C headers) kept in the run's latest opening event that has
    one; empty when none has."""
    from nestegg.checkpoint.views import Event

    found: dict[str, str] = {}
    for record in await store.read_events(run_id, 0):
        if record.kind in (RUN_STARTED, RUN_RESUMED):
            carrier = Event.from_record(record).data.get(TRACE_KEY)
            if isinstance(carrier, dict) and carrier:
                found = {str(key): str(value) for key, value in carrier.items()}
    return found


# ---------------------------------------------------------------------- a run


class RunTelemetry:
    """What one run attempt reports: spans, metrics and DEBUG log records of its steps and
    journaled calls (each only when configured)."""

    def __init__(
        self,
        tracer: Tracer | None,
        instruments: Instruments | None,
        run_id: str,
        pipeline: str,
    ) -> None:
        self.tracer = tracer
        self.instruments = instruments
        self.run_id = run_id
        self.pipeline = pipeline
        self.capture = capture_content() and tracer is not None
        self.debug = log.isEnabledFor(logging.DEBUG)
        self.step_attributes: dict[str, Any] = {}
        """Attributes added to every step's span (a worker's: its claim's fence, the store)."""

    def step_runner(
        self, execution: RunExecution, step: Callable[[AgentNode], Awaitable[bool]]
    ) -> Callable[[AgentNode], Awaitable[bool]]:
        """``step`` (one step of ``execution``) reported as an ``invoke_agent`` span."""
        return functools.partial(self._step, execution, step)

    async def _step(
        self,
        execution: RunExecution,
        step: Callable[[AgentNode], Awaitable[bool]],
        agent: AgentNode,
    ) -> bool:
        seq = execution.seq + 1
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            AGENT_NAME: agent.name,
            CONVERSATION_ID: self.run_id,
            RUN_ID: self.run_id,
            STEP_SEQ: seq,
            **self.step_attributes,
        }
        if self.capture:
            attributes[STEP_INPUT] = otel.to_json(execution.ctx.data)
        started = time.perf_counter()
        with otel.span(self.tracer, f"invoke_agent {agent.name}", attributes) as span:
            try:
                stop = await step(agent)
            except BaseException as error:
                ended = ended_by(error)
                if ended == "failed":
                    otel.fail(span, error, STEP_OUTCOME)
                elif span is not None:
                    span.set_attribute(STEP_OUTCOME, ended)
                self._stepped(agent.name, seq, ended, started)
                raise
            outcome = execution.last_outcome
            if span is not None:
                span.set_attribute(STEP_OUTCOME, outcome)
                checkpoint_id = _checkpoint_of(execution.recorder, seq)
                if checkpoint_id is not None:
                    span.set_attribute(CHECKPOINT_ID, checkpoint_id)
                if self.capture:
                    span.set_attribute(STEP_OUTPUT, otel.to_json(execution.ctx.data))
        self._stepped(agent.name, seq, outcome, started)
        return stop

    def ended(self, status: str) -> None:
        """Count the run as ended with ``status`` (``nestegg.runs``): a worker's step that
        ended the run."""
        if self.instruments is not None:
            self.instruments.runs.add(1, {WORKFLOW_NAME: self.pipeline, RUN_STATUS: status})

    def recovered(self) -> None:
        """Count the run as an interrupted run recovered (``nestegg.runs.recovered``): a
        worker's step taken over from an owner that died, run without an error."""
        if self.instruments is not None:
            self.instruments.recovered.add(1, {WORKFLOW_NAME: self.pipeline})

    def _stepped(self, agent: str, seq: int, outcome: str, started: float) -> None:
        elapsed = time.perf_counter() - started
        if self.instruments is not None:
            labels = {WORKFLOW_NAME: self.pipeline, AGENT_NAME: agent, STEP_OUTCOME: outcome}
            self.instruments.steps.add(1, labels)
            self.instruments.step_duration.record(elapsed, labels)
        if self.debug:
            log.debug(
                "run %s step %d (%s): %s in %.6f s",
                self.run_id,
                seq,
                agent,
                outcome,
                elapsed,
                extra={"run_id": self.run_id, "step": seq, "agent": agent, "outcome": outcome},
            )

    async def call(
        self,
        execution: RunExecution,
        function: str,
        digest: str,
        replay: str,
        invoke: Callable[[], Awaitable[Any]],
        rebuild: Callable[[Any, str], Any] | None,
        arguments: tuple[tuple[Any, ...], dict[str, Any]],
    ) -> Any:
        """A journaled call of ``execution`` reported as an ``execute_tool`` span."""
        step, position = execution.call_step, execution.call_position
        executed = False

        async def counted() -> Any:
            nonlocal executed
            executed = True
            return await invoke()

        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: function,
            TOOL_TYPE: "function",
            TOOL_CALL_ID: f"{self.run_id}/{step}/{position}",
            RUN_ID: self.run_id,
            STEP_SEQ: step,
            JOURNAL_POSITION: position,
        }
        if self.capture:
            attributes[TOOL_ARGUMENTS] = otel.to_json(
                {"args": arguments[0], "kwargs": arguments[1]}
            )
        with otel.span(self.tracer, f"execute_tool {function}", attributes) as span:
            try:
                result = await execution.journaled(function, digest, replay, counted, rebuild)
            except BaseException as error:
                self._called(span, function, step, position, not executed)
                otel.fail(span, error)
                raise
            self._called(span, function, step, position, not executed)
            if span is not None and self.capture:
                span.set_attribute(TOOL_RESULT, otel.to_json(result))
        return result

    def _called(
        self, span: Span | None, function: str, step: int | None, position: int, replayed: bool
    ) -> None:
        if span is not None:
            span.set_attribute(REPLAYED, replayed)
        if self.instruments is not None:
            labels: dict[str, str | bool] = {
                WORKFLOW_NAME: self.pipeline,
                TOOL_NAME: function,
                REPLAYED: replayed,
            }
            self.instruments.calls.add(1, labels)
        if self.debug:
            log.debug(
                "run %s step %s call %d %s: %s",
                self.run_id,
                step,
                position,
                function,
                "replayed from the journal" if replayed else "executed",
                extra={"run_id": self.run_id, "step": step, "function": function},
            )


def _checkpoint_of(recorder: Any, seq: int) -> str | None:
    """The id of the checkpoint the recorder wrote with step ``seq``, if it wrote one."""
    if getattr(recorder, "checkpointed_seq", None) != seq:
        return None
    kept = getattr(recorder, "kept", None)
    return str(kept[-1]) if kept else None


def step_runner(execution: RunExecution) -> Callable[[AgentNode], Awaitable[bool]]:
    """The function that runs one step of ``execution``: its own, or reported when the run
    reports (chosen once per run, so that the step loop does nothing more when off)."""
    telemetry = execution.telemetry
    if telemetry is None:
        return execution._step
    return telemetry.step_runner(execution, execution._step)


def timed_commit(store: Any) -> Callable[[Any], Awaitable[None]]:
    """``store.commit``, timed into ``nestegg.checkpoint.commit.duration`` when a meter
    provider is configured (chosen once per run)."""
    commit: Callable[[Any], Awaitable[None]] = store.commit
    instruments = otel.meter_instruments()
    if instruments is None:
        return commit
    labels = {STORE: store_name(store)}
    histogram = instruments.commit_duration

    async def timed(change: Any) -> None:
        started = time.perf_counter()
        try:
            await commit(change)
        finally:
            histogram.record(time.perf_counter() - started, labels)

    return timed


def store_name(store: Any) -> str:
    """A store's short name: its URL scheme (``sqlite``, ``redis``, ...) or class name."""
    from nestegg.checkpoint.stores.registry import BY_NAME

    name = type(store).__name__
    entry = BY_NAME.get(name)
    return entry.schemes[0] if entry is not None and entry.schemes else name


def store_shown(store: Any) -> str:
    """A store as a worker's lines name it: its short name (:func:`store_name`) and where
    it is: a server store's URL without its password and its prefix, a SQLite file's
    path, a file store's directory."""
    kind = store_name(store)
    where = getattr(store, "where", None)  # PostgreSQL, Redis
    if isinstance(where, str):
        return f"{kind} at {where}"
    place = getattr(store, "path", None) or getattr(store, "root", None)  # SQLite, file
    if place is not None:
        return f"{kind} {place}"
    prefix = getattr(store, "prefix", None) or getattr(store, "table_prefix", None)
    return f"{kind} (prefix {prefix!r})" if prefix else kind


def ended_by(error: BaseException) -> str:
    """How a step or an attempt that raised ``error`` ended: cancelled, waiting (for a
    signal or a timer: not an error) or failed."""
    import asyncio

    from nestegg.errors import RunWaiting
    from nestegg.signals import WaitSuspended

    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, WaitSuspended | RunWaiting):
        return "waiting"
    return "failed"
