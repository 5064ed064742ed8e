"""The OpenTelemetry SDK set up for tests: in-memory span and metric exporters installed
as the global providers (and removed again), a span exporter that writes JSON lines for
child processes, and readers of what was exported."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import _internal as metrics_internal
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

TELEMETRY_ENV = "NESTEGG_TEST_TELEMETRY"
"""The folder where a child process that installs the SDK writes its spans and metrics."""


def spans_file(folder: Path, pid: int) -> Path:
    """Where the child process ``pid`` writes its spans."""
    return folder / f"spans-{pid}.jsonl"


def metrics_file(folder: Path, pid: int) -> Path:
    """Where the child process ``pid`` writes its metric points at exit."""
    return folder / f"metrics-{pid}.json"


def reset_globals() -> None:
    """Forget the global tracer and meter providers (as if no SDK had been configured)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    trace._PROXY_TRACER_PROVIDER = trace.ProxyTracerProvider()
    metrics_internal._METER_PROVIDER_SET_ONCE = Once()
    metrics_internal._METER_PROVIDER = None
    metrics_internal._PROXY_METER_PROVIDER = metrics_internal._ProxyMeterProvider()


@dataclass
class Sdk:
    """The installed SDK: what it exported so far."""

    spans: InMemorySpanExporter
    reader: InMemoryMetricReader

    def finished(self) -> list[ReadableSpan]:
        """The ended spans, in the order they ended."""
        return list(self.spans.get_finished_spans())

    def metrics(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Metric name -> [(attributes, value or histogram count)]."""
        return metric_points(self.reader)


def install_sdk(exporter: SpanExporter | None = None) -> Sdk:
    """Install a tracer provider (simple processor) and a meter provider as the globals."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter or memory))
    trace.set_tracer_provider(provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return Sdk(memory, reader)


def metric_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Metric name -> [(attributes, value or histogram count)] of what ``reader`` holds."""
    points: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = getattr(point, "count", None)
                    points.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return points


class JsonLinesSpanExporter(SpanExporter):
    """Appends each ended span to a file as one JSON line (flushed at once, so that what a
    killed process ended is in the file)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as out:
            for span in spans:
                out.write(json.dumps(span_dict(span)) + "\n")
        return SpanExportResult.SUCCESS


def span_dict(span: ReadableSpan) -> dict[str, Any]:
    """A span as plain JSON: name, ids (hex), parent, links, attributes, status."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent": f"{span.parent.span_id:016x}" if span.parent else None,
        "links": [
            {"trace_id": f"{link.context.trace_id:032x}", "span_id": f"{link.context.span_id:016x}"}
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
    }


def read_spans(path: Path) -> list[dict[str, Any]]:
    """The spans a :class:`JsonLinesSpanExporter` wrote."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
