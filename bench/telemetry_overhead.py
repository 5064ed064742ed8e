"""What nestegg's telemetry costs per step: without OpenTelemetry, with the ``otel`` extra
installed and imported but no SDK, and with the SDK: traces only (a no-op exporter behind
a batch processor), metrics only (a reader that is never collected), and both.

Each configuration runs in its own process (the OpenTelemetry providers are global), the
five interleaved repetition by repetition; each process runs ``--steps`` checkpointed
ROUND_ROBIN steps three times after a warm-up run, on the memory store or on SQLite, and
reports the median time per step; the table shows the medians of those over the
processes. The ``worker`` row runs the same steps as a worker does (``StepRunner``, one
message per step, on the memory store, its messages on an in-process queue instead of a
broker), each run's first message carrying the caller's trace context when a tracer is
set. Needs the SDK (the dev extra):

    .venv/bin/python bench/telemetry_overhead.py [--steps 2000] [--reps 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import START_INPUT, Table, fmt_us, machine_markdown, median, next_message, print_tables

MODES = ("no otel", "api, no SDK", "SDK traces", "SDK metrics", "SDK, no-op exporter")
"""The last one: traces (no-op exporter) and metrics (a reader never collected)."""
STORES = ("memory", "sqlite", "worker")
RUNS_PER_PROCESS = 3


def install(mode: str) -> None:
    """Set up OpenTelemetry as ``mode`` says (in this process)."""
    if mode == MODES[0]:
        return
    from opentelemetry import metrics, trace  # imported, as by an application using it

    if mode == MODES[1]:
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class NoOpExporter(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    if mode != MODES[3]:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(NoOpExporter()))
        trace.set_tracer_provider(provider)
    if mode != MODES[2]:
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


async def seconds_per_step(store_kind: str, steps: int, folder: Path) -> float:
    """The median time per step of three runs of ``steps`` checkpointed steps (after a
    warm-up run)."""
    from nestegg import Clutch, Strategy
    from nestegg.checkpoint import (
        CheckpointConfig,
        CheckpointPolicy,
        MemoryCheckpointStorage,
        SQLiteCheckpointStorage,
    )

    if store_kind == "memory":
        store: MemoryCheckpointStorage | SQLiteCheckpointStorage = MemoryCheckpointStorage()
    else:
        store = SQLiteCheckpointStorage(folder / "runs.db")
    policy = CheckpointPolicy(every_n_steps=1, keep_latest=3, durability="sync")
    clutch = Clutch(
        "bench",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=store, policy=policy),
    )

    @clutch.agent()
    async def step(data):  # type: ignore[no-untyped-def]
        return next_message(data)

    await clutch.run(START_INPUT, run_id="warm-up")
    times = []
    for run in range(RUNS_PER_PROCESS):
        started = time.perf_counter()
        await clutch.run(START_INPUT, run_id=f"measured-{run}")
        times.append((time.perf_counter() - started) / steps)
    await store.close()
    return median(times)


class QueueDelivery:
    """A message taken from the in-process queue (acks and keep-alives cost nothing)."""

    def __init__(self, queue: asyncio.Queue[Any], message: Any) -> None:
        self.queue = queue
        self.message = message
        self.channel = ""
        self.redelivered = False

    async def ack(self) -> None:
        pass

    async def keep_alive(self) -> None:
        pass

    async def requeue(self) -> None:
        self.queue.put_nowait(self.message)

    async def forward(self, channel: str, message: Any) -> None:
        self.queue.put_nowait(message)


class QueueTransport:
    """The broker of the ``worker`` row: one in-process queue for every channel."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()

    async def publish(self, channel: str, message: Any) -> None:
        self.queue.put_nowait(message)

    def consume(self, channels: Any, *, hold: float, prefetch: int = 1) -> Any:
        raise NotImplementedError("the benchmark hands messages to the StepRunner itself")

    async def close(self) -> None:
        pass


async def worker_seconds_per_step(steps: int) -> float:
    """The median time per step of three runs of ``steps`` steps run one message at a
    time by a worker's StepRunner (after a warm-up run)."""
    from nestegg import Clutch, Strategy, otel
    from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage
    from nestegg.transport.caller import publish_first
    from nestegg.transport.steps import StepRunner

    transport = QueueTransport()
    clutch = Clutch(
        "bench",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=steps,
        checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()),
    )

    @clutch.agent()
    async def step(data):  # type: ignore[no-untyped-def]
        return next_message(data)

    runner = StepRunner(clutch, transport, frozenset(clutch.agent_names))

    async def one_run(run_id: str) -> float:
        run = await runner.book.create_queued(START_INPUT, run_id)
        with otel.span(otel.tracer(), "caller", {}):
            await publish_first(clutch, transport, run, otel.inject_context())
        started = time.perf_counter()
        while not transport.queue.empty():
            await runner.handle(QueueDelivery(transport.queue, transport.queue.get_nowait()))
        return (time.perf_counter() - started) / steps

    await one_run("warm-up")
    times = [await one_run(f"measured-{run}") for run in range(RUNS_PER_PROCESS)]
    return median(times)


def child(mode: str, store_kind: str, steps: int) -> None:
    install(mode)
    if store_kind == "worker":
        print(json.dumps(asyncio.run(worker_seconds_per_step(steps))))
        return
    with tempfile.TemporaryDirectory(prefix="nestegg-bench-") as folder:
        print(json.dumps(asyncio.run(seconds_per_step(store_kind, steps, Path(folder)))))


def measure(mode: str, store_kind: str, steps: int) -> float:
    command = [sys.executable, __file__, "--child", mode, "--store", store_kind]
    done = subprocess.run(
        [*command, "--steps", str(steps)], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--store", choices=STORES, default="memory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.store, args.steps)
        return
    samples: dict[tuple[str, str], list[float]] = {}
    for rep in range(args.reps):
        for store_kind in STORES:
            order = MODES if rep % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                seconds = measure(mode, store_kind, args.steps)
                samples.setdefault((store_kind, mode), []).append(seconds)
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)
    table = Table(
        f"Per-step time with telemetry ({args.steps} checkpointed steps, medians of "
        f"{args.reps} processes each)",
        ["store", *MODES],
        notes=["µs per step; in parentheses: the difference from `no otel`"],
    )
    for store_kind in STORES:
        medians = [median(samples[(store_kind, mode)]) for mode in MODES]
        table.rows.append([store_kind, fmt_us(medians[0])] + [
            f"{fmt_us(value)} ({(value - medians[0]) * 1e6:+.1f})" for value in medians[1:]
        ])  # fmt: skip
    print(machine_markdown())
    print_tables([table])


if __name__ == "__main__":
    main()
