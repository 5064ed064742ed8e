"""A waiting run whose ``run_waiting`` event is damaged (its log reads, that event does
not): what it waits for is unknown, and every reader says so, never that it waits for a
timer; its deadline, known from the run, still ends the wait."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg import RunWaiting
from nestegg.checkpoint.formats import event_body
from nestegg.checkpoint.records import EventRecord
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.waiting import Wait, wait_of
from nestegg.constants import EXIT_WAITING, NO_DEADLINE, RUN_WAITING, WAITING
from nestegg.testing import FakeClock
from nestegg.testing.builders import create, make_commit, make_event
from tests.cli.conftest import Cli, alter, damage_newest_event_batch
from tests.cli.test_subprocess import nestegg
from tests.waits.pipeline import build, build_sleeper

APP, OTHER_APP = "tests.waits.pipeline:app", "tests.waits.pipeline:other_app"
APPROVED = {"approved": True, "by": "ann"}
DAY = 24 * 3600.0
WHY = "event 4 of run {!r} is torn or not a nestegg record"
"""Why the ``run_waiting`` event of a run of these pipelines cannot be read, once altered."""


async def _wait(url: str, run_id: str, clock: Any, *, timer: bool = False) -> None:
    """Store a run that waits (for its signal, two days at most; or six hours, a timer)."""
    store = open_store(url)
    clutch = build_sleeper(store, clock) if timer else build(store, clock, timeout=2 * DAY)
    try:
        with pytest.raises(RunWaiting):
            ledger = f"{url.removeprefix('sqlite:///')}.ledger"
            await clutch.run({"ledger": ledger, "amount": 1}, run_id=run_id)
    finally:
        await store.close()


async def _damaged(url: str, run_ids: tuple[str, ...], clock: Any, timer: bool = False) -> None:
    """Store runs that wait (:func:`_wait`), their ``run_waiting`` event altered."""
    for run_id in run_ids:
        await _wait(url, run_id, clock, timer=timer)
        damage_newest_event_batch(url, run_id, alter)


async def test_the_library_says_the_wait_is_unknown_and_its_deadline_still_ends_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # it was read as a timer: "waits for its timer", "waits for a timer, not 'approval'"
    url, clock = f"sqlite:///{tmp_path / 'runs.db'}", FakeClock()
    await _damaged(url, ("early", "late"), clock)
    store = open_store(url)
    clutch = build(store, clock, timeout=2 * DAY)
    try:
        run = await store.get_run("early")
        assert run is not None
        wait = await wait_of(store, run)
        assert wait is not None
        assert (wait.signal, wait.deadline, wait.unreadable) == (
            None, clock() + 2 * DAY, WHY.format("early"),
        )  # fmt: skip
        with pytest.raises(RunWaiting) as waiting:
            await clutch.resume_latest("early")
        assert waiting.value.unreadable == WHY.format("early") and waiting.value.signal is None
        assert str(waiting.value).startswith("run 'early' waits for something unknown until 20")
        assert str(waiting.value).endswith(
            f" (its event log is damaged: {WHY.format('early')}): recover() resumes it when due"
        )
        head = "what run {!r} waits for cannot be read (its event log is damaged: {}), so "
        head += "whether it waits for signal 'approval' could not be checked"
        with caplog.at_level(logging.WARNING, logger="nestegg"):
            assert await clutch.signal("early", "approval", APPROVED) is None  # stored only
            clock.advance(2 * DAY + 1)
            # past its deadline its wait is over, whatever it was: resumed, as recover() does
            assert (await clutch.signal("late", "approval", APPROVED))["status"] == "expired"
        early, late = (record.getMessage() for record in caplog.records)
        assert early == (
            head.format("early", WHY.format("early"))
            + ": 'approval' is stored and read only by a wait for it"
        )
        assert late.startswith(head.format("late", WHY.format("late")) + "; its deadline, 20")
        assert late.endswith(
            ", passed before the signal was stored: its wait is over whatever it was, and a "
            "resume goes on (a wait for a signal times out)"
        )
        assert "timer" not in early + late
    finally:
        await store.close()


def test_runs_show_signal_and_resume_say_the_wait_is_unknown(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    asyncio.run(_damaged(url, ("w1",), time.time))
    asyncio.run(_damaged(url, ("s1",), time.time, timer=True))
    listed = cli("runs", "-s", url)
    assert listed.exit_code == 0, listed.stderr
    status = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    for run_id in ("w1", "s1"):
        assert "waiting (something unknown until 20" in status[run_id]
        assert status[run_id].split("until ")[1][19] == ")"  # the cell whole: a date and time
        shown = cli("show", run_id, "-s", url)
        assert shown.exit_code == 0, shown.stderr
        assert "waiting (something unknown until 20" in shown.stdout
        assert (
            f"\nwhat it waits for cannot be read (its event log is damaged: {WHY.format(run_id)})\n"
            in shown.stdout
        )
        assert "timer" not in shown.stdout
    assert "timer" not in listed.stdout
    assert listed.stderr == (
        "note: the wait of s1, w1 cannot be read, its event log damaged: nestegg show RUN "
        "says why\n"
    )
    rows = {row["run_id"]: row for row in orjson.loads(cli("runs", "--json", "-s", url).stdout)}
    waits = rows["w1"]["waits_for"]
    assert waits.pop("deadline") is not None
    assert waits == {"unreadable": WHY.format("w1"), "due": False}

    value = orjson.dumps(APPROVED).decode()
    sent = nestegg(tmp_path, "signal", "w1", "approval", value, "-s", url, "--json")
    assert sent.returncode == 0, sent.stderr
    assert sent.stderr == (
        f"warning: what run 'w1' waits for cannot be read (its event log is damaged: "
        f"{WHY.format('w1')}), so whether it waits for signal 'approval' could not be "
        "checked: 'approval' is stored and read only by a wait for it\n"
    )
    told = orjson.loads(sent.stdout)
    assert told["waits_for"]["unreadable"] == WHY.format("w1") and not told["timed_out"]

    resumed = cli("resume", "s1", "--app", OTHER_APP, "-s", url)
    assert resumed.exit_code == EXIT_WAITING
    assert resumed.stderr.startswith("error: run 's1' waits for something unknown until 20")
    assert resumed.stderr.endswith(
        f"; nothing was run: what it waits for cannot be read (its event log is damaged: "
        f"{WHY.format('s1')}); it goes on once its deadline passes: nestegg resume s1 --app "
        f"{OTHER_APP} --store {url} (or nestegg recover --app {OTHER_APP} --store {url})\n"
    )


async def test_a_wait_is_read_past_events_after_it_and_a_missing_one_is_unknown(
    tmp_path: Path,
) -> None:
    # it was read from the last 8 events only: a run_waiting further back was a timer
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        payload = {"signal": "approval", "deadline": None, "steps": 0}
        for run_id, events in (("far", 12), ("none", 0)):
            run = await create(store, run_id=run_id, status=WAITING, lease_until=NO_DEADLINE)
            waiting = [EventRecord(run_id, 1, 0.0, RUN_WAITING, event_body(payload))]
            later = [make_event(run_id, seq) for seq in range(2, events + 1)]
            commit = make_commit(run, events=[*waiting, *later] if events else later)
            commit.event_seq = events
            await store.commit(commit)
        far, missing = await store.get_run("far"), await store.get_run("none")
        assert far is not None and missing is not None
        assert await wait_of(store, far) == Wait("approval", None)
        assert await wait_of(store, missing) == Wait(
            None, None, "run 'none' has no run_waiting event"
        )
    finally:
        await store.close()
