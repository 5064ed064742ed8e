"""nestegg with OpenTelemetry: a run's spans and metrics printed by the console exporters.

Needs ``pip install 'nestegg[otel]' opentelemetry-sdk``; run it with
``python examples/otel_console.py``.

A three-agent pipeline asks a (fake) LLM through ``nestegg.call``. Its first attempt fails
in the second agent, after that agent's first call; ``resume_latest`` continues it. The
console shows, as JSON, the ``invoke_workflow research`` span of each attempt (the second
one linked to the first), an ``invoke_agent`` span per step and an ``execute_tool`` span
per call: the call the resume served from the journal carries
``"nestegg.journal.replayed": true``. Then the metrics: steps, step durations, journaled
calls executed and replayed, store commit durations, runs by final status.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

import nestegg
from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage

resource = Resource.create({"service.name": "otel-console-example"})
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
trace.set_tracer_provider(tracer_provider)
reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000)
meter_provider = MeterProvider(resource=resource, metric_readers=[reader])
metrics.set_meter_provider(meter_provider)

failures = {"left": 1}


async def ask_llm(prompt: str) -> str:
    """A fake LLM: what a real client call would be."""
    await asyncio.sleep(0.01)
    return f"answer to {prompt!r}"


def build(store: SQLiteCheckpointStorage) -> Clutch:
    """The pipeline: plan, search (fails once after its first call), write."""
    clutch = Clutch("research", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def plan(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "plan": await nestegg.call(ask_llm, f"plan {data['topic']}")}

    @clutch.agent()
    async def search(data: dict[str, Any]) -> dict[str, Any]:
        first = await nestegg.call(ask_llm, "search 1")
        if failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("the search API timed out")
        return {**data, "found": [first, await nestegg.call(ask_llm, "search 2")]}

    @clutch.agent()
    async def write(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "report": await nestegg.call(ask_llm, "write the report")}

    return clutch


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteCheckpointStorage(Path(folder) / "runs.db")
        clutch = build(store)
        try:
            await clutch.run({"topic": "durable agents"}, run_id="research-1")
        except TimeoutError:
            pass  # the run is failed and resumable
        result = await clutch.resume_latest("research-1")
        await store.close()
    assert result["report"] == "answer to 'write the report'"


if __name__ == "__main__":
    asyncio.run(main())
    tracer_provider.shutdown()
    meter_provider.shutdown()  # exports the metrics once more, then stops
