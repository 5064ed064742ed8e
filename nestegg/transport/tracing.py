"""Traces and metrics across a caller and its workers: one run, one trace.

The caller's ``invoke_workflow {pipeline}`` span (around the run's hooks, publishing its
first step and waiting for its outcome) is the root of the run's trace; its context
travels in every step message (``StepMessage.trace``, W3C ``traceparent`` through the
OpenTelemetry propagation API), and a worker makes each step's ``invoke_agent {agent}``
span (with the ``execute_tool`` spans of its journaled calls) a child of it, whichever
worker takes the step and however often it is taken. The first worker keeps the context
in the run's ``run_started`` event too, for the messages that a sweep publishes again.

A worker records the step metrics (steps, step duration, commit duration, journaled calls)
and counts a run in ``nestegg.runs`` when one of its steps ends it, and in
``nestegg.runs.recovered`` when it took the run over from a worker that died during a
step; the caller's span says how the run ended but counts nothing (a run may end with no
caller waiting), but a run its ``on_request`` refused, which no worker sees.

Without a tracer provider, a meter provider or DEBUG logging on the ``nestegg`` logger,
nothing is built: no span, no context in messages (see :mod:`nestegg.telemetry`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from nestegg import otel, telemetry, telemetry_attempts
from nestegg.errors import RunFailedError
from nestegg.otel import ERROR_TYPE, FENCE, RESUMED, RUN_STATUS, STORE

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.clutch import Clutch
    from nestegg.execution import RunExecution
    from nestegg.transport.base import StepMessage

T = TypeVar("T")
Headers = dict[str, str]

log = logging.getLogger("nestegg")


async def traced_remote_run(
    clutch: Clutch, store: Any, run: RunRecord, body: Callable[[], Awaitable[T]]
) -> T:
    """Run ``body`` (the run's hooks around publishing its first step, with the current
    trace context, and waiting for the outcome) as the caller's ``invoke_workflow`` span,
    when a tracer is configured: from ``on_request`` on, as a local run's attempt."""
    tracer = otel.tracer()
    if tracer is None:
        return await body()
    where = telemetry_attempts.Attempt(clutch.name, clutch.strategy, store, run.fence)
    name = f"invoke_workflow {clutch.name}"
    with otel.span(tracer, name, where.attributes(run.run_id)) as span:
        assert span is not None
        try:
            result = await body()
        except RunFailedError as error:  # the run failed in a worker: its error's type
            cancelled = error.error_type == "CancelledError"
            if not cancelled:
                otel.fail(span, error)
                span.set_attribute(ERROR_TYPE, error.error_type)
            span.set_attribute(RUN_STATUS, "cancelled" if cancelled else "failed")
            raise
        except BaseException as error:
            status = telemetry.ended_by(error)
            if status == "failed":
                otel.fail(span, error)
            span.set_attribute(RUN_STATUS, status)
            raise
        span.set_attribute(RUN_STATUS, "completed")
    return result


def count_refused(run: RunRecord) -> None:
    """Count ``run``, refused by its caller's ``on_request``, as failed in ``nestegg.runs``:
    no worker ever sees it."""
    instruments = otel.meter_instruments()
    if instruments is not None:
        telemetry.RunTelemetry(None, instruments, run.run_id, run.pipeline).ended("failed")


class WorkerTelemetry:
    """What a worker reports of its steps: tracer, meter and DEBUG logging are looked up
    once, when the worker starts (after its module, which configures the SDK, is imported),
    so that a step without any costs one attribute check."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.tracer = otel.tracer()
        self.instruments = otel.meter_instruments()
        self.reports = (
            self.tracer is not None
            or self.instruments is not None
            or log.isEnabledFor(logging.DEBUG)
        )

    async def run_step(
        self,
        execution: RunExecution,
        message: StepMessage,
        fence: int,
        store: Any,
        step: Callable[[], Awaitable[T]],
        taken_over: bool = False,
    ) -> T:
        """Run ``step`` (one step of ``execution``, taken for ``message`` with the claim's
        ``fence``) reported as configured: its span a child of the trace the message
        carries. A step ``taken_over`` from an owner that died is marked
        ``nestegg.resumed=true`` and, when it ends without an error, counts its run as
        recovered (``nestegg.runs.recovered``), as a resumed attempt does locally."""
        if taken_over:
            seq = execution.seq + 1
            log.info(
                "run %r taken over at step %d: its owner's lease ran out",
                execution.run_id,
                seq,
                extra={"run_id": execution.run_id, "step": seq},
            )
        if not self.reports:
            return await step()
        reported = telemetry.RunTelemetry(
            self.tracer, self.instruments, execution.run_id, self.pipeline
        )
        if self.tracer is not None:
            reported.step_attributes = {FENCE: fence, STORE: telemetry.store_name(store)}
            if taken_over:
                reported.step_attributes[RESUMED] = True
        execution.telemetry = reported
        with otel.continue_trace(message.trace):
            result = await step()
        if taken_over:
            reported.recovered()
        return result


def run_ended(execution: RunExecution, status: str) -> None:
    """Count ``execution``'s run as ended with ``status`` when its step is reported."""
    if execution.telemetry is not None:
        execution.telemetry.ended(status)


async def trace_of(store: Any, run_id: str) -> Headers:
    """The trace context of a run, as kept in its opening event, for a message a sweep
    publishes again; empty when OpenTelemetry is not in use or none is kept."""
    if not otel.otel_loaded():
        return {}
    try:
        return await telemetry.stored_trace(store, run_id)
    except Exception as error:  # a sweep never fails for want of a trace
        log.warning("run %s: its trace context could not be read: %s", run_id, error,
                    extra={"run_id": run_id})  # fmt: skip
        return {}
