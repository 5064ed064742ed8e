"""A run killed mid-step and resumed in another process, traced to files: the resumed
attempt links to the killed attempt's workflow span, replays the journaled call the
killed step made (``nestegg.journal.replayed=true``) and counts as a recovered run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.crash.harness import kill, wait_for
from tests.otel_sdk import read_spans

pytestmark = pytest.mark.crash
ROOT = Path(__file__).resolve().parents[2]


def child(tmp_path: Path, attempt: int, *extra: str) -> list[str]:
    """The command line of one attempt of the traced child."""
    return [
        sys.executable, "-m", "tests.crash.otel_child",
        "--store", str(tmp_path / "runs.db"),
        "--run-id", "r1",
        "--spans", str(tmp_path / "spans.jsonl"),
        "--metrics", str(tmp_path / f"metrics-{attempt}.json"),
        *extra,
    ]  # fmt: skip


def spawn_in_root(command: list[str]) -> subprocess.Popen[str]:
    """Start the child from the repository root (so that ``tests`` imports)."""
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [span for span in spans if span["name"] == name]


async def test_a_resumed_run_links_to_the_killed_attempt_and_marks_replayed_calls(
    tmp_path: Path,
) -> None:
    hang = tmp_path / "hanging"
    first = spawn_in_root(child(tmp_path, 1, "--hang-file", str(hang)))
    assert await wait_for(hang.exists, first), first.communicate()
    assert kill(first)
    killed = read_spans(tmp_path / "spans.jsonl")
    # the killed attempt ended step a and b's first call; its workflow span never ended
    assert [s["name"] for s in killed] == [
        "execute_tool tests.crash.otel_child.llm",
        "execute_tool tests.crash.otel_child.llm",
        "invoke_agent a",
        "execute_tool tests.crash.otel_child.llm",
    ]
    workflow_id, trace_id = killed[2]["parent"], killed[2]["trace_id"]

    second = spawn_in_root(child(tmp_path, 2))
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert json.loads(out) == {"a": "A1A2", "b": "B1B2", "c": "C1C2"}
    resumed = read_spans(tmp_path / "spans.jsonl")[len(killed) :]
    (workflow,) = named(resumed, "invoke_workflow traced")
    assert workflow["links"] == [{"trace_id": trace_id, "span_id": workflow_id}]
    assert workflow["attributes"]["nestegg.resumed"] is True
    assert workflow["attributes"]["nestegg.run.status"] == "completed"
    assert [s["name"] for s in resumed if s["name"].startswith("invoke_agent")] == [
        "invoke_agent b",
        "invoke_agent c",
    ]
    calls = [
        (s["attributes"]["gen_ai.tool.call.id"], s["attributes"]["nestegg.journal.replayed"])
        for s in named(resumed, "execute_tool tests.crash.otel_child.llm")
    ]
    assert calls == [("r1/2/0", True), ("r1/2/1", False), ("r1/3/0", False), ("r1/3/1", False)]
    metrics = json.loads((tmp_path / "metrics-2.json").read_text())
    assert [value for _, value in metrics["nestegg.runs.recovered"]] == [1]
    replayed = {str(p["nestegg.journal.replayed"]): v for p, v in metrics["nestegg.journal.calls"]}
    assert replayed == {"True": 1, "False": 3}
