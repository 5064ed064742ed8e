"""nestegg demo: a pipeline crashes hard (SIGKILL) mid-step, then resumes where it stopped.

Run it with ``make demo``. It uses the embedded default store (SQLite at
``$NESTEGG_HOME/nestegg.db``, by default ``~/.nestegg``), so ``nestegg runs`` shows the
demo's runs afterwards.

1. A child process runs a four-agent enrichment pipeline. Each agent asks a (fake,
   counting) LLM through ``nestegg.call``; every call and every step is committed.
2. In the middle of the third agent, after two of its LLM calls, the child kills itself
   with SIGKILL: no clean-up, no exception handler, like an OOM kill.
3. This process finds the interrupted run and resumes it: the completed steps and the two
   journaled calls are not paid for again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig

CALL_LOG = Path(os.environ.get("DEMO_CALL_LOG", Path(tempfile.gettempdir()) / "demo-calls.log"))

pipeline = Clutch(
    "enrichment-demo",
    strategy=Strategy.SEQUENTIAL,
    checkpoint=CheckpointConfig(),  # the embedded default store
)


async def fake_llm(prompt: str) -> str:
    """Stands in for a paid LLM call: it logs every call it is paid for."""
    with CALL_LOG.open("a") as log:
        log.write(f"{os.getpid()} {prompt}\n")
    await asyncio.sleep(0.01)
    return f"<answer to {prompt!r}>"


@pipeline.agent()
async def fetch(company: dict) -> dict:
    page = await nestegg.call(fake_llm, f"find the web page of {company['name']}")
    return {**company, "page": page}


@pipeline.agent()
async def summarize(data: dict) -> dict:
    summary = await nestegg.call(fake_llm, f"summarize {data['page']}")
    return {**data, "summary": summary}


@pipeline.agent()
async def classify(data: dict) -> dict:
    labels = []
    for question in ("industry", "size", "region", "risk"):
        labels.append(await nestegg.call(fake_llm, f"{question} of {data['name']}"))
        if len(labels) == 2 and os.environ.get("DEMO_CRASH") == "1":
            os.kill(os.getpid(), signal.SIGKILL)  # a hard crash in the middle of the step
    return {**data, "labels": labels}


@pipeline.agent()
async def report(data: dict) -> dict:
    verdict = await nestegg.call(fake_llm, f"write a one-line report on {data['name']}")
    return {"name": data["name"], "labels": data["labels"], "report": verdict}


def calls_made() -> list[str]:
    return CALL_LOG.read_text().splitlines() if CALL_LOG.exists() else []


async def child(run_id: str) -> None:
    await pipeline.run({"name": "Acme Corp"}, run_id=run_id, timeout=None)


def nestegg_command() -> str:
    """The nestegg command beside this Python (``.venv/bin/nestegg`` after ``make demo``),
    relative to the current directory when it is below it."""
    script = Path(sys.executable).parent / "nestegg"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


async def main() -> None:
    CALL_LOG.unlink(missing_ok=True)
    run_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    print(f"1. Running pipeline {pipeline.name!r} as run {run_id!r} in a child process...")
    env = {**os.environ, "DEMO_CRASH": "1", "DEMO_CALL_LOG": str(CALL_LOG)}
    child_process = subprocess.run(
        [sys.executable, __file__, "--child", run_id], env=env, check=False
    )
    killed = child_process.returncode == -signal.SIGKILL
    before = calls_made()
    print(
        f"   the child died by {'SIGKILL' if killed else child_process.returncode} "
        f"after {len(before)} LLM calls"
    )

    runs = {r.run_id: r for r in await pipeline.list_interrupted()}
    print(
        f"2. Interrupted runs found: {run_id in runs} (status {runs[run_id].status!r}, "
        f"{runs[run_id].steps} steps committed)"
        if run_id in runs
        else "2. (not found)"
    )

    print("3. Resuming it here...")
    result = await pipeline.resume_latest(run_id)
    after = calls_made()[len(before) :]
    full_run = len(before) + len(after)
    print(f"   result: {result}")
    print(
        f"   LLM calls made by the resume: {len(after)}; "
        f"a restart from scratch would have made {full_run}: "
        f"nestegg saved {full_run - len(after)} paid calls"
    )
    print("4. The event log of the run:")
    for event in await pipeline.events(run_id):
        print(f"   {event.seq:3d} {event.kind:17s} {dict(event.data)}")
    command = nestegg_command()
    print(f"Try: {command} runs   |   {command} show {run_id}")
    await pipeline.stop()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        asyncio.run(child(sys.argv[2]))
    else:
        asyncio.run(main())
