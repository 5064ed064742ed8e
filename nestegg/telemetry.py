"""OpenTelemetry traces and metrics of runs, steps and journaled calls, and log records.

With ``pip install 'nestegg[otel]'`` (``opentelemetry-api`` only) and an SDK configured by
the application, every run attempt is an ``invoke_workflow {pipeline}`` span, every step an
``invoke_agent {agent}`` span under it and every journaled call an ``execute_tool
{function}`` span under its step, named and attributed as the OpenTelemetry GenAI semantic
conventions say, plus nestegg's own ``nestegg.*`` attributes (a call served from the
journal carries ``nestegg.journal.replayed=true``). A resumed attempt links to the span of
the attempt it continues, whose trace context is kept in the run's opening event. Metrics
go to the global meter provider.

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
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from nestegg.constants import RUN_RESUMED, RUN_STARTED, RUNNING

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.trace import Span, SpanContext, Tracer

    from nestegg.agents import AgentNode
    from nestegg.execution import RunExecution

log = logging.getLogger("nestegg")
log.addHandler(logging.NullHandler())

T = TypeVar("T")
SCOPE = "nestegg"
TRACE_KEY = "trace"
"""The key of the opening event's payload that holds the attempt's trace context."""
CAPTURE_ENV = "NESTEGG_CAPTURE_CONTENT"
GENAI_CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
STABILITY_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
LATEST_GENAI = "gen_ai_latest_experimental"
_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})

OPERATION = "gen_ai.operation.name"
WORKFLOW_NAME = "gen_ai.workflow.name"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
RUN_ID = "nestegg.run.id"
STEP_SEQ = "nestegg.step.seq"
STEP_OUTCOME = "nestegg.step.outcome"
STEP_INPUT = "nestegg.step.input"
STEP_OUTPUT = "nestegg.step.output"
CHECKPOINT_ID = "nestegg.checkpoint.id"
FENCE = "nestegg.fence"
RESUMED = "nestegg.resumed"
STRATEGY = "nestegg.strategy"
STORE = "nestegg.store"
RUN_STATUS = "nestegg.run.status"
JOURNAL_POSITION = "nestegg.journal.position"
REPLAYED = "nestegg.journal.replayed"

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


def _otel_loaded() -> bool:
    """Whether the application imported OpenTelemetry (else no SDK can be configured)."""
    return "opentelemetry.trace" in sys.modules or "opentelemetry.metrics" in sys.modules


def _tracer() -> Tracer | None:
    """nestegg's tracer when a tracer provider is configured; None otherwise."""
    if not _otel_loaded():
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    from nestegg import __version__

    return provider.get_tracer(SCOPE, __version__)


@dataclass(frozen=True, slots=True)
class Instruments:
    """nestegg's metric instruments on one meter provider."""

    steps: Counter
    step_duration: Histogram
    commit_duration: Histogram
    calls: Counter
    runs: Counter
    recovered: Counter


_instruments: list[tuple[object, Instruments]] = []


def _meter_instruments() -> Instruments | None:
    """The instruments on the configured meter provider; None without one."""
    if not _otel_loaded():
        return None
    from opentelemetry import metrics

    provider = metrics.get_meter_provider()
    if isinstance(provider, metrics.NoOpMeterProvider) or type(provider).__name__ in (
        "_ProxyMeterProvider",
        "ProxyMeterProvider",
    ):
        return None
    for known, instruments in _instruments:
        if known is provider:
            return instruments
    from nestegg import __version__

    meter = provider.get_meter(SCOPE, __version__)
    made = Instruments(
        steps=meter.create_counter("nestegg.steps", "{step}", "Executed steps."),
        step_duration=meter.create_histogram(
            "nestegg.step.duration", "s", "Duration of a step, its checkpoint included."
        ),
        commit_duration=meter.create_histogram(
            "nestegg.checkpoint.commit.duration", "s", "Duration of a step's store commit."
        ),
        calls=meter.create_counter(
            "nestegg.journal.calls", "{call}", "Journaled calls, executed or replayed."
        ),
        runs=meter.create_counter("nestegg.runs", "{run}", "Run attempts by final status."),
        recovered=meter.create_counter(
            "nestegg.runs.recovered", "{run}", "Interrupted runs resumed to completion."
        ),
    )
    _instruments[:] = [(provider, made)]
    return made


def _json(value: Any) -> str:
    """``value`` as JSON text for a span attribute (what JSON cannot hold as its repr)."""
    return orjson.dumps(value, default=repr, option=orjson.OPT_NON_STR_KEYS).decode()


def _error_type(error: BaseException) -> str:
    return type(error).__qualname__


def _fail(span: Span | None, error: BaseException, outcome_key: str | None = None) -> None:
    """Mark ``span`` as ended by ``error`` (status, ``error.type``, exception event, and
    ``failed`` under ``outcome_key``)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute(ERROR_TYPE, _error_type(error))
    if outcome_key is not None:
        span.set_attribute(outcome_key, "failed")
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{_error_type(error)}: {error}"))


@contextmanager
def _span(
    tracer: Tracer | None,
    name: str,
    attributes: dict[str, Any],
    links: list[SpanContext] | None = None,
) -> Iterator[Span | None]:
    """An INTERNAL span made current while the block runs (nothing without a tracer)."""
    if tracer is None:
        yield None
        return
    from opentelemetry.trace import Link, SpanKind

    with tracer.start_as_current_span(
        name,
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        links=[Link(context) for context in links or ()],
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


# ----------------------------------------------------------------- trace context


def inject_context() -> dict[str, str]:
    """The current trace context as message headers (W3C ``traceparent``, ...).

    A broker transport puts them in a message so that the worker that takes it continues
    the same trace (:func:`continue_trace`). Empty when no trace is under way or
    OpenTelemetry is not in use.
    """
    if not _otel_loaded():
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract_context(carrier: Mapping[str, str]) -> Any:
    """The OpenTelemetry context that :func:`inject_context` headers carry; None when
    OpenTelemetry is not in use."""
    if not _otel_loaded() or not carrier:
        return None
    from opentelemetry import propagate

    return propagate.extract(dict(carrier))


@contextmanager
def continue_trace(carrier: Mapping[str, str] | None) -> Iterator[None]:
    """Make the trace context of ``carrier`` (message headers) current while the block runs.

    Example:
        >>> with telemetry.continue_trace(message.headers):
        ...     await clutch.resume_latest(run_id)
    """
    context = extract_context(carrier) if carrier else None
    if context is None:
        yield
        return
    from opentelemetry import context as otel_context

    token = otel_context.attach(context)
    try:
        yield
    finally:
        otel_context.detach(token)


def _stored_context() -> dict[str, str]:
    """The current span's context as W3C headers, for the run's opening event."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def _span_context_of(carrier: Any) -> SpanContext | None:
    """The span context stored by :func:`_stored_context`; None if there is none."""
    if not isinstance(carrier, dict):
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(carrier)
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


async def _previous_attempt(store: Any, run_id: str) -> SpanContext | None:
    """The workflow span of the run's latest earlier attempt, from its opening event."""
    from nestegg.checkpoint.views import Event

    found: SpanContext | None = None
    for record in await store.read_events(run_id, 0):
        if record.kind in (RUN_STARTED, RUN_RESUMED):
            found = _span_context_of(Event.from_record(record).data.get(TRACE_KEY)) or found
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
        }
        if self.capture:
            attributes[STEP_INPUT] = _json(execution.ctx.data)
        started = time.perf_counter()
        with _span(self.tracer, f"invoke_agent {agent.name}", attributes) as span:
            try:
                stop = await step(agent)
            except BaseException as error:
                _fail(span, error, STEP_OUTCOME)
                self._stepped(agent.name, seq, "failed", started)
                raise
            outcome = execution.last_outcome
            if span is not None:
                span.set_attribute(STEP_OUTCOME, outcome)
                checkpoint_id = _checkpoint_of(execution.recorder, seq)
                if checkpoint_id is not None:
                    span.set_attribute(CHECKPOINT_ID, checkpoint_id)
                if self.capture:
                    span.set_attribute(STEP_OUTPUT, _json(execution.ctx.data))
        self._stepped(agent.name, seq, outcome, started)
        return stop

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
            attributes[TOOL_ARGUMENTS] = _json({"args": arguments[0], "kwargs": arguments[1]})
        with _span(self.tracer, f"execute_tool {function}", attributes) as span:
            try:
                result = await execution.journaled(function, digest, replay, counted, rebuild)
            except BaseException as error:
                self._called(span, function, step, position, not executed)
                _fail(span, error)
                raise
            self._called(span, function, step, position, not executed)
            if span is not None and self.capture:
                span.set_attribute(TOOL_RESULT, _json(result))
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
    instruments = _meter_instruments()
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
    from nestegg.checkpoint.stores import _SCHEMES

    name = type(store).__name__
    return next((scheme for scheme, spec in _SCHEMES.items() if spec[1] == name), name)


# ------------------------------------------------------------------ run attempts

Opening = tuple[str, dict[str, Any]] | None
"""A run attempt's opening event (kind, payload), if it writes one."""


def traced_attempt(
    execute: Callable[..., Awaitable[T]],
) -> Callable[..., Awaitable[T]]:
    """Decorate ``RunBook._execute``: a checkpointed run attempt is an ``invoke_workflow``
    span whose trace context its opening event keeps (so that a resume, in any process,
    links to it)."""

    @functools.wraps(execute)
    async def attempt(
        book: Any, run: Any, execution: RunExecution, base: Any, kept: Any, event: Opening,
        *args: Any, **kwargs: Any,
    ) -> T:  # fmt: skip
        async def body(opening: Opening) -> T:
            return await execute(book, run, execution, base, kept, opening, *args, **kwargs)

        where = _Attempt(run.pipeline, book.clutch.strategy, book.store, run.fence)
        return await _attempt(execution, where, event, body)

    return attempt


def traced_drive(
    drive: Callable[..., Awaitable[T]],
) -> Callable[..., Awaitable[T]]:
    """Decorate ``Clutch._drive``: a run without checkpointing is an ``invoke_workflow``
    span too (a checkpointed one already is, see :func:`traced_attempt`)."""

    @functools.wraps(drive)
    async def driven(clutch: Any, execution: RunExecution, *args: Any, **kwargs: Any) -> T:
        if getattr(execution.recorder, "journals", False):
            return await drive(clutch, execution, *args, **kwargs)

        async def body(_: Opening) -> T:
            return await drive(clutch, execution, *args, **kwargs)

        return await _attempt(execution, _Attempt(clutch.name, clutch.strategy), None, body)

    return driven


@dataclass(frozen=True, slots=True)
class _Attempt:
    """What a run attempt's span says about where it runs."""

    pipeline: str
    strategy: Any
    store: Any = None
    fence: int | None = None

    def attributes(self, run_id: str, opening: Opening) -> dict[str, Any]:
        resumed = opening is not None and opening[0] == RUN_RESUMED
        name_key = AGENT_NAME if latest_conventions() else WORKFLOW_NAME
        attributes: dict[str, Any] = {
            OPERATION: "invoke_workflow",
            name_key: self.pipeline,
            CONVERSATION_ID: run_id,
            RUN_ID: run_id,
            RESUMED: resumed,
            STRATEGY: str(getattr(self.strategy, "value", self.strategy)),
        }
        if self.store is not None:
            attributes[STORE] = store_name(self.store)
        if self.fence is not None:
            attributes[FENCE] = self.fence
        checkpoint_id = opening[1].get("checkpoint_id") if resumed and opening else None
        if checkpoint_id is not None:
            attributes[CHECKPOINT_ID] = checkpoint_id
        return attributes


async def _attempt(
    execution: RunExecution,
    where: _Attempt,
    opening: Opening,
    body: Callable[[Opening], Awaitable[T]],
) -> T:
    """Run ``body`` as one attempt of ``execution``'s run, reported as configured."""
    run_id = execution.run_id
    resumed = opening is not None and opening[0] == RUN_RESUMED
    interrupted = resumed and opening is not None and opening[1].get("previous") == RUNNING
    tracer, instruments = _tracer(), _meter_instruments()
    reports = tracer is not None or instruments is not None or log.isEnabledFor(logging.DEBUG)
    if not reports and not log.isEnabledFor(logging.INFO):
        return await body(opening)
    if reports:
        execution.telemetry = RunTelemetry(tracer, instruments, run_id, where.pipeline)
    extra = {"run_id": run_id, "pipeline": where.pipeline}
    log.info("run %s of %s %s", run_id, where.pipeline, "resumed" if resumed else "started",
             extra=extra)  # fmt: skip
    links = []
    if tracer is not None and resumed and where.store is not None:
        previous = await _previous_attempt(where.store, run_id)
        links = [previous] if previous is not None else []
    status = "failed"
    name = f"invoke_workflow {where.pipeline}"
    with _span(tracer, name, where.attributes(run_id, opening), links) as span:
        if span is not None and opening is not None:
            opening = (opening[0], {**opening[1], TRACE_KEY: _stored_context()})
        try:
            result = await body(opening)
            status = "completed"
        except BaseException as error:
            status = "cancelled" if _cancelled(error) else "failed"
            if status == "failed":
                _fail(span, error)
            raise
        finally:
            _finished(span, instruments, where.pipeline, status, interrupted)
            log.info("run %s of %s %s", run_id, where.pipeline, status, extra=extra)
    return result


def _cancelled(error: BaseException) -> bool:
    import asyncio

    return isinstance(error, asyncio.CancelledError)


def _finished(
    span: Span | None,
    instruments: Instruments | None,
    pipeline: str,
    status: str,
    interrupted: bool,
) -> None:
    if span is not None:
        span.set_attribute(RUN_STATUS, status)
    if instruments is not None:
        instruments.runs.add(1, {WORKFLOW_NAME: pipeline, RUN_STATUS: status})
        if interrupted and status == "completed":
            instruments.recovered.add(1, {WORKFLOW_NAME: pipeline})
