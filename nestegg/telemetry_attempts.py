"""Run attempts as ``invoke_workflow {pipeline}`` spans, counted in ``nestegg.runs`` (and,
for an interrupted run resumed to completion, in ``nestegg.runs.recovered``).

A checkpointed attempt (:func:`traced_attempt`) keeps its span's trace context in its
opening event, so that a later resume, in any process, links to it; a run without
checkpointing is a span too (:func:`traced_plain_run`). What a run's steps and journaled
calls report is :class:`nestegg.telemetry.RunTelemetry`'s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from nestegg import otel
from nestegg.constants import RUN_INTERRUPTED, RUN_RESUMED, TRACE_KEY
from nestegg.otel import (
    AGENT_NAME,
    CHECKPOINT_ID,
    CONVERSATION_ID,
    FENCE,
    OPERATION,
    RESUMED,
    RUN_ID,
    RUN_STATUS,
    STORE,
    STRATEGY,
    WORKFLOW_NAME,
    Instruments,
)
from nestegg.telemetry import (
    RunTelemetry,
    ended_by,
    latest_conventions,
    log,
    store_name,
    stored_trace,
)

if TYPE_CHECKING:
    from opentelemetry.trace import Span, SpanContext

    from nestegg.execution import RunExecution

__all__ = ["Attempt", "Opening", "traced_attempt", "traced_plain_run"]

T = TypeVar("T")

Opening = Sequence[tuple[str, dict[str, Any]]]
"""A run attempt's opening events (kind, payload), the last one opening it (none: a fork's
attempt, whose events its fork commit wrote)."""


def _last(events: Opening) -> tuple[str, dict[str, Any]] | None:
    return events[-1] if events else None


def traced_attempt(
    execute: Callable[..., Awaitable[T]],
) -> Callable[..., Awaitable[T]]:
    """Decorate ``CheckpointedRuns._attempt``: a checkpointed run attempt is an ``invoke_workflow``
    span whose trace context its opening event keeps (so that a resume, in any process,
    links to it)."""

    @functools.wraps(execute)
    async def attempt(
        book: Any, run: Any, execution: RunExecution, event: Opening, *args: Any, **kwargs: Any
    ) -> T:
        if not _reports():  # nothing wraps the attempt: one coroutine, no closure, per run
            return await execute(book, run, execution, event, *args, **kwargs)
        return await _traced(execute, book, run, execution, event, args, kwargs)

    return attempt


async def _traced(
    execute: Callable[..., Awaitable[T]],
    book: Any,
    run: Any,
    execution: RunExecution,
    event: Opening,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> T:
    """:func:`traced_attempt`'s attempt as a span. Apart, so that the attempt's own
    coroutine, alive as long as its run, holds no cells for this closure's variables."""

    async def body(opening: Opening) -> T:
        return await execute(book, run, execution, opening, *args, **kwargs)

    where = Attempt(run.pipeline, book.clutch.strategy, book.store, run.fence)
    return await _attempt(execution, where, event, body)


async def traced_plain_run(
    clutch: Any, execution: RunExecution, run: Callable[[], Awaitable[T]]
) -> T:
    """Run ``run`` (``Clutch.drive``'s work for a run without checkpointing) as an
    ``invoke_workflow`` span too (a checkpointed run's attempt already is one, see
    :func:`traced_attempt`: ``drive`` does not come here for it)."""
    if not _reports():
        return await run()

    async def body(_: Opening) -> T:
        return await run()

    return await _attempt(execution, Attempt(clutch.name, clutch.strategy), (), body)


def _reports() -> bool:
    """Whether a run attempt is reported at all (a span, a metric or a log line)."""
    enabled = log.isEnabledFor(logging.INFO)  # DEBUG included
    return enabled or otel.tracer() is not None or otel.meter_instruments() is not None


@dataclass(frozen=True, slots=True)
class Attempt:
    """What a run attempt's ``invoke_workflow`` span says about where it runs."""

    pipeline: str
    strategy: Any
    store: Any = None
    fence: int | None = None

    def attributes(self, run_id: str, events: Opening = ()) -> dict[str, Any]:
        """The span's attributes (``events``: the attempt's opening events)."""
        opening = _last(events)
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
    where: Attempt,
    events: Opening,
    body: Callable[[Opening], Awaitable[T]],
) -> T:
    """Run ``body`` as one attempt of ``execution``'s run, reported as configured."""
    run_id = execution.run_id
    opening = _last(events)
    resumed = opening is not None and opening[0] == RUN_RESUMED
    interrupted = resumed and any(kind == RUN_INTERRUPTED for kind, _ in events)
    tracer, instruments = otel.tracer(), otel.meter_instruments()
    reports = tracer is not None or instruments is not None or log.isEnabledFor(logging.DEBUG)
    if not reports and not log.isEnabledFor(logging.INFO):
        return await body(events)
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
    with otel.span(tracer, name, where.attributes(run_id, events), links) as span:
        if span is not None and opening is not None:
            traced = {**opening[1], TRACE_KEY: otel.stored_context()}
            events = [*events[:-1], (opening[0], traced)]
        try:
            result = await body(events)
            status = "completed"
        except BaseException as error:
            status = ended_by(error)
            if status == "failed":
                otel.fail(span, error)
            raise
        finally:
            _finished(span, instruments, where.pipeline, status, interrupted)
            log.info("run %s of %s %s", run_id, where.pipeline, status, extra=extra)
    return result


async def _previous_attempt(store: Any, run_id: str) -> SpanContext | None:
    """The workflow span of the run's latest earlier attempt, from its opening event."""
    try:
        return otel.span_context_of(await stored_trace(store, run_id))
    except Exception as error:  # a resume never fails for want of a link
        log.warning("run %s: no link to its earlier attempt: %s", run_id, error,
                    extra={"run_id": run_id})  # fmt: skip
        return None


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
