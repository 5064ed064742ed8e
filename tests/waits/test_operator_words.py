"""What an operator is told around a wait: a signal the run does not wait for, a signal
that came after its wait's deadline, a signal sent twice, and a waiting run whose wait is
over (``runs``, ``show``) but that still needs resuming."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg import RunWaiting
from nestegg.checkpoint.stores import open_store
from tests.cli.test_subprocess import nestegg
from tests.waits.pipeline import build, build_sleeper

APP = "tests.waits.pipeline:app"
APPROVED = '{"approved": true, "by": "ann"}'
LATE = 0.05
"""The timeout of a wait whose deadline a test lets pass."""


async def _start(url: str, run_id: str, *, timeout: float | None = None, **extra: Any) -> None:
    store = open_store(url)
    try:
        with pytest.raises(RunWaiting):
            await build(store, timeout=timeout).run(
                {"ledger": f"{url.removeprefix('sqlite:///')}.ledger", "amount": 3, **extra},
                run_id=run_id,
            )
    finally:
        await store.close()


async def _start_due_timer(url: str, run_id: str) -> None:
    """A run whose six-hour timer was due an hour ago (its clock seven hours behind)."""
    store = open_store(url)
    try:
        with pytest.raises(RunWaiting):
            await build_sleeper(store, lambda: time.time() - 7 * 3600).run(
                {"ledger": f"{url.removeprefix('sqlite:///')}.ledger", "amount": 1}, run_id=run_id
            )
    finally:
        await store.close()


def _resume_hint(run_id: str, url: str) -> str:
    options = f"--app MODULE:CLUTCH --store {url}"
    return (
        f"resume it with nestegg resume {run_id} {options} (or nestegg recover {options}), "
        "or a worker of its pipeline takes it"
    )


def test_a_signal_the_run_does_not_wait_for_is_stored_with_a_warning(tmp_path: Path) -> None:
    # it printed "signal 'aproval' stored for run w1" and nothing else
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "w1"))
    asyncio.run(_start_due_timer(url, "t1"))
    warned = (
        "warning: run 'w1' waits for signal 'approval', not 'aproval': 'aproval' is stored "
        "and read only by a wait for it\n"
    )
    sent = nestegg(tmp_path, "signal", "w1", "aproval", APPROVED, "-s", url)
    assert (sent.returncode, sent.stdout, sent.stderr) == (
        0,
        "signal 'aproval' stored for run w1\n",
        warned,
    )
    with_app = nestegg(tmp_path, "signal", "w1", "other", "1", "--app", APP, "-s", url, "--json")
    assert with_app.returncode == 0, with_app.stderr
    assert with_app.stderr == warned.replace("'aproval'", "'other'")
    told = orjson.loads(with_app.stdout)
    assert (told["resumed"], told["timed_out"]) == (False, False)
    assert told["waits_for"] == {"signal": "approval", "deadline": None}
    timer = nestegg(tmp_path, "signal", "t1", "approval", "1", "-s", url, "--json")
    assert timer.returncode == 0, timer.stderr
    assert timer.stderr == (
        "warning: run 't1' waits for a timer, not 'approval': 'approval' is stored and read "
        "only by a wait for it\n"
    )
    assert orjson.loads(timer.stdout)["waits_for"]["signal"] is None


def test_clutch_signal_warns_of_a_signal_the_run_does_not_wait_for(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "w1"))

    async def send() -> Any:
        store = open_store(url)
        try:
            return await build(store).signal("w1", "aproval", {"approved": True, "by": "ann"})
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="nestegg"):
        assert asyncio.run(send()) is None
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (
            "nestegg",
            "run 'w1' waits for signal 'approval', not 'aproval': 'aproval' is stored and "
            "read only by a wait for it",
        )
    ]


def test_a_signal_after_the_deadline_says_the_wait_timed_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # with --app it said only that the run waits again; without, only "stored"
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    for run_id in ("l1", "l2", "l3"):
        asyncio.run(_start(url, run_id, timeout=LATE))
    time.sleep(LATE * 2)

    stored = nestegg(tmp_path, "signal", "l1", "approval", APPROVED, "-s", url)
    assert stored.returncode == 0, stored.stderr
    assert stored.stderr.startswith("warning: run 'l1' waited for signal 'approval' until 20")
    assert stored.stderr.endswith(
        ", which passed before the signal was stored: its wait timed out, and the step goes "
        "on as on a timeout (wait_for raises SignalTimeoutError)\n"
    )
    assert stored.stdout == (
        f"signal 'approval' stored for run l1; its wait for it timed out: "
        f"{_resume_hint('l1', url)}\n"
    )
    resumed = nestegg(
        tmp_path, "signal", "l2", "approval", APPROVED, "--app", APP, "-s", url, "--json"
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "its wait timed out" in resumed.stderr
    told = orjson.loads(resumed.stdout)
    assert (told["timed_out"], told["result"]["status"]) == (True, "expired")

    async def send() -> Any:
        store = open_store(url)
        try:
            return await build(store, timeout=LATE).signal("l3", "approval", orjson.loads(APPROVED))
        finally:
            await store.close()

    with caplog.at_level(logging.WARNING, logger="nestegg"):
        assert asyncio.run(send())["status"] == "expired"
    assert any("its wait timed out" in r.getMessage() for r in caplog.records)


def test_a_signal_sent_again_says_whether_a_step_received_the_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "a1"))
    asyncio.run(_start(url, "a2", timeout=LATE))
    time.sleep(LATE * 2)
    for run_id in ("a1", "a2"):
        assert nestegg(tmp_path, "signal", run_id, "approval", APPROVED, "-s", url).returncode == 0
    waited = nestegg(tmp_path, "signal", "a1", "approval", APPROVED, "-s", url)
    assert (waited.returncode, waited.stderr) == (
        1,
        "error: run 'a1' has a signal 'approval' already, which no step has received yet: the "
        "run waits for it and receives it when resumed; pass --replace to send another value "
        "instead\n",
    )
    late = nestegg(tmp_path, "signal", "a2", "approval", APPROVED, "-s", url)
    assert (late.returncode, late.stderr) == (
        1,
        "error: run 'a2' has a signal 'approval' already, which no step has received: it came "
        "after the deadline of the run's wait for it, so that wait times out when the run is "
        "resumed (a new value keeps the time the first came); pass --replace to send another "
        "value\n",
    )


def test_runs_and_show_say_when_a_wait_is_over_and_how_the_run_goes_on(tmp_path: Path) -> None:
    # they said "waiting (signal 'approval' until ...)" after the signal came, and
    # "waiting (timer until ...)" long after the timer was due
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "got"))
    asyncio.run(_start(url, "missed", timeout=LATE))
    asyncio.run(_start(url, "open"))
    asyncio.run(_start_due_timer(url, "nap"))
    time.sleep(LATE * 2)
    sent = nestegg(tmp_path, "signal", "got", "approval", APPROVED, "-s", url)
    assert sent.stdout == (
        f"signal 'approval' stored for run got; it waits for it: {_resume_hint('got', url)}\n"
    )

    listed = nestegg(tmp_path, "runs", "-s", url)
    assert listed.returncode == 0, listed.stderr
    status = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert "waiting (signal 'approval' received: resume it)" in status["got"]
    assert "waiting (no signal 'approval' by its deadline: resume it)" in status["missed"]
    assert "waiting (timer due since 20" in status["nap"]
    assert "waiting (signal 'approval')" in status["open"]
    options = f"--app MODULE:CLUTCH --store {url}"
    assert listed.stderr == (
        f"note: the wait of missed, got, nap is over: resume one with nestegg resume RUN "
        f"{options}, all with nestegg recover {options}, or a worker of its pipeline takes it\n"
    )
    rows = {
        r["run_id"]: r["waits_for"]
        for r in orjson.loads(nestegg(tmp_path, "runs", "--json", "-s", url).stdout)
    }
    assert (rows["got"]["received"], rows["got"]["due"]) == (True, False)
    assert (rows["missed"]["received"], rows["missed"]["due"]) == (False, True)
    assert (rows["open"]["received"], rows["open"]["due"]) == (False, False)

    shown = nestegg(tmp_path, "show", "got", "-s", url).stdout.splitlines()
    assert "waiting (signal 'approval' received: resume it)" in shown[2]
    assert f"its wait is over: {_resume_hint('got', url)}" in shown
    assert not any(
        "wait is over" in line
        for line in nestegg(tmp_path, "show", "open", "-s", url).stdout.splitlines()
    )


def test_the_note_of_runs_names_ten_runs_and_counts_the_others() -> None:
    # a listing of hundreds of runs whose wait is over made a note of hundreds of ids
    from nestegg.cli.wait_words import named_some

    ids = [f"r{i}" for i in range(12)]
    assert named_some(ids) == "r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 and 2 more"
    assert named_some(ids[:10]) == ", ".join(ids[:10])
