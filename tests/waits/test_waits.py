"""wait_for, signal and sleep on every store, in one process: a second Clutch on a new
handle plays the other process. (tests/waits/test_processes.py uses real processes.)"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import nestegg
from nestegg import Clutch, RunWaiting, SignalExistsError, SignalRefusedError
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.constants import WAITING
from nestegg.errors import ConfigurationError, EventLogDamagedError, RunNotFoundError
from nestegg.testing import FakeClock
from tests.cli.conftest import damage_newest_event_batch, tear
from tests.ui.pipelines import SIGNAL, start_waiting, waiting_pipeline
from tests.waits.conftest import Opener
from tests.waits.pipeline import build, build_sleeper, entries, quotes

APPROVED = {"approved": True, "by": "ann"}
DAY = 24 * 3600.0


def _input(tmp_path: Path) -> dict[str, Any]:
    return {"ledger": str(tmp_path / "ledger"), "amount": 5}


def _quotes(tmp_path: Path) -> int:
    ledger = tmp_path / "ledger"
    return quotes(ledger)


async def test_a_wait_releases_the_run_and_a_signal_resumes_it(
    open_store: Opener, tmp_path: Path
) -> None:
    clutch = build(await open_store())
    with pytest.raises(RunWaiting) as waiting:
        await clutch.run(_input(tmp_path), run_id="r1")
    assert (waiting.value.run_id, waiting.value.signal, waiting.value.deadline) == (
        "r1",
        "approval",
        None,
    )
    [info] = await clutch.list_runs(WAITING)
    assert info.run_id == "r1"
    assert await clutch.list_interrupted() == []
    other = build(await open_store())
    result = await other.signal("r1", "approval", APPROVED)
    assert result["status"] == "approved" and result["by"] == "ann" and result["settled"]
    assert _quotes(tmp_path) == 1
    events = await other.events("r1")
    kinds = [event.kind for event in events]
    assert kinds.count("run_waiting") == 1 and kinds.count("signal_received") == 1
    assert kinds.index("run_waiting") < kinds.index("signal_received")
    assert kinds[-1] == "run_completed"
    resumed = kinds[kinds.index("run_waiting") :]  # the step the signal came in began first
    assert resumed.index("step_started") < resumed.index("signal_received")
    assert [event.at for event in events] == sorted(event.at for event in events)


async def test_a_signal_sent_before_the_wait_is_received_at_once(
    open_store: Opener, tmp_path: Path
) -> None:
    store = await open_store()
    clutch = build(store)
    # A run that waits on a first signal, then another, is signalled for the second early.
    rejected = {"approved": False, "by": "bob"}
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="r2")
    assert await clutch.signal("r2", "other", 1, resume=True) is None  # not awaited: stays
    assert (await clutch.list_runs(WAITING))[0].run_id == "r2"
    result = await clutch.signal("r2", "approval", rejected)
    assert result["status"] == "rejected"
    # A signal stored before the run reaches its wait_for: the wait returns at once.
    early = build_with_early_signal(store)
    assert (await early.run({"n": 1}, run_id="r3"))["got"] == {"approved": True}


def build_with_early_signal(storage: Any) -> Clutch:
    """A pipeline whose first agent signals its own run; the second one waits for it."""
    clutch = Clutch("early", checkpoint=CheckpointConfig(storage=storage))

    @clutch.agent()
    async def first(data: dict[str, Any]) -> dict[str, Any]:
        run_id = nestegg.get_context().run_id
        await clutch.signal(run_id, "go", {"approved": True}, resume=False)
        return data

    @clutch.agent()
    async def second(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "got": await nestegg.wait_for("go")}

    return clutch


async def test_a_second_signal_of_a_name_is_refused_unless_replaced(
    open_store: Opener, tmp_path: Path
) -> None:
    store = await open_store()
    clutch = build(store)
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="r4")
    await clutch.signal("r4", "approval", {"approved": False, "by": "x"}, resume=False)
    with pytest.raises(SignalExistsError, match="replace=True"):
        await clutch.signal("r4", "approval", APPROVED)
    [stored] = await store.read_signals("r4")
    assert b'"x"' in stored.body
    result = await clutch.signal("r4", "approval", APPROVED, replace=True)
    assert result["status"] == "approved"
    with pytest.raises(RunNotFoundError):
        await clutch.signal("nope", "approval", APPROVED)


async def test_a_passed_deadline_resumed_by_recover_raises_in_the_agent(
    open_store: Opener, tmp_path: Path
) -> None:
    clock = FakeClock()
    store = await open_store()
    clutch = build(store, clock=clock, timeout=2 * DAY)
    with pytest.raises(RunWaiting) as waiting:
        await clutch.run(_input(tmp_path), run_id="r5")
    assert waiting.value.deadline == clock.now + 2 * DAY
    clock.advance(2 * DAY - 1)
    assert await clutch.list_interrupted() == []
    assert await clutch.recover() == {}
    clock.advance(1)
    assert [r.run_id for r in await clutch.list_interrupted()] == ["r5"]
    outcome = await clutch.recover()
    assert outcome["r5"]["status"] == "expired" and outcome["r5"]["settled"]
    assert _quotes(tmp_path) == 1
    with pytest.raises(SignalRefusedError, match="completed: no step would read"):
        await clutch.signal("r5", "approval", APPROVED)  # too late: the run completed
    assert await store.read_signals("r5") == []


async def test_a_signal_stored_after_the_deadline_does_not_end_the_wait(
    open_store: Opener, tmp_path: Path
) -> None:
    """The deadline came first: the wait timed out then, whatever was stored since."""
    clock = FakeClock()
    clutch = build(await open_store(), clock=clock, timeout=2 * DAY)
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="late")
    clock.advance(2 * DAY + 1)
    await clutch.signal("late", "approval", APPROVED, resume=False)
    outcome = await clutch.recover()
    assert outcome["late"]["status"] == "expired"  # SignalTimeoutError in the agent
    received = [e.data for e in await clutch.events("late") if e.kind == "signal_received"]
    assert received == [{"signal": "approval", "timed_out": True}]
    on_time = build(await open_store(), clock=clock, timeout=2 * DAY)
    with pytest.raises(RunWaiting):
        await on_time.run(_input(tmp_path), run_id="on-time")
    clock.advance(2 * DAY)  # stored at the deadline itself: in time
    await on_time.signal("on-time", "approval", APPROVED, resume=False)
    assert (await on_time.recover())["on-time"]["status"] == "approved"


async def test_a_signal_replaced_after_the_deadline_keeps_a_wait_met_in_time(
    open_store: Opener, tmp_path: Path
) -> None:
    """A replacement keeps the time its name first came: met in time stays met, late stays
    late."""
    clock = FakeClock()
    clutch = build(await open_store(), clock=clock, timeout=2 * DAY)
    for run_id in ("unfit", "stored", "late"):
        with pytest.raises(RunWaiting):
            await clutch.run(_input(tmp_path), run_id=run_id)
    with pytest.raises(nestegg.SignalValueError):  # in time, not an Approval: the step fails
        await clutch.signal("unfit", "approval", {"approved": "maybe"})
    await clutch.signal("stored", "approval", {"approved": False, "by": "x"}, resume=False)
    clock.advance(2 * DAY + 1)
    await clutch.signal("late", "approval", {"approved": False, "by": "x"}, resume=False)
    clock.advance(1)
    for run_id in ("unfit", "stored", "late"):
        await clutch.signal(run_id, "approval", APPROVED, replace=True, resume=False)
    assert (await clutch.resume_latest("unfit"))["status"] == "approved"
    outcomes = await clutch.recover()
    assert outcomes["stored"]["status"] == "approved" and outcomes["stored"]["by"] == "ann"
    assert outcomes["late"]["status"] == "expired"


async def test_a_durable_sleep_is_resumed_when_due_and_not_before(
    open_store: Opener, tmp_path: Path
) -> None:
    clock = FakeClock()
    clutch = build_sleeper(await open_store(), clock)
    with pytest.raises(RunWaiting) as waiting:
        await clutch.run(_input(tmp_path), run_id="r6")
    assert waiting.value.signal is None
    assert waiting.value.deadline == clock.now + 6 * 3600
    due = datetime.fromtimestamp(clock.now + 6 * 3600, UTC).isoformat(timespec="seconds")
    told = f"run 'r6' waits for its timer until {due}: recover() resumes it when due"
    assert str(waiting.value) == told
    with pytest.raises(RunWaiting) as again:
        await clutch.result("r6")
    assert str(again.value) == told
    clock.advance(6 * 3600 - 1)
    assert await clutch.recover() == {}
    later = build_sleeper(await open_store(), clock)
    clock.advance(1)
    outcome = await later.recover()
    assert outcome["r6"]["followed_up"] is True
    assert _quotes(tmp_path) == 1


async def test_resume_latest_of_a_run_whose_wait_is_not_over_runs_and_stores_nothing(
    open_store: Opener, tmp_path: Path
) -> None:
    clock = FakeClock()
    store = await open_store()
    waits, sleeps = build(store, clock=clock, timeout=2 * DAY), build_sleeper(store, clock)
    with pytest.raises(RunWaiting):
        await waits.run(_input(tmp_path), run_id="n1")
    with pytest.raises(RunWaiting):
        await sleeps.run(_input(tmp_path), run_id="n2")
    # Another process's Clutch, on a handle of its own.
    others = (build(await open_store(), clock=clock), build_sleeper(await open_store(), clock))
    expected = {"n1": ("approval", clock.now + 2 * DAY), "n2": (None, clock.now + 6 * 3600)}
    for other, (run_id, (signal, deadline)) in zip(others, expected.items(), strict=True):
        before = await store.get_run(run_id)
        with pytest.raises(RunWaiting) as waiting:
            await other.resume_latest(run_id)
        assert (waiting.value.run_id, waiting.value.signal) == (run_id, signal)
        assert waiting.value.deadline == deadline
        assert await store.get_run(run_id) == before  # not claimed, no event written
    ledger = tmp_path / "ledger"
    assert (entries(ledger, "review"), entries(ledger, "follow_up")) == (1, 1)  # not rerun
    await waits.signal("n1", "approval", APPROVED, resume=False)
    assert (await others[0].resume_latest("n1"))["status"] == "approved"
    clock.advance(6 * 3600)
    assert (await others[1].resume_latest("n2"))["followed_up"] is True
    assert (entries(ledger, "review"), entries(ledger, "follow_up")) == (2, 2)
    assert _quotes(tmp_path) == 2


async def test_a_signal_stored_without_resuming_is_picked_up_by_recover(
    open_store: Opener, tmp_path: Path
) -> None:
    clutch = build(await open_store())
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="r7")
    assert await clutch.signal("r7", "approval", APPROVED, resume=False) is None
    assert await clutch.list_interrupted() == []
    outcome = await clutch.recover()
    assert outcome["r7"]["status"] == "approved"


async def test_a_task_and_a_stream_end_with_run_waiting(tmp_path: Path) -> None:
    clutch = build(MemoryCheckpointStorage())
    task = await clutch.submit(_input(tmp_path), run_id="t1")
    with pytest.raises(RunWaiting):
        await task.result()
    with pytest.raises(RunWaiting):
        async for _ in clutch.stream(_input(tmp_path), run_id="t2"):
            pass


async def test_a_wait_needs_a_checkpointed_run() -> None:
    with pytest.raises(ConfigurationError, match="checkpointing"):
        await nestegg.wait_for("approval")
    plain = Clutch("plain")

    @plain.agent()
    async def waits(data: Any) -> Any:
        return await nestegg.sleep(timedelta(seconds=1))

    with pytest.raises(ConfigurationError, match="checkpointing"):
        await plain.run({})


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), timedelta(days=3_000_000), -1])
@pytest.mark.parametrize("wait", ["wait_for", "sleep"])
async def test_a_wait_of_no_storable_length_fails_its_step_and_stores_no_wait(
    wait: str, duration: Any
) -> None:
    store = MemoryCheckpointStorage()
    clutch = Clutch("waits", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def waits(data: Any) -> Any:
        if wait == "sleep":
            return await nestegg.sleep(duration)
        return await nestegg.wait_for("approval", timeout=duration)

    expected = "must be a timedelta or a number of seconds from 0 to 100 years"
    with pytest.raises(ConfigurationError, match=expected):
        await clutch.run({}, run_id="w1")
    assert await clutch.list_runs(WAITING) == []
    [run] = await clutch.list_runs()  # every run can still be listed
    assert run.run_id == "w1" and run.status == "failed"


async def test_a_bad_signal_changes_nothing(tmp_path: Path) -> None:
    store = MemoryCheckpointStorage()
    clutch = build(store)
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="r8")
    with pytest.raises(nestegg.NestEggError, match="signal name"):
        await clutch.signal("r8", "a/b", 1)
    with pytest.raises(nestegg.NestEggError, match="signal 'approval'"):
        await clutch.signal("r8", "approval", object())
    assert await store.read_signals("r8") == []
    assert (await clutch.list_runs(WAITING))[0].run_id == "r8"


async def test_replace_and_resume_that_are_not_bools_are_refused(tmp_path: Path) -> None:
    # replace="yes" was taken as true; resume="no" too
    store = MemoryCheckpointStorage()
    clutch = build(store)
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="r9")
    for option in ({"replace": "yes"}, {"resume": "no"}, {"replace": 1}):
        [(name, given)] = option.items()
        message = f"signal() takes {name}=True or {name}=False, got {name}={given!r}"
        with pytest.raises(ConfigurationError, match=re.escape(message)):
            await clutch.signal("r9", "approval", APPROVED, **option)  # type: ignore[arg-type]
    assert await store.read_signals("r9") == []
    assert (await clutch.list_runs(WAITING))[0].run_id == "r9"


async def test_a_selector_may_wait_for_the_next_agent(tmp_path: Path) -> None:
    clutch = Clutch(
        "routes",
        strategy=nestegg.Strategy.SELECTOR,
        checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()),
    )
    asked: list[str] = []

    @clutch.selector
    async def choose(data: dict[str, Any]) -> str | None:
        if data.get("done"):
            return None
        asked.append("route")
        return str(await nestegg.wait_for("route"))

    @clutch.agent()
    async def refund(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "done": "refund"}

    with pytest.raises(RunWaiting) as waiting:
        await clutch.run({}, run_id="s1")
    assert waiting.value.signal == "route"
    assert await clutch.signal("s1", "route", "refund") == {"done": "refund"}
    assert asked == ["route", "route"]  # asked again on resume; the wait returned the signal


async def test_a_value_that_does_not_fit_fails_the_step_and_a_fitting_one_resumes_it(
    tmp_path: Path,
) -> None:
    clutch = build(MemoryCheckpointStorage())
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="v1")
    with pytest.raises(nestegg.SignalValueError, match="does not fit Approval"):
        await clutch.signal("v1", "approval", {"approved": "maybe"})
    assert (await clutch.list_runs("failed"))[0].run_id == "v1"
    await clutch.signal("v1", "approval", APPROVED, replace=True, resume=False)
    result = await clutch.resume_latest("v1")
    assert result["status"] == "approved"
    assert _quotes(tmp_path) == 1


class _LateSignalStore(MemoryCheckpointStorage):
    """Hides the run's signals from the first read: the signal lands just after the step
    looked, before the run is stored as waiting (and its sender saw it running)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def read_signals(self, run_id: str) -> list[Any]:
        self.reads += 1
        return [] if self.reads == 1 else await super().read_signals(run_id)


class _LostWaitEventStore(MemoryCheckpointStorage):
    """Reads a run's events without its ``run_waiting`` ones (as if damaged) once told to."""

    hide = False

    async def read_events(self, run_id: str, *args: Any, **kwargs: Any) -> list[Any]:
        events = await super().read_events(run_id, *args, **kwargs)
        return [e for e in events if not (self.hide and e.kind == "run_waiting")]


async def test_a_run_whose_wait_cannot_be_read_is_left_to_its_step(tmp_path: Path) -> None:
    store = _LostWaitEventStore()
    clutch = build(store)
    with pytest.raises(RunWaiting):
        await clutch.run(_input(tmp_path), run_id="lost")
    store.hide = True  # its signal unknown, no deadline: not refused forever
    await clutch.signal("lost", "approval", APPROVED, resume=False)
    assert (await clutch.resume_latest("lost"))["status"] == "approved"


async def test_a_signal_that_lands_while_the_run_suspends_is_not_lost() -> None:
    store = _LateSignalStore()
    clutch = Clutch("late", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def ask(data: dict[str, Any]) -> dict[str, Any]:
        run_id = nestegg.get_context().run_id
        # Sent (once: journaled) while the run runs, so its sender does not resume it.
        await nestegg.call(clutch.signal, run_id, "go", "now", resume=False)
        return {"got": await nestegg.wait_for("go")}

    assert await clutch.run({}, run_id="late") == {"got": "now"}
    assert store.reads >= 2
    kinds = [event.kind for event in await clutch.events("late")]
    assert kinds.count("run_waiting") == 1 and kinds[-1] == "run_completed"


class _NotValidatable:
    """A class pydantic cannot validate a value as (no schema, no arbitrary types)."""


@pytest.mark.parametrize("bad_type", [_NotValidatable, 42])
async def test_a_type_no_value_can_fit_fails_the_step_before_the_run_waits(
    bad_type: Any,
) -> None:
    store = MemoryCheckpointStorage()
    clutch = Clutch("typed", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def review(data: Any) -> Any:
        return await nestegg.wait_for("approval", type=bad_type)

    with pytest.raises(ConfigurationError, match=r"wait_for\('approval', type=.*\) cannot"):
        await clutch.run({}, run_id="t1")
    assert await clutch.list_runs(WAITING) == []  # it does not wait for days to fail
    assert (await clutch.list_runs())[0].status == "failed"
    assert await store.read_signals("t1") == []


async def test_result_without_a_transport_of_a_run_whose_wait_is_over_raises_at_once() -> None:
    # nothing in a Clutch without a transport resumes the run while result() waits
    import asyncio
    import time

    clutch = Clutch("napper", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))

    @clutch.agent()
    async def nap(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("timer"):
            await nestegg.sleep(0.1)
        else:
            data = {**data, "approval": await nestegg.wait_for("approval")}
        return {**data, "done": True}

    for run_id, data in (("timer", {"timer": True}), ("signal", {})):
        with pytest.raises(RunWaiting):
            await clutch.run(data, run_id=run_id)
    await asyncio.sleep(0.2)  # the timer is due
    await clutch.signal("signal", "approval", "ok", resume=False)
    for run_id, what in (("timer", "for its timer"), ("signal", "for signal 'approval'")):
        started = time.monotonic()
        with pytest.raises(RunWaiting) as over:
            await clutch.result(run_id, timeout=10)
        assert time.monotonic() - started < 2
        assert over.value.over and over.value.run_id == run_id
        message = str(over.value)
        assert message.startswith(f"run {run_id!r} waited {what}")
        assert "its wait is over" in message
        assert f"recover() or resume_latest({run_id!r}) continues it" in message
        assert (await clutch.resume_latest(run_id))["done"]


async def _untouched_state(store: CheckpointStorage, run_id: str) -> tuple[Any, ...]:
    """What is stored of ``run_id`` besides its (torn) event log."""
    return (
        await store.get_run(run_id),
        await store.read_signals(run_id),
        await store.list_checkpoints(run_id),
        await store.load_steps(run_id),
    )


async def test_a_waiting_run_whose_event_log_is_torn_is_refused_and_recover_goes_on(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    store = open_store(url)
    for run_id in ("torn", "fine"):
        await start_waiting(store, run_id, nap=False)
    await store.close()
    damage_newest_event_batch(url, "torn", tear)
    store = open_store(url)
    clutch = waiting_pipeline(store)
    why = (
        "run 'torn' is refused: the event log of run 'torn' is damaged (a torn batch), so "
        "what it waits for is unknown; it was not resumed"
    )
    try:
        await clutch.signal("fine", SIGNAL, "yes", resume=False)
        before = await _untouched_state(store, "torn")
        with pytest.raises(EventLogDamagedError, match=re.escape(why)) as refused:
            await clutch.resume_latest("torn")
        assert refused.value.run_id == "torn"
        assert str(refused.value).endswith(
            "nothing of it was changed (fork it from a checkpoint to go on in a new run, "
            "or delete it)"
        )
        with pytest.raises(EventLogDamagedError, match="its signal 'approval' not stored"):
            await clutch.signal("torn", SIGNAL, "yes")
        # recover tries it (what it waits for is unknown) and is refused, alone
        assert sorted(r.run_id for r in await clutch.list_resumable()) == ["fine", "torn"]
        outcomes = await clutch.recover()
        assert outcomes["fine"] == {"nap": False, "approved": "yes"}
        assert isinstance(outcomes["torn"], EventLogDamagedError)
        assert str(outcomes["torn"]).startswith(why)
        assert await _untouched_state(store, "torn") == before
    finally:
        await store.close()


async def test_a_signal_resumes_a_run_past_its_deadline_whose_event_log_is_torn_as_any(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Past its deadline a run's wait is over, whatever it waited for: the signal is stored
    and the run goes on timed out, torn log or not (before it, the torn one is refused),
    the warning saying that the torn run's wait could not be read, so neither the
    signal's name (it said nothing)."""
    url, clock = f"sqlite:///{tmp_path / 'runs.db'}", FakeClock()
    store = open_store(url)
    for run_id in ("torn", "whole", "early"):
        with pytest.raises(RunWaiting):
            await build(store, clock=clock, timeout=2 * DAY).run(_input(tmp_path), run_id=run_id)
    await store.close()
    for run_id in ("torn", "early"):
        damage_newest_event_batch(url, run_id, tear)
    store = open_store(url)
    clutch = build(store, clock=clock, timeout=2 * DAY)
    try:
        with pytest.raises(EventLogDamagedError, match="its signal 'approval' not stored"):
            await clutch.signal("early", "approval", APPROVED)
        assert await store.read_signals("early") == []
        clock.advance(2 * DAY + 1)
        for run_id in ("whole", "torn"):
            with caplog.at_level(logging.WARNING, logger="nestegg"):
                outcome = await clutch.signal(run_id, "approval", APPROVED)
            assert outcome["status"] == "expired"  # SignalTimeoutError in the agent
            assert [s.name for s in await store.read_signals(run_id)] == ["approval"]
    finally:
        await store.close()
    whole, torn = (record.getMessage() for record in caplog.records)
    assert whole.startswith("run 'whole' waited for signal 'approval' until ")
    assert torn.startswith(
        "what run 'torn' waits for cannot be read (its event log is damaged: the event log "
        "of run 'torn' is damaged (a torn batch)), so whether it waits for signal 'approval' "
        "could not be checked; its deadline, "
    )
    assert torn.endswith(
        "passed before the signal was stored: its wait is over whatever it was, and a resume "
        "goes on (a wait for a signal times out)"
    )
