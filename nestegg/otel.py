"""The OpenTelemetry side of :mod:`nestegg.telemetry`: whether an SDK is configured, the
tracer and metric instruments, spans, W3C trace context, and the attribute names (GenAI
semantic conventions and nestegg's own).

OpenTelemetry is imported only once the application has imported it: without that no SDK
can be configured, and nestegg spends nothing on it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from nestegg.journal import wide_ints

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram
    from opentelemetry.trace import Span, SpanContext, Tracer

SCOPE = "nestegg"

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


def otel_loaded() -> bool:
    """Whether the application imported OpenTelemetry (else no SDK can be configured)."""
    return "opentelemetry.trace" in sys.modules or "opentelemetry.metrics" in sys.modules


_tracers: list[tuple[object, Tracer]] = []


def tracer() -> Tracer | None:
    """nestegg's tracer when a tracer provider is configured; None otherwise."""
    if not otel_loaded():
        return None
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    for known, made in _tracers:
        if known is provider:
            return made
    from nestegg import __version__

    made = provider.get_tracer(SCOPE, __version__)
    _tracers[:] = [(provider, made)]  # a worker asks for it at every step
    return made


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


def meter_instruments() -> Instruments | None:
    """The instruments on the configured meter provider; None without one."""
    if not otel_loaded():
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
            "nestegg.runs.recovered",
            "{run}",
            "Interrupted runs resumed to completion, or taken over from a dead worker.",
        ),
    )
    _instruments[:] = [(provider, made)]
    return made


def to_json(value: Any) -> str:
    """``value`` as JSON text for a span attribute (what JSON cannot hold as its repr, an
    int past 64 bits as its digits in a string); a value it cannot write at all (its
    repr fails, it contains itself) as the text ``<not captured: ...>`` saying why:
    capturing content never fails a run."""
    try:
        try:
            return _dumps(value)
        except orjson.JSONEncodeError:  # an int past 64 bits, which orjson does not write
            return _dumps(wide_ints(value, _int_text))
    except Exception as error:
        return f"<not captured: {type(error).__qualname__}: {error}>"


def _dumps(value: Any) -> str:
    return orjson.dumps(value, default=repr, option=orjson.OPT_NON_STR_KEYS).decode()


def _int_text(value: int) -> str:
    """An int's decimal digits, as the codec stores an int past 64 bits; in hexadecimal
    (``0x...``) past the digits Python writes out."""
    try:
        return str(value)
    except ValueError:
        return f"{value:#x}"


def error_type(error: BaseException) -> str:
    return type(error).__qualname__


def fail(span: Span | None, error: BaseException, outcome_key: str | None = None) -> None:
    """Mark ``span`` as ended by ``error`` (status, ``error.type``, exception event, and
    ``failed`` under ``outcome_key``)."""
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute(ERROR_TYPE, error_type(error))
    if outcome_key is not None:
        span.set_attribute(outcome_key, "failed")
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{error_type(error)}: {error}"))


@contextmanager
def span(
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


def stored_context() -> dict[str, str]:
    """The current span's context as W3C headers, for the run's opening event."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def span_context_of(carrier: Any) -> SpanContext | None:
    """The span context stored by :func:`stored_context`; None if there is none."""
    if not isinstance(carrier, dict):
        return None
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = TraceContextTextMapPropagator().extract(carrier)
    span_context = trace.get_current_span(context).get_span_context()
    return span_context if span_context.is_valid else None


# ----------------------------------------------------------------- trace context


def inject_context() -> dict[str, str]:
    """The current trace context as message headers (W3C ``traceparent``, ...).

    A broker transport puts them in a message so that the worker that takes it continues
    the same trace (:func:`continue_trace`). Empty when no trace is under way or
    OpenTelemetry is not in use.
    """
    if not otel_loaded():
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract_context(carrier: Mapping[str, str]) -> Any:
    """The OpenTelemetry context that :func:`inject_context` headers carry; None when
    OpenTelemetry is not in use."""
    if not otel_loaded() or not carrier:
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
