"""runs, show, checkpoints, inspect, diff and events against stores filled by real runs."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from nestegg import Clutch, Handover, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores import open_store
from nestegg.cli.paths import PathNotFoundError, select
from nestegg.constants import EXIT_NOT_FOUND, EXIT_USAGE, STEP_BLOCK_STEPS
from nestegg.errors import CheckpointFallbackWarning
from nestegg.testing.builders import T0, create
from tests.checkpoint.conftest import Tamper
from tests.cli.conftest import (
    Cli,
    Filled,
    alter,
    damage_newest_event_batch,
    fill,
    json_of,
    leave_waiting,
    queue,
    store_url_for,
    tear,
)
from tests.cli.pipeline_app import POLICY, build
from tests.cli.selector_app import fail_in_the_selector
from tests.stores.test_sqlite_blocks import rewrite_block

RUN_KEYS = {
    "run_id", "pipeline", "status", "interrupted", "queued", "steps", "last_checkpoint",
    "created_at", "updated_at", "owner", "lease_until", "fence", "parent_run",
    "parent_checkpoint", "error", "waits_for", "cancelled_by",
}  # fmt: skip


def _iso(text: str) -> datetime:
    return datetime.fromisoformat(text)


def test_runs_lists_every_run_with_status_and_last_checkpoint(cli: Cli, filled_any: Filled) -> None:
    rows = json_of(cli("--store", filled_any.url, "runs", "--json", "--pipeline", "cli-test"))
    by_id = {row["run_id"]: row for row in rows}
    assert {filled_any.ok, filled_any.bad, filled_any.gone} <= set(by_id)
    assert all(set(row) == RUN_KEYS for row in rows)
    ok, bad, gone = by_id[filled_any.ok], by_id[filled_any.bad], by_id[filled_any.gone]
    assert (ok["status"], ok["steps"], ok["interrupted"]) == ("completed", 3, False)
    assert ok["last_checkpoint"]["seq"] == 3
    assert _iso(ok["updated_at"]).tzinfo is not None
    assert (bad["status"], bad["steps"]) == ("failed", 1)
    assert bad["error"] == {"type": "RuntimeError", "message": "enrich broke", "agent": "enrich",
                            "seq": 2}  # fmt: skip
    assert (gone["status"], gone["interrupted"]) == ("running", True)


def test_runs_filters(cli: Cli, filled: Filled) -> None:
    def ids(*args: str) -> list[str]:
        return [r["run_id"] for r in json_of(cli("runs", "--store", filled.url, "--json", *args))]

    assert ids("--status", "completed") == [filled.ok]
    assert ids("--status", "failed") == [filled.bad]
    assert ids("--interrupted") == [filled.gone]
    assert ids("--status", "interrupted") == [filled.gone]  # as the table shows it
    assert ids("--status", "running", "--interrupted") == [filled.gone]
    assert ids("--pipeline", "other") == []
    assert len(ids("--limit", "2")) == 2
    assert ids() == [filled.gone, filled.bad, filled.ok]  # newest first


def test_a_run_queued_for_workers_is_shown_queued_as_cancel_calls_it(
    cli: Cli, filled: Filled
) -> None:
    url = filled.url
    asyncio.run(queue(url, "q1"))

    def ids(*args: str) -> list[str]:
        return [r["run_id"] for r in json_of(cli("runs", "--store", url, "--json", *args))]

    rows = {row["run_id"]: row for row in json_of(cli("runs", "--store", url, "--json"))}
    assert (rows["q1"]["status"], rows["q1"]["interrupted"], rows["q1"]["queued"]) == (
        "running",
        False,
        True,
    )
    assert (rows[filled.gone]["interrupted"], rows[filled.gone]["queued"]) == (True, False)
    table = {line.split()[0]: line.split() for line in cli("runs", "-s", url).stdout.splitlines()}
    assert table["q1"][2] == "queued" and table[filled.gone][2] == "interrupted"
    assert ids("--status", "queued") == ["q1"]
    assert ids("--interrupted") == ids("--status", "interrupted") == [filled.gone]
    assert ids("--status", "running") == ["q1", filled.gone]  # as stored
    shown = cli("show", "q1", "-s", url).stdout.splitlines()
    assert "status:   queued" in shown
    assert json_of(cli("show", "q1", "--json", "-s", url))["run"]["queued"] is True
    cancelled = cli("cancel", "q1", "-s", url)
    assert cancelled.stdout == "run q1 cancelled (was queued for workers)\n"
    after = json_of(cli("show", "q1", "--json", "-s", url))["run"]
    assert after["owner"] is None and after["cancelled_by"]["pid"] == os.getpid()  # none ran it


def test_runs_table_is_plain_text_in_a_pipe(cli: Cli, filled: Filled) -> None:
    result = cli("runs", "--store", filled.url)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RUN", "PIPELINE", "STATUS", "STEPS", "LAST", "CHECKPOINT",
                                "UPDATED", "OWNER"]  # fmt: skip
    assert "\x1b[" not in result.stdout and "│" not in result.stdout
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows[filled.gone][2] == "interrupted"
    assert rows[filled.ok][2:4] == ["completed", "3"]


async def _create(url: str) -> None:
    store = open_store(url)
    await store.setup()
    await store.close()


def test_runs_of_an_empty_store(cli: Cli, local_url: str) -> None:
    asyncio.run(_create(local_url))
    result = cli("runs", "--store", local_url)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "no runs\n")


def test_store_from_environment(cli: Cli, filled: Filled) -> None:
    rows = json_of(cli("runs", "--json", NESTEGG_STORE=filled.url))
    assert len(rows) == 3


def test_runs_after_the_demo_shows_its_runs_without_store(cli: Cli) -> None:
    home = cli.env["NESTEGG_HOME"]
    assert home is not None
    os.environ["NESTEGG_HOME"] = home  # as the demo process would have it
    try:
        clutch = build("enrichment-demo", CheckpointConfig(policy=POLICY))  # the default store

        async def demo() -> None:
            await clutch.run({"name": "Acme Corp"}, run_id="demo-run")
            await clutch.stop()

        asyncio.run(demo())
    finally:
        del os.environ["NESTEGG_HOME"]
    result = cli("runs")
    assert result.exit_code == 0, result.stderr
    assert "demo-run" in result.stdout and "enrichment-demo" in result.stdout


def test_show_summary_and_timeline(cli: Cli, filled: Filled) -> None:
    result = cli("show", filled.bad, "--store", filled.url)
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    assert "status:   failed" in text and "error:    RuntimeError: enrich broke" in text
    timeline = text.split("timeline\n", 1)[1].splitlines()
    assert timeline[0].split() == ["STEP", "AGENT", "STARTED", "DURATION", "OUTCOME", "CHECKPOINT"]
    assert timeline[1].split()[:2] == ["1", "fetch"] and "completed" in timeline[1]
    failed = timeline[2].split()  # the failed step shows when it started and how long it ran
    assert failed[:2] == ["2", "enrich"] and failed[2] != "-" and failed[-1] == "failed"


class Ticket(BaseModel):
    id: int


async def _fail_with_model_error(url: str) -> None:
    """Run 'typed' of a pipeline whose agent's model refuses the input: failed with
    pydantic's message of several lines."""
    store = open_store(url)
    clutch = Clutch("typed", checkpoint=CheckpointConfig(storage=store, policy=POLICY))

    @clutch.agent()
    async def classify(ticket: Ticket) -> Ticket:
        return ticket

    try:
        with pytest.raises(ValidationError):
            await clutch.run({"id": "notint\x1b[2J"}, run_id="typed")
    finally:
        await store.close()


def test_show_prints_an_error_of_several_lines_indented_under_its_first(
    cli: Cli, local_url: str
) -> None:
    asyncio.run(_fail_with_model_error(local_url))
    text = cli("show", "typed", "--store", local_url).stdout
    lines = text.split("timeline\n", 1)[0].splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert lines[at] == "error:    ValidationError: 1 validation error for Ticket"
    assert lines[at + 1] == "          id"
    assert lines[at + 2].startswith(
        "            Input should be a valid integer, unable to parse string as an integer "
        "[type=int_parsing, input_value='notint\\x1b[2J', input_type=str]"  # escaped
    )
    assert lines[at + 3].startswith("              For further information visit ")
    stored = json_of(cli("show", "typed", "--store", local_url, "--json"))["run"]["error"]
    assert stored["message"].startswith("1 validation error for Ticket\nid\n  Input should")


def test_show_json(cli: Cli, filled_any: Filled) -> None:
    details = json_of(cli("show", filled_any.ok, "--store", filled_any.url, "--json"))
    assert set(details) == {"run", "forks", "forks_complete", "input", "result",
                            "steps_before", "steps", "initial_checkpoints", "checkpoints",
                            "failed_step", "step_in_flight"}  # fmt: skip
    assert (details["forks"], details["forks_complete"]) == ([], True)
    assert details["input"] == {"name": "Acme"}
    assert details["result"]["report"] == "Acme: 3 items"
    assert [s["agent"] for s in details["steps"]] == ["fetch", "enrich", "report"]
    assert all(len(s["checkpoints"]) == 1 for s in details["steps"])
    assert details["failed_step"] is None
    failed = json_of(cli("show", filled_any.bad, "--store", filled_any.url, "--json"))
    started, duration = failed["failed_step"].pop("started"), failed["failed_step"].pop("duration")
    assert failed["failed_step"] == {"type": "RuntimeError", "message": "enrich broke",
                                     "agent": "enrich", "hook": None, "seq": 2}  # fmt: skip
    assert started is not None and duration >= 0
    assert "traceback" in failed["run"]["error"]


def test_show_keeps_the_last_steps_unless_all(cli: Cli, local_url: str) -> None:
    async def long_run() -> None:
        store = open_store(local_url)
        policy = CheckpointPolicy(keep_latest=2)
        clutch = Clutch("cli-long", strategy=Strategy.ROUND_ROBIN, max_turns=40,
                        checkpoint=CheckpointConfig(storage=store, policy=policy))  # fmt: skip

        @clutch.agent()
        async def tick(n: int) -> int:
            return n + 1

        assert await clutch.run(0, run_id="long") == 40
        await store.close()

    asyncio.run(long_run())
    text = cli("show", "long", "--store", local_url).stdout
    assert "(10 earlier steps not shown; --all shows them)" in text
    steps = text.split("timeline\n", 1)[1].splitlines()[1:]
    assert len(steps) == 30 and steps[0].split()[0] == "11" and steps[-1].split()[0] == "40"
    every = cli("show", "long", "--store", local_url, "--all").stdout
    assert len(every.split("timeline\n", 1)[1].splitlines()) == 41
    details = json_of(cli("show", "long", "--store", local_url, "--json"))
    assert len(details["steps"]) == 40
    assert [len(s["checkpoints"]) for s in details["steps"]][-3:] == [0, 1, 1]


def test_show_lists_the_newest_forks_unless_all(cli: Cli, local_url: str) -> None:
    async def forked() -> None:
        store = open_store(local_url)
        await create(store, run_id="p", pipeline="cli-test", created_at=T0)
        for i in range(35):
            fork = {"parent_run": "p", "parent_checkpoint": f"c{i:02d}", "status": "completed"}
            await create(store, run_id=f"f{i:02d}", pipeline="cli-test", created_at=T0 + 1 + i,
                         **fork)  # fmt: skip
        await store.close()

    asyncio.run(forked())
    summary = cli("show", "p", "--store", local_url).stdout.split("timeline\n", 1)[0]
    lines = summary.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("forks:"))
    assert lines[at] == "forks:    f34 at c34 (completed)"
    assert lines[at + 29] == "          f05 at c05 (completed)"
    assert lines[at + 30] == "          (5 more; --all lists them)"
    assert lines[at + 31].startswith("input:")
    every = cli("show", "p", "--store", local_url, "--all").stdout.split("timeline\n", 1)[0]
    assert every.count(" at c") == 35 and "more; --all" not in every
    details = json_of(cli("show", "p", "--store", local_url, "--json"))
    assert [f["run_id"] for f in details["forks"]] == [f"f{i:02d}" for i in range(34, -1, -1)]
    assert details["forks"][0] == {
        "run_id": "f34", "checkpoint": "c34", "status": "completed", "interrupted": False,
        "queued": False, "created_at": datetime.fromtimestamp(T0 + 35, UTC).isoformat(),
    }  # fmt: skip
    assert details["forks_complete"] is True
    fork = cli("show", "f00", "--store", local_url).stdout
    assert "forked from: p at c00" in fork and "forks:" not in fork


def test_checkpoints(cli: Cli, filled: Filled) -> None:
    rows = json_of(cli("checkpoints", filled.ok, "--store", filled.url, "--json"))
    assert [r["seq"] for r in rows] == [1, 2, 3]
    assert [r["turn"] for r in rows] == [1, 2, 3]
    assert all(r["valid"] and r["reason"] == "policy" and r["run_id"] == filled.ok for r in rows)
    table = cli("checkpoints", filled.ok, "--store", filled.url).stdout.splitlines()
    assert table[0].split() == ["CHECKPOINT", "STEP", "TURN", "REASON", "CREATED", "NEXT", "CHECK"]
    assert table[1].split()[0] == rows[0]["checkpoint_id"]


def test_checkpoints_marks_damaged_those_resting_on_an_altered_step_record(
    cli: Cli, filled: Filled, tmp_path: Path
) -> None:
    before = cli("checkpoints", filled.ok, "--store", filled.url).stdout.splitlines()

    async def alter_step_2() -> None:
        store = open_store(filled.url)
        try:
            [record] = [s for s in await store.load_steps(filled.ok) if s.seq == 2]
            altered = record.body.replace(b'"items":[1,2,3]', b'"items":[1,2,4]')
            assert altered != record.body
            kind = "sqlite" if filled.url.startswith("sqlite") else "file"
            await Tamper(kind, store, tmp_path).step_body(filled.ok, 2, altered)
        finally:
            await store.close()

    asyncio.run(alter_step_2())
    after = cli("checkpoints", filled.ok, "--store", filled.url)
    assert after.exit_code == 0, after.stderr
    header, first, second, third = before
    assert [line.split()[-1] for line in (first, second, third)] == ["ok", "ok", "ok"]
    pad = len("DAMAGED") - len("CHECK")  # the column widens
    expected = [header + " " * pad, first, second[:-2] + "DAMAGED", third[:-2] + "DAMAGED"]
    assert [line.rstrip() for line in after.stdout.splitlines()] == [
        line.rstrip() for line in expected
    ]
    rows = json_of(cli("checkpoints", filled.ok, "--store", filled.url, "--json"))
    assert [(r["seq"], r["valid"]) for r in rows] == [(1, True), (2, False), (3, False)]
    steps = json_of(cli("show", filled.ok, "--store", filled.url, "--json"))["steps"]
    assert [s["outcome"] for s in steps] == ["completed", "damaged", "completed"]
    with pytest.warns(CheckpointFallbackWarning, match="skipping 2 damaged checkpoints"):
        resumed = cli("inspect", filled.ok, "--store", filled.url, "--path", "seq")
    assert resumed.stdout.strip() == "1"  # a resume falls back to checkpoint 1, as listed


def _lose_the_last_step(filled: Filled) -> None:
    """Remove the record of run ``ok``'s last step (3): its SQLite row deleted, or the end of
    the file store's step log cut off (as a torn last write leaves it)."""
    if filled.url.startswith("sqlite"):
        with sqlite3.connect(filled.url.removeprefix("sqlite:///")) as conn:
            deleted = conn.execute("DELETE FROM steps WHERE agent = 'report'").rowcount
        assert deleted == 1
    else:
        log = Path(filled.url.removeprefix("file://")) / "runs" / filled.ok / "steps.log"
        log.write_bytes(log.read_bytes()[:-40])


def test_show_lists_a_step_whose_record_is_missing(cli: Cli, filled: Filled) -> None:
    _lose_the_last_step(filled)
    shown = cli("show", filled.ok, "--store", filled.url)
    assert shown.exit_code == 0, shown.stderr  # as for a step that fails its checksum
    assert "steps:    3" in shown.stdout
    timeline = shown.stdout.split("timeline\n", 1)[1].splitlines()[1:]
    assert [line.split()[:2] for line in timeline] == [["1", "fetch"], ["2", "enrich"], ["3", "?"]]
    assert timeline[2].split()[2:5] == ["-", "-", "missing"]
    steps = json_of(cli("show", filled.ok, "--store", filled.url, "--json"))["steps"]
    assert [(s["seq"], s["agent"], s["outcome"]) for s in steps] == [
        (1, "fetch", "completed"),
        (2, "enrich", "completed"),
        (3, "?", "missing"),
    ]
    assert steps[2]["checkpoints"]  # the checkpoint after it, which rests on it
    rows = json_of(cli("checkpoints", filled.ok, "--store", filled.url, "--json"))
    assert [r["valid"] for r in rows] == [True, True, False]


def test_inspect_whole_state_and_a_path(cli: Cli, filled_any: Filled) -> None:
    url = filled_any.url
    rows = json_of(cli("checkpoints", filled_any.ok, "--store", url, "--json"))
    state = json_of(cli("inspect", rows[1]["checkpoint_id"], "--store", url, "--json"))
    assert state["data"] == {"name": "Acme", "page": "page of Acme", "items": [1, 2, 3],
                             "tags": {"size": "big"}}  # fmt: skip
    assert (state["seq"], state["turn"], state["source"]) == (2, 2, "enrich")
    assert [h["source"] for h in state["history"]] == ["input", "fetch"]
    assert json_of(cli("inspect", rows[1]["checkpoint_id"], "--store", url, "--path",
                       "data.items[1]")) == 2  # fmt: skip
    assert json_of(cli("inspect", filled_any.ok, "--store", url, "--path", "data.report")) == (
        "Acme: 3 items"
    )
    assert json_of(cli("inspect", filled_any.ok, "--store", url, "--path", "data.items.0")) == 1


def test_a_missing_path_names_ten_keys_of_the_dict_and_counts_the_others() -> None:
    state = {"data": {f"k{n}": n for n in range(12)}, "turn": 1}
    with pytest.raises(PathNotFoundError) as missing:
        select(state, "data.nope")
    named = ", ".join(f"k{n}" for n in range(10))
    assert str(missing.value) == f"no 'data.nope' in the state (data has keys {named} and 2 more)"
    with pytest.raises(PathNotFoundError, match=r"\(the state has keys data, turn\)$"):
        select(state, "nope")


def test_inspect_errors(cli: Cli, filled: Filled) -> None:
    missing = cli("inspect", filled.ok, "--store", filled.url, "--path", "data.nope")
    assert missing.exit_code == EXIT_NOT_FOUND
    assert missing.stderr.startswith("error: no 'data.nope' in the state")
    bad = cli("inspect", filled.ok, "--store", filled.url, "--path", "data[")
    assert bad.exit_code == EXIT_USAGE and bad.stderr.startswith("error: bad --path")
    nothing = cli("inspect", "no-such-checkpoint", "--store", filled.url)
    assert nothing.exit_code == EXIT_NOT_FOUND
    assert nothing.stderr == "error: no checkpoint or run 'no-such-checkpoint' in the store\n"


def test_diff(cli: Cli, filled_any: Filled) -> None:
    url = filled_any.url
    first, _, last = (
        r["checkpoint_id"] for r in json_of(cli("checkpoints", filled_any.ok, "-s", url, "--json"))
    )
    report = json_of(cli("diff", first, last, "--store", url, "--json"))
    assert (report["old"], report["new"]) == (first, last)
    added = {a["path"]: a["value"] for a in report["added"]}
    assert added["data.items"] == [1, 2, 3] and added["data.report"] == "Acme: 3 items"
    assert "history[2]" in added
    changed = {c["path"]: (c["old"], c["new"]) for c in report["changed"]}
    assert changed["turn"] == (1, 3) and changed["source"] == ("fetch", "report")
    assert report["removed"] == []
    text = cli("diff", first, last, "--store", url, "--path", "data").stdout.splitlines()
    assert text == ["+ items: [1,2,3]", '+ tags: {"size":"big"}', '+ report: "Acme: 3 items"']
    same = cli("diff", first, first, "--store", url)
    assert (same.exit_code, same.stdout) == (0, "no differences\n")


def test_events(cli: Cli, filled_any: Filled) -> None:
    result = cli("events", filled_any.ok, "--store", filled_any.url, "--json")
    assert result.exit_code == 0
    events = [orjson.loads(line) for line in result.stdout.splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_completed"
    assert kinds.count("step_completed") == 3 and kinds.count("checkpoint_saved") == 3
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert set(events[0]) == {"run_id", "seq", "at", "kind", "data"}
    later = cli("events", filled_any.ok, "--store", filled_any.url, "--since", "9", "--json")
    assert [orjson.loads(line)["seq"] for line in later.stdout.splitlines()] == [10, 11]
    text = cli("events", filled_any.ok, "--store", filled_any.url).stdout.splitlines()
    assert "step_completed" in text[2] and "agent=fetch" in text[2]
    # the event stores the seq alone; its agent, outcome and duration come from the step
    assert text[2].split()[4:7] == ["seq=1", "agent=fetch", "outcome=completed"]
    assert text[2].split()[7].startswith("duration=")
    completed = [e["data"] for e in events if e["kind"] == "step_completed"]
    assert [list(data) for data in completed] == [["seq", "agent", "outcome", "duration"]] * 3
    failed = cli("events", filled_any.bad, "--store", filled_any.url).stdout.splitlines()
    [line] = [line for line in failed if "step_failed" in line]
    # its start a time of day as the line's own, not UNIX seconds in 6 digits (1.79567e+09)
    [started] = [word for word in line.split() if word.startswith("started=")]
    assert re.fullmatch(r"started=\d{4}-\d\d-\d\d", started), line
    assert re.search(r"started=\S+ \d\d:\d\d:\d\d\.\d{3} ", line), line


def test_events_follow_until_the_run_finishes(cli: Cli, local_url: str) -> None:
    """A run goes on in another thread while --follow polls; it ends with the run."""
    store = open_store(local_url)
    gate = threading.Event()

    async def slow_run() -> None:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))

        @clutch.agent()
        async def wait_a_bit(data: dict) -> dict:
            gate.set()
            await asyncio.sleep(0.6)
            return data

        await clutch.run({"name": "Slow"}, run_id="slow", timeout=20)
        await store.close()

    worker = threading.Thread(target=lambda: asyncio.run(slow_run()))
    worker.start()
    assert gate.wait(10)
    started = time.monotonic()
    result = cli("events", "slow", "--store", local_url, "--follow", "--poll-interval", "0.05")
    worker.join(20)
    assert result.exit_code == 0, result.stderr
    kinds = [line.split()[3] for line in result.stdout.splitlines()]
    assert kinds[0] == "run_started" and kinds[-1] == "run_completed"
    assert kinds.count("step_completed") == 4
    completed = [line for line in result.stdout.splitlines() if "step_completed" in line]
    assert all(" agent=" in line and " outcome=" in line for line in completed)
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("command", ["show", "checkpoints", "events"])
def test_unknown_run_is_not_found(cli: Cli, filled: Filled, command: str) -> None:
    result = cli(command, "nope", "--store", filled.url)
    assert result.exit_code == EXIT_NOT_FOUND
    assert result.stderr == "error: no run 'nope' in the store\n"
    assert result.stdout == ""


ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("columns", [60, 100])
def test_terminal_output_fits_the_width(cli: Cli, filled: Filled, columns: int) -> None:
    terminal = {"TTY_COMPATIBLE": "1", "COLUMNS": str(columns), "TERM": "xterm-256color"}
    for args in (["runs"], ["show", filled.bad], ["checkpoints", filled.ok]):
        result = cli(*args, "--store", filled.url, **terminal)
        assert result.exit_code == 0, result.stderr
        lines = [ANSI.sub("", line) for line in result.stdout.splitlines()]
        assert "─" in result.stdout  # a rich table, not the plain one
        assert max(len(line) for line in lines) <= columns, "\n".join(lines)
    runs = ANSI.sub("", cli("runs", "--store", filled.url, **terminal).stdout)
    assert "interrupted" in runs and filled.gone in runs
    state = cli("inspect", filled.ok, "--store", filled.url, "--path", "data", **terminal)
    assert "\x1b[" in state.stdout  # highlighted
    assert json_of(cli("inspect", filled.ok, "-s", filled.url, "--json", "--path", "data",
                       **terminal))["name"] == "Acme"  # fmt: skip


def test_show_marks_the_steps_of_a_block_with_a_damaged_head(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "long.db"
    url = f"sqlite:///{path}"

    async def long_run() -> None:
        store = open_store(url)
        clutch = Clutch("cli-long", strategy=Strategy.ROUND_ROBIN, max_turns=STEP_BLOCK_STEPS + 9,
                        checkpoint=CheckpointConfig(storage=store))  # fmt: skip

        @clutch.agent()
        async def tick(n: int) -> int:
            return n + 1

        await clutch.run(0, run_id="long")
        await store.close()

    asyncio.run(long_run())
    rewrite_block(path, "head", 30)
    details = json_of(cli("show", "long", "--store", url, "--all", "--json"))
    outcomes = [(s["seq"], s["agent"], s["outcome"]) for s in details["steps"]]
    assert outcomes[:STEP_BLOCK_STEPS] == [(n, "?", "damaged") for n in range(1, 257)]
    assert {outcome for _, _, outcome in outcomes[STEP_BLOCK_STEPS:]} == {"completed"}
    assert len(outcomes) == STEP_BLOCK_STEPS + 9
    text = cli("show", "long", "--store", url).stdout
    shown = text.split("timeline\n", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in shown] == [str(n) for n in range(236, 266)]
    assert "damaged" in shown[0] and "damaged" not in shown[-1]


def test_a_step_the_selector_failed_names_the_selector(cli: Cli, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'picked.db'}"
    asyncio.run(fail_in_the_selector(open_store(url), "picked"))
    failed = {"type": "LookupError", "message": "no route at n=1", "agent": None,
              "hook": "selector", "seq": 2}  # fmt: skip
    details = json_of(cli("show", "picked", "--store", url, "--json"))
    step = details["failed_step"]
    assert step.pop("started") is not None and step.pop("duration") >= 0
    assert step == failed
    assert json_of(cli("runs", "--store", url, "--json"))[0]["error"] == failed
    timeline = cli("show", "picked", "--store", url).stdout.split("timeline\n", 1)[1]
    row = timeline.splitlines()[-1].split()
    assert (row[:2], row[-1]) == (["2", "selector"], "failed")


def _next_cells(cli: Cli, url: str, run_id: str) -> list[str]:
    """The NEXT cells of ``nestegg checkpoints RUN``, oldest checkpoint first."""
    result = cli("checkpoints", run_id, "--store", url)
    assert result.exit_code == 0, result.stderr
    header, *lines = result.stdout.splitlines()
    where = header.index("NEXT")
    return [line[where : line.index(" ok", where)].strip() for line in lines]


ENDED = "none, the run ended after this step"


def _appender(name: str, hands_over: bool) -> Any:
    async def agent(data: list[str]) -> list[str]:
        if hands_over and name == "a":
            raise Handover("b", [*data, name])
        return [*data, name]

    agent.__name__ = name
    return agent


def test_checkpoints_name_the_agent_a_resume_runs_next(cli: Cli, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'next.db'}"
    store = open_store(url)
    config = CheckpointConfig(storage=store, policy=CheckpointPolicy(keep_latest=None))

    def clutch_of(strategy: Strategy, max_turns: int = 100) -> Clutch:
        return Clutch(strategy.value, strategy=strategy, checkpoint=config, max_turns=max_turns)

    sequential = clutch_of(Strategy.SEQUENTIAL)
    rotation = clutch_of(Strategy.ROUND_ROBIN, max_turns=4)
    graph = clutch_of(Strategy.GRAPH)
    selector = clutch_of(Strategy.SELECTOR)
    for clutch in (sequential, rotation, graph, selector):
        edges = {"a": ["c"], "b": [], "c": ["b"]} if clutch is graph else {}
        for name in ("a", "b", "c"):
            clutch.agent(edges=edges.get(name))(_appender(name, clutch is selector))
    picks = iter(["a", "c", None])  # a hands over to b, then the selector picks c, then stops

    @selector.selector
    async def pick(data: list[str]) -> str | None:
        return next(picks)

    async def run() -> None:
        try:
            for clutch in (sequential, rotation, graph, selector):
                await clutch.run([], run_id=clutch.name)
        finally:
            await store.close()

    asyncio.run(run())
    assert _next_cells(cli, url, "sequential") == ["b", "c", ENDED]  # the position's agent
    assert _next_cells(cli, url, "round_robin") == ["b", "c", "a", ENDED]  # wraps around
    assert _next_cells(cli, url, "graph") == ["c", "b", ENDED]  # the edges, not the order
    assert _next_cells(cli, url, "selector") == ["b", "chosen by the selector", ENDED]
    rows = json_of(cli("checkpoints", "sequential", "--store", url, "--json"))
    assert [r["next_agent"] for r in rows] == [None, None, None]  # --json: what is recorded
    assert [r["position"] for r in rows] == [
        {"index": 1, "agent": "b"},
        {"index": 2, "agent": "c"},
        {"index": 3, "agent": None},
    ]


def test_checkpoints_name_the_agent_under_way_and_the_one_a_failed_run_resumes_with(
    cli: Cli, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'next.db'}"
    store = open_store(url)
    config = CheckpointConfig(storage=store, policy=CheckpointPolicy(keep_latest=None))
    clutch = Clutch("next", strategy=Strategy.SEQUENTIAL, checkpoint=config)
    broken = [True]

    @clutch.agent()
    async def first(data: list[str]) -> list[str]:
        return [*data, "first"]

    @clutch.agent()
    async def second(data: list[str]) -> list[str]:
        await clutch.checkpoint()  # before its step: it continues with second
        if broken[0]:
            raise RuntimeError("second broke")
        return [*data, "second"]

    async def fail() -> None:
        with pytest.raises(RuntimeError):
            await clutch.run([], run_id="next")

    async def resume() -> None:
        try:
            assert await clutch.resume_latest("next") == ["first", "second"]
        finally:
            await store.close()

    asyncio.run(fail())
    assert _next_cells(cli, url, "next") == ["second", "second"]  # after step 1; inside second
    broken[0] = False
    asyncio.run(resume())
    assert _next_cells(cli, url, "next")[-1] == ENDED


def test_a_cancelled_run_whose_event_log_is_damaged_is_listed_its_canceller_unknown(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = next(store_url_for("sqlite", request, tmp_path))
    filled = asyncio.run(fill(url))
    assert cli("cancel", filled.gone, "-s", url).exit_code == 0
    # the run_cancelled event's body altered: the log reads, the event does not
    damage_newest_event_batch(url, filled.gone, alter)
    shown = cli("show", filled.gone, "-s", url)
    assert shown.exit_code == 0 and "(cancelled by unknown)" in shown.stdout
    # a torn batch: the log itself cannot be read
    damage_newest_event_batch(url, filled.gone, tear)
    table = cli("runs", "-s", url)
    assert table.exit_code == 0, table.stderr
    assert [line.split()[:3] for line in table.stdout.splitlines()[1:]] == [
        [filled.gone, "cli-test", "cancelled"],
        [filled.bad, "cli-test", "failed"],
        [filled.ok, "cli-test", "completed"],
    ]
    rows = {row["run_id"]: row for row in json_of(cli("runs", "--json", "-s", url))}
    assert rows[filled.gone]["cancelled_by"] == {
        "unreadable": f"the event log of run {filled.gone!r} is damaged (a torn batch)"
    }
    assert rows[filled.gone]["owner"] is not None  # as stored: who last had it is unknown
    assert [
        r["run_id"] for r in json_of(cli("runs", "--json", "--status", "cancelled", "-s", url))
    ] == [filled.gone]


def test_show_and_events_of_a_run_whose_event_log_is_torn(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = next(store_url_for("sqlite", request, tmp_path))
    filled = asyncio.run(fill(url))
    whole = cli("events", filled.gone, "-s", url).stdout.splitlines()
    damage_newest_event_batch(url, filled.gone, tear)
    why = f"the event log of run {filled.gone!r} is damaged (a torn batch)"
    shown = cli("show", filled.gone, "-s", url)
    assert shown.exit_code == 0, shown.stderr
    assert '{"name":"gone"}' in shown.stdout and "interrupted" in shown.stdout
    assert shown.stdout.rstrip().endswith(f"step in flight: unreadable ({why})")
    details = json_of(cli("show", filled.gone, "--json", "-s", url))
    assert [s["outcome"] for s in details["steps"]] == ["completed"]
    assert details["step_in_flight"] == {"unreadable": why}
    # the events before the torn batch, then one line naming the damage
    listed = cli("events", filled.gone, "-s", url)
    assert listed.exit_code == 1
    assert listed.stderr == f"error: {why}\n"
    lines = listed.stdout.splitlines()
    assert 0 < len(lines) < len(whole) and lines == whole[: len(lines)]
    assert len(cli("events", filled.gone, "--since", "2", "-s", url).stdout.splitlines()) == (
        len(lines) - 2
    )
    followed = cli("events", filled.gone, "--follow", "-s", url)  # it runs: followed
    assert (followed.exit_code, followed.stdout, followed.stderr) == (
        1,
        listed.stdout,
        f"error: {why}\n",
    )


def test_a_waiting_run_whose_event_log_is_torn_is_listed_its_wait_unknown(
    cli: Cli, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = next(store_url_for("sqlite", request, tmp_path))
    filled = asyncio.run(fill(url))
    leave_waiting(url, "w1")
    damage_newest_event_batch(url, "w1", tear)
    why = "the event log of run 'w1' is damaged (a torn batch)"
    table = cli("runs", "-s", url)
    assert table.exit_code == 0, table.stderr
    assert [line.split()[0] for line in table.stdout.splitlines()[1:]] == [
        "w1", filled.gone, filled.bad, filled.ok,
    ]  # fmt: skip
    assert "waiting (something unknown)" in table.stdout
    assert table.stderr == (
        "note: the wait of w1 cannot be read, its event log damaged: nestegg show RUN says why\n"
    )
    rows = {row["run_id"]: row for row in json_of(cli("runs", "--json", "-s", url))}
    assert rows["w1"]["waits_for"] == {"unreadable": why, "deadline": None, "due": False}
    shown = cli("show", "w1", "-s", url)
    assert shown.exit_code == 0, shown.stderr
    assert "waiting (something unknown)" in shown.stdout
    assert f"what it waits for cannot be read (its event log is damaged: {why})" in shown.stdout
    assert f"step in flight: unreadable ({why})" in shown.stdout
