"""nestegg runs --status waiting, nestegg signal (stored only, or resumed with --app),
nestegg recover picking up a signalled run, nestegg resume of a run whose wait is not
over, and the timeline of a waiting run."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from nestegg import RunWaiting
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores import open_store
from nestegg.constants import EXIT_USAGE, EXIT_WAITING
from tests.cli.conftest import Cli, damage_newest_event_batch, tear
from tests.cli.test_subprocess import nestegg
from tests.waits.pipeline import build, build_sleeper, entries, quotes

APP = "tests.waits.pipeline:app"
OTHER_APP = "tests.waits.pipeline:other_app"
APPROVED = '{"approved": true, "by": "ann"}'


async def _start(
    url: str,
    run_id: str,
    ledger: Path,
    *,
    sleeper: bool = False,
    timeout: float | None = None,
    **extra: Any,
) -> None:
    store = open_store(url)
    clutch = build_sleeper(store, time.time) if sleeper else build(store, timeout=timeout)
    try:
        with pytest.raises(RunWaiting):
            await clutch.run({"ledger": str(ledger), "amount": 3, **extra}, run_id=run_id)
    finally:
        await store.close()


async def _record(url: str, run_id: str) -> RunRecord | None:
    store = open_store(url)
    try:
        return await store.get_run(run_id)
    finally:
        await store.close()


def test_resume_of_a_run_whose_wait_is_not_over_runs_nothing_and_exits_5(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    asyncio.run(_start(url, "w1", ledger))
    asyncio.run(_start(url, "s1", ledger, sleeper=True))
    before = {run_id: asyncio.run(_record(url, run_id)) for run_id in ("w1", "s1")}
    store = ("--store", url)

    signal = nestegg(tmp_path, "resume", "w1", "--app", APP, *store)
    assert signal.returncode == EXIT_WAITING
    assert signal.stderr == (
        "error: run 'w1' waits for signal 'approval'; nothing was run: send it with: "
        f"nestegg signal w1 approval VALUE --app {APP} --store {url}\n"
    )
    assert signal.stdout == ""
    timer = nestegg(tmp_path, "resume", "s1", "--app", OTHER_APP, *store, "--json")
    assert timer.returncode == EXIT_WAITING
    assert timer.stderr.startswith("error: run 's1' waits for timer until 20")
    told = orjson.loads(timer.stdout)  # --json: the error and what the run waits for
    deadline = told.pop("waits_for").pop("deadline")
    assert told == {
        "error": timer.stderr.removeprefix("error: ").removesuffix("\n"),
        "exit_code": EXIT_WAITING,
        "type": "RunWaiting",
        "run_id": "s1",
        "status": "waiting",
    }
    assert datetime.fromisoformat(deadline) > datetime.now(UTC)
    assert timer.stderr.endswith(
        f"; nothing was run: it goes on once the timer is due: nestegg resume s1 --app "
        f"{OTHER_APP} --store {url} (or nestegg recover --app {OTHER_APP} --store {url})\n"
    )
    # recover leaves them too: neither is due
    for app in (APP, OTHER_APP):
        recovered = nestegg(tmp_path, "recover", "--app", app, *store)
        assert recovered.returncode == 0, recovered.stderr
        assert recovered.stdout.startswith("no interrupted runs of pipeline")
    assert {run_id: asyncio.run(_record(url, run_id)) for run_id in before} == before
    assert (entries(ledger, "review"), entries(ledger, "follow_up")) == (1, 1)

    assert nestegg(tmp_path, "signal", "w1", "approval", APPROVED, *store).returncode == 0
    resumed = nestegg(tmp_path, "resume", "w1", "--app", APP, *store, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert orjson.loads(resumed.stdout)["result"]["settled"] is True
    assert (entries(ledger, "review"), quotes(ledger)) == (2, 2)  # one quote per run


def test_resume_of_a_run_that_goes_on_and_waits_again_says_so_and_exits_5(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    asyncio.run(_start(url, "w2", ledger, payout=True))
    assert nestegg(tmp_path, "signal", "w2", "approval", APPROVED, "-s", url).returncode == 0
    again = nestegg(tmp_path, "resume", "w2", "--app", APP, "-s", url)
    assert again.returncode == EXIT_WAITING
    assert again.stderr == (
        "error: run 'w2' was resumed and waits again, for signal 'payout': send it with: "
        f"nestegg signal w2 payout VALUE --app {APP} --store {url}\n"
    )
    assert entries(ledger, "review") == 2


def test_a_signal_with_app_whose_run_waits_again_exits_5_as_resume_does(
    tmp_path: Path,
) -> None:
    # it printed "run w4 waits for signal 'payout'" and exited 0
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    for run_id, extra in (("w4", ()), ("w5", ("--json",))):
        asyncio.run(_start(url, run_id, ledger, payout=True))
        signal = ("signal", run_id, "approval", APPROVED, "--app", APP, "-s", url, *extra)
        again = nestegg(tmp_path, *signal)
        assert again.returncode == EXIT_WAITING
        waits = {"signal": "payout", "deadline": None, "received": False, "due": False}
        told = {"run_id": run_id, "status": "waiting", "waits_for": waits}
        error = again.stderr.removeprefix("error: ").removesuffix("\n")
        if extra:  # --json: the error and what the run waits for, on stdout
            assert orjson.loads(again.stdout) == {
                "error": error,
                "exit_code": EXIT_WAITING,
                "type": "RunWaiting",
                **told,
            }
        else:
            assert again.stdout == ""
        assert again.stderr == (
            f"error: run {run_id!r} was resumed and waits again, for signal 'payout': send it "
            f"with: nestegg signal {run_id} payout VALUE --app {APP} --store {url}\n"
        )
    paid = nestegg(tmp_path, "signal", "w4", "payout", "true", "--app", APP, "-s", url)
    assert paid.returncode == 0, paid.stderr
    assert paid.stdout.splitlines()[0] == "signal 'payout' stored; run w4 resumed"


async def _checkpoints(url: str, run_id: str) -> list[tuple[str, int]]:
    store = open_store(url)
    try:
        return [(c.checkpoint_id, c.seq) for c in await store.list_checkpoints(run_id)]
    finally:
        await store.close()


def test_a_fork_that_reaches_a_wait_says_so_and_exits_5(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    asyncio.run(_start(url, "w3", ledger, payout=True))
    assert nestegg(tmp_path, "signal", "w3", "approval", APPROVED, "-s", url).returncode == 0
    assert nestegg(tmp_path, "resume", "w3", "--app", APP, "-s", url).returncode == EXIT_WAITING
    [reviewed] = [c for c, seq in asyncio.run(_checkpoints(url, "w3")) if seq == 1]
    forked = nestegg(tmp_path, "fork", reviewed, "--app", APP, "-s", url)
    assert forked.returncode == EXIT_WAITING and forked.stdout == ""
    new_id = forked.stderr.split("'")[1]
    assert new_id != "w3" and asyncio.run(_record(url, new_id)) is not None
    assert forked.stderr == (
        f"error: run {new_id!r} was forked from checkpoint {reviewed!r} and waits for signal "
        f"'payout': send it with: nestegg signal {new_id} payout VALUE --app {APP} --store {url}\n"
    )


def test_recover_says_what_a_run_waits_for_again_as_resume_does_and_whole_in_a_pipe(
    tmp_path: Path,
) -> None:
    # it said "run 'w6' waits for signal 'payout' until 2026-11-26T15:53:41+00:0…": an ISO
    # time, cut at 60 cells in a pipe too
    url = f"sqlite:///{tmp_path / 'waits.db'}"

    def waiting_again(run_id: str) -> None:
        asyncio.run(_start(url, run_id, tmp_path / "ledger", payout=True, payout_within=86400.0))
        stored = nestegg(tmp_path, "signal", run_id, "approval", APPROVED, "-s", url)
        assert stored.returncode == 0, stored.stderr

    def waits() -> dict[str, Any]:
        listed = nestegg(tmp_path, "runs", "--status", "waiting", "--json", "-s", url)
        return {r["run_id"]: r["waits_for"] for r in orjson.loads(listed.stdout)}

    waiting_again("w6")
    report = nestegg(tmp_path, "recover", "--app", APP, "-s", url, "--json")
    assert report.returncode == 0, report.stderr
    [run] = orjson.loads(report.stdout)["runs"]
    assert (run["outcome"], run["waits_for"]) == ("waiting", waits()["w6"])  # as runs has it

    waiting_again("w7")
    recovered = nestegg(tmp_path, "recover", "--app", APP, "-s", url)
    assert recovered.returncode == 0, recovered.stderr
    deadline = datetime.fromisoformat(waits()["w7"]["deadline"])
    until = deadline.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    assert recovered.stdout.splitlines()[1].split(maxsplit=2) == [
        "w7",
        "waiting",
        f"was resumed and waits again, for signal 'payout' until {until}: send it with: "
        f"nestegg signal w7 payout VALUE --app {APP} --store {url} (or resume it once the "
        "deadline has passed)",
    ]


def test_operators_list_signal_and_recover_waiting_runs(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    asyncio.run(_start(url, "w1", ledger))
    asyncio.run(_start(url, "w2", ledger))

    listed = cli("runs", "--status", "waiting", "-s", url)
    assert listed.exit_code == 0, listed.stderr
    assert "waiting (signal 'approval')" in listed.stdout
    rows = orjson.loads(cli("runs", "--status", "waiting", "--json", "-s", url).stdout)
    waits = {"signal": "approval", "deadline": None, "received": False, "due": False}
    assert [r["waits_for"] for r in rows] == [waits] * 2

    shown = cli("show", "w1", "-s", url)
    assert "waiting, 2 calls journaled" in shown.stdout  # the quote and the deadline

    stored = cli("signal", "w1", "approval", APPROVED, "-s", url)
    assert stored.exit_code == 0, stored.stderr
    assert "signal 'approval' stored for run w1" in stored.stdout
    again = cli("signal", "w1", "approval", APPROVED, "-s", url)
    assert again.exit_code == 1 and "pass --replace to send" in again.stderr

    recovered = orjson.loads(cli("recover", "--app", APP, "-s", url, "--json").stdout)
    assert [(r["run_id"], r["outcome"]) for r in recovered["runs"]] == [("w1", "completed")]
    assert recovered["runs"][0]["result"]["status"] == "approved"

    resumed = cli("signal", "w2", "approval", APPROVED, "--app", APP, "-s", url, "--json")
    assert resumed.exit_code == 0, resumed.stderr
    assert orjson.loads(resumed.stdout)["result"]["settled"] is True
    assert quotes(ledger) == 2

    bad = cli("signal", "w2", "other", "{not json", "-s", url)
    assert bad.exit_code == 2 and "not JSON" in bad.stderr
    missing = cli("signal", "nope", "approval", "1", "-s", url)
    assert missing.exit_code == 3


def test_a_signal_to_no_run_says_so_as_every_command_does(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "w1", tmp_path / "ledger"))
    for args in (
        ["signal", "nope", "approval", "1"],
        ["signal", "nope", "approval", "1", "--app", APP],
        ["show", "nope"],
        ["resume", "nope", "--app", APP],
    ):
        result = cli(*args, "-s", url)
        assert (result.exit_code, result.stderr) == (3, "error: no run 'nope' in the store\n"), args


def test_a_signal_that_cannot_be_delivered_is_refused_and_not_stored(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    asyncio.run(_start(url, "w1", ledger))
    other = "tests.waits.pipeline:other_app"
    wrong_app = cli("signal", "w1", "approval", APPROVED, "--app", other, "-s", url)
    assert wrong_app.exit_code == 2
    assert wrong_app.stderr == (
        "error: run 'w1' belongs to pipeline 'refunds', not 'followups': "
        "the signal was not stored\n"
    )
    resumed = cli("signal", "w1", "approval", APPROVED, "--app", APP, "-s", url, "--json")
    assert resumed.exit_code == 0, resumed.stderr  # the first, refused, left nothing
    assert orjson.loads(resumed.stdout)["result"]["settled"] is True
    completed = cli("signal", "w1", "late", "1", "-s", url)
    assert completed.exit_code == 1
    assert completed.stderr == (
        "error: run 'w1' completed: no step would read signal 'late', it was not stored "
        "(--replace stores it for a resume from an earlier checkpoint)\n"
    )
    exported = orjson.loads(cli("export", "w1", "-s", url).stdout)
    assert [g["name"] for g in exported["signals"]] == ["approval"]
    # on purpose, for a resume from an earlier checkpoint: stored
    replaced = cli(
        "signal", "w1", "approval", '{"approved": false, "by": "bo"}', "--replace", "-s", url
    )
    assert replaced.exit_code == 0, replaced.stderr


def test_signal_errors_advise_the_commands_replace_option(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "r1", tmp_path / "ledger"))
    unfit = nestegg(
        tmp_path, "signal", "r1", "approval", '{"approved":"maybe"}', "--app", APP, "-s", url
    )
    assert unfit.returncode == 1 and unfit.stdout == ""
    assert unfit.stderr == (
        "error: the value of signal 'approval' does not fit Approval: approved: Input should be "
        "a valid boolean, unable to interpret input; by: Field required (send another with "
        "--replace, then resume the run)\n"
    )
    again = nestegg(tmp_path, "signal", "r1", "approval", APPROVED, "-s", url)
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr == (
        "error: run 'r1' has a signal 'approval' already; a signal is sent once per run and "
        "name: pass --replace to send another value (a step that received the first one "
        "keeps it; a wait that has not received it yet gets the new one)\n"
    )
    replaced = nestegg(tmp_path, "signal", "r1", "approval", APPROVED, "--replace", "-s", url)
    assert replaced.returncode == 0, replaced.stderr
    resumed = nestegg(tmp_path, "resume", "r1", "--app", APP, "-s", url, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert orjson.loads(resumed.stdout)["result"]["status"] == "approved"


def test_a_signal_value_with_a_key_twice_is_refused_and_not_stored(tmp_path: Path) -> None:
    # it stored {"approved": false}, the last value JSON readers keep, and resumed with it
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    ledger = tmp_path / "ledger"
    asyncio.run(_start(url, "k1", ledger))
    before = asyncio.run(_record(url, "k1"))
    once = "a dict has each key once; give each key once"
    for value, where, key in (
        ('{"approved": true, "by": "ann", "approved": false}', "the top level", '"approved"'),
        ('{"approved": true, "by": "ann", "notes": [{"a": 1, "a": 2}]}', "notes[0]", '"a"'),
        ('[{"x": {"it\'s": {"b": 1, "b": 1}}}]', '[0].x["it\'s"]', '"b"'),
    ):
        for app in ((), ("--app", APP)):
            refused = nestegg(tmp_path, "signal", "k1", "approval", value, *app, "-s", url)
            assert (refused.returncode, refused.stdout) == (EXIT_USAGE, "")
            assert refused.stderr == (
                f"error: the signal's value holds a dict at {where} with one key twice ({key} "
                f"is there twice): {once}\n"
            )
    exported = orjson.loads(nestegg(tmp_path, "export", "k1", "-s", url).stdout)
    assert exported["signals"] == []  # nothing stored
    assert asyncio.run(_record(url, "k1")) == before  # nor resumed
    sent = nestegg(tmp_path, "signal", "k1", "approval", APPROVED, "--app", APP, "-s", url)
    assert sent.returncode == 0, sent.stderr  # once each: sent, without --replace


def test_events_show_a_waits_deadline_as_a_time(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    asyncio.run(_start(url, "d1", tmp_path / "ledger", timeout=2 * 86400.0))
    rows = [orjson.loads(line) for line in cli("events", "d1", "-s", url, "--json").stdout.split()]
    [waiting] = [row["data"] for row in rows if row["kind"] == "run_waiting"]
    deadline = waiting["deadline"]  # --json: the number stored, to the microsecond
    assert isinstance(deadline, float) and deadline != round(deadline, 0)
    assert abs(deadline - (time.time() + 2 * 86400)) < 60
    lines = cli("events", "d1", "-s", url).stdout.splitlines()
    [line] = [line for line in lines if "run_waiting" in line]
    # as the line's own time (local, to the millisecond), not 1.79587e+09
    shown = datetime.fromtimestamp(deadline, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")
    assert f" deadline={shown[:-3]} " in line, line
    assert line.endswith(" steps=0")


def test_an_exported_waiting_run_keeps_its_signals(tmp_path: Path) -> None:
    cli = Cli(tmp_path / "home")
    source, target = (f"sqlite:///{tmp_path / name}" for name in ("a.db", "b.db"))
    ledger = tmp_path / "ledger"
    asyncio.run(_start(source, "x1", ledger))
    assert cli("signal", "x1", "approval", APPROVED, "-s", source).exit_code == 0
    exported = tmp_path / "x1.json"
    assert cli("export", "x1", "-o", str(exported), "-s", source).exit_code == 0
    assert orjson.loads(exported.read_bytes())["signals"][0]["name"] == "approval"
    imported = cli("import", str(exported), "-s", target)
    assert imported.exit_code == 0, imported.stderr
    recovered = orjson.loads(cli("recover", "--app", APP, "-s", target, "--json").stdout)
    assert recovered["runs"][0]["result"]["status"] == "approved"
    assert quotes(ledger) == 1


def test_a_signal_with_app_resumes_a_run_past_its_deadline_whose_event_log_is_torn(
    tmp_path: Path,
) -> None:
    # its wait is over whatever it waited for: resumed and timed out, as a whole one is
    cli = Cli(tmp_path / "home")
    url = f"sqlite:///{tmp_path / 'waits.db'}"
    for run_id in ("torn", "whole"):
        asyncio.run(_start(url, run_id, tmp_path / "ledger", timeout=0.05))
    damage_newest_event_batch(url, "torn", tear)
    time.sleep(0.1)  # past the deadline
    why = "the event log of run 'torn' is damaged (a torn batch)"
    # its wait is over, as runs says it of the whole one (it said "for something unknown")
    listed = cli("runs", "-s", url)
    torn = next(line for line in listed.stdout.splitlines() if line.startswith("torn "))
    assert "waiting (something unknown, its deadline passed: resume it)" in torn
    assert "\nnote: the wait of whole, torn is over: resume one with nestegg resume" in (
        listed.stderr
    )
    rows = {row["run_id"]: row for row in orjson.loads(cli("runs", "--json", "-s", url).stdout)}
    assert rows["torn"]["waits_for"]["unreadable"] == why and rows["torn"]["waits_for"]["due"]
    for run_id in ("whole", "torn"):
        sent = cli("signal", run_id, "approval", APPROVED, "--app", APP, "-s", url, "--json")
        assert sent.exit_code == 0, sent.stderr
        summary = orjson.loads(sent.stdout)
        assert (summary["stored"], summary["result"]["status"]) == (True, "expired")
    # what it waited for could not be read, nor the signal's name checked (it said null)
    assert summary["waits_for"]["unreadable"] == why and summary["waits_for"]["deadline"]
