"""The child program of the telemetry crash test: a checkpointed run traced to a file.

Run as ``python -m tests.crash.otel_child --store PATH --run-id R --spans FILE --metrics
FILE [--hang-file FILE]`` from the repository root. It installs the OpenTelemetry SDK with
an exporter that appends every ended span to ``--spans`` as a JSON line, then runs the
three-agent pipeline ``traced`` (``run()`` the first time, ``resume_latest()`` once the run
exists); each agent makes two journaled calls. With ``--hang-file``, agent ``b`` writes
that file after its first call and sleeps until it is killed. At the end it writes the
metric points to ``--metrics`` and prints the result as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from nestegg import Clutch, call
from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage
from tests.otel_sdk import JsonLinesSpanExporter, install_sdk

PIPELINE_NAME = "traced"
HANG_S = 60.0


async def llm(prompt: str) -> str:
    """The fake model."""
    return prompt.upper()


def build(store: SQLiteCheckpointStorage, hang_file: Path | None) -> Clutch:
    """Agents a, b and c, two journaled calls each; b hangs after its first with a file."""
    clutch = Clutch(PIPELINE_NAME, checkpoint=CheckpointConfig(storage=store))

    async def agent(name: str, data: dict[str, Any]) -> dict[str, Any]:
        first = await call(llm, f"{name}1")
        if name == "b" and hang_file is not None:
            hang_file.write_text("calling")
            await asyncio.sleep(HANG_S)
        return {**data, name: first + await call(llm, f"{name}2")}

    @clutch.agent()
    async def a(data: dict[str, Any]) -> dict[str, Any]:
        return await agent("a", data)

    @clutch.agent()
    async def b(data: dict[str, Any]) -> dict[str, Any]:
        return await agent("b", data)

    @clutch.agent()
    async def c(data: dict[str, Any]) -> dict[str, Any]:
        return await agent("c", data)

    return clutch


async def main(args: argparse.Namespace) -> int:
    """Run or resume the run; write the metrics; print the result."""
    sdk = install_sdk(JsonLinesSpanExporter(Path(args.spans)))
    store = SQLiteCheckpointStorage(args.store)
    clutch = build(store, Path(args.hang_file) if args.hang_file else None)
    try:
        if await store.get_run(args.run_id) is None:
            result = await clutch.run({}, run_id=args.run_id)
        else:
            result = await clutch.resume_latest(args.run_id)
    finally:
        await store.close()
    Path(args.metrics).write_text(json.dumps(sdk.metrics()))
    sys.stdout.write(json.dumps(result, sort_keys=True) + "\n")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line of the child."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="SQLite database file")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--spans", required=True, help="JSON-lines file of ended spans")
    parser.add_argument("--metrics", required=True, help="JSON file of the metric points")
    parser.add_argument("--hang-file", default=None, help="b writes it, then hangs")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args())))
