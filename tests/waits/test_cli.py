"""nestegg runs --status waiting, nestegg signal (stored only, or resumed with --app),
nestegg recover picking up a signalled run, and the timeline of a waiting run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from nestegg import RunWaiting
from nestegg.checkpoint.stores import open_store
from tests.cli.conftest import Cli
from tests.waits.pipeline import build, quotes

APP = "tests.waits.pipeline:app"
APPROVED = '{"approved": true, "by": "ann"}'


async def _start(url: str, run_id: str, ledger: Path) -> None:
    store = open_store(url)
    try:
        with pytest.raises(RunWaiting):
            await build(store).run({"ledger": str(ledger), "amount": 3}, run_id=run_id)
    finally:
        await store.close()


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
    assert [r["waits_for"] for r in rows] == [{"signal": "approval", "deadline": None}] * 2

    shown = cli("show", "w1", "-s", url)
    assert "waiting, 2 calls journaled" in shown.stdout  # the quote and the deadline

    stored = cli("signal", "w1", "approval", APPROVED, "-s", url)
    assert stored.exit_code == 0, stored.stderr
    assert "signal 'approval' stored for run w1" in stored.stdout
    again = cli("signal", "w1", "approval", APPROVED, "-s", url)
    assert again.exit_code == 1 and "replace=True" in again.stderr

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
        "(replace=True stores it for a resume from an earlier checkpoint)\n"
    )
    exported = orjson.loads(cli("export", "w1", "-s", url).stdout)
    assert [g["name"] for g in exported["signals"]] == ["approval"]
    # on purpose, for a resume from an earlier checkpoint: stored
    replaced = cli(
        "signal", "w1", "approval", '{"approved": false, "by": "bo"}', "--replace", "-s", url
    )
    assert replaced.exit_code == 0, replaced.stderr


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
