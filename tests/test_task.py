"""ClutchTask and StepEvent: submit, await, result(timeout), done, cancel, stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch, ClutchTask, StepEvent, Strategy, get_context, handover
from nestegg.checkpoint import CheckpointConfig, open_store
from nestegg.checkpoint.cancels import cancel_run
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.errors import ConfigurationError, StaleOwnerError

WAIT_S = 5.0
"""Upper bound for waiting on something that happens right away (never reached when green)."""


def gated_clutch(
    release: asyncio.Event,
    started: asyncio.Event | None = None,
    checkpoint: CheckpointConfig | None = None,
) -> Clutch:
    """A one-agent Clutch whose agent waits for ``release`` before returning."""
    clutch = Clutch("gated", checkpoint=checkpoint)

    @clutch.agent()
    async def gated(data: str) -> str:
        if started is not None:
            started.set()
        await release.wait()
        return data + "_done"

    return clutch


class SlowToStore(MemoryCheckpointStorage):
    """A memory store that stores a new run only once ``release`` is set."""

    def __init__(self, release: asyncio.Event) -> None:
        super().__init__()
        self.release = release

    async def create_run(self, run: RunRecord) -> None:
        await self.release.wait()
        await super().create_run(run)


def echo_clutch() -> Clutch:
    clutch = Clutch("echo")

    @clutch.agent()
    async def echo(data: str) -> str:
        return data + "_done"

    return clutch


class TestSubmit:
    async def test_returns_a_task_at_once(self) -> None:
        task = await echo_clutch().submit("in")
        assert isinstance(task, ClutchTask)
        assert isinstance(task.id, str) and task.id
        assert not task.done
        assert await task == "in_done"

    async def test_await_gives_the_result_and_marks_done(self) -> None:
        task = await echo_clutch().submit("in")
        assert await task == "in_done"
        assert task.done
        assert await task == "in_done"

    async def test_result_with_timeout(self) -> None:
        task = await echo_clutch().submit("in")
        assert await task.result(timeout=WAIT_S) == "in_done"

    async def test_result_without_limit(self) -> None:
        task = await echo_clutch().submit("in")
        assert await task.result(timeout=None) == "in_done"

    async def test_run_without_limit(self) -> None:
        assert await echo_clutch().run("in", timeout=None) == "in_done"

    async def test_task_ids_differ(self) -> None:
        clutch = echo_clutch()
        tasks = [await clutch.submit(str(i)) for i in range(3)]
        assert len({task.id for task in tasks}) == 3
        await asyncio.gather(*tasks)

    async def test_concurrent_tasks(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def double(data: int) -> int:
            await asyncio.sleep(0)
            return data * 2

        tasks = [await clutch.submit(i) for i in range(5)]
        assert await asyncio.gather(*tasks) == [0, 2, 4, 6, 8]

    async def test_concurrent_runs_have_their_own_context(self) -> None:
        both_inside = asyncio.Barrier(2)
        seen: dict[str, tuple[str, int, int]] = {}
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=3)

        @clutch.agent()
        async def step(data: dict[str, Any]) -> dict[str, Any]:
            ctx = get_context()
            await both_inside.wait()
            turn = ctx.state.turn
            seen[f"{data['name']}{turn}"] = (ctx.state.clutch_id, turn, len(ctx.state.history))
            return {"name": data["name"], "n": data["n"] + 1}

        first = await clutch.submit({"name": "x", "n": 0})
        second = await clutch.submit({"name": "y", "n": 100})
        assert await asyncio.wait_for(asyncio.gather(first, second), WAIT_S) == [
            {"name": "x", "n": 3},
            {"name": "y", "n": 103},
        ]
        x_ids = {seen[f"x{turn}"][0] for turn in range(3)}
        y_ids = {seen[f"y{turn}"][0] for turn in range(3)}
        assert len(x_ids) == 1 and len(y_ids) == 1 and x_ids != y_ids
        assert all(seen[f"{n}{t}"][1:] == (t, t) for n in "xy" for t in range(3))

    async def test_fire_and_forget(self) -> None:
        collected: list[str] = []
        arrived = asyncio.Event()
        clutch = Clutch("p")

        @clutch.agent()
        async def collector(data: str) -> str:
            collected.append(data)
            arrived.set()
            return data

        await clutch.submit("fire")
        await asyncio.wait_for(arrived.wait(), WAIT_S)
        assert collected == ["fire"]


class TestTimeout:
    async def test_result_timeout_raises_and_the_run_goes_on(self) -> None:
        release = asyncio.Event()
        task = await gated_clutch(release).submit("in")
        with pytest.raises(TimeoutError):
            await task.result(timeout=0.01)
        assert not task.done
        release.set()
        assert await task.result(timeout=WAIT_S) == "in_done"

    async def test_agents_that_never_wait_can_still_time_out_and_be_cancelled(self) -> None:
        clutch = Clutch("p", max_turns=10)

        @clutch.agent()
        async def again(data: str) -> str:
            handover("again")  # no data: not a turn, so max_turns never ends it

        task = await clutch.submit("in")
        with pytest.raises(TimeoutError):
            await task.result(timeout=0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task.result(), WAIT_S)

    async def test_run_timeout_raises_and_the_run_goes_on(self) -> None:
        release, finished = asyncio.Event(), asyncio.Event()

        async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
            finished.set()

        clutch = Clutch("p", on_response=on_response)

        @clutch.agent()
        async def gated(data: str) -> str:
            await release.wait()
            return data

        with pytest.raises(TimeoutError):
            await clutch.run("in", timeout=0.01)
        release.set()
        await asyncio.wait_for(finished.wait(), WAIT_S)

    async def test_timeout_error_is_the_builtin_one(self) -> None:
        release = asyncio.Event()
        task = await gated_clutch(release).submit("in")
        with pytest.raises(TimeoutError) as info:
            await task.result(timeout=0)
        assert type(info.value) is TimeoutError
        task.cancel()

    async def test_timeout_error_says_the_run_did_not_finish_in_time(self) -> None:
        release = asyncio.Event()
        task = await gated_clutch(release).submit("in")
        with pytest.raises(TimeoutError) as info:
            await task.result(timeout=timedelta(milliseconds=20))
        assert str(info.value) == (
            "the run did not finish within 0.02 s; it goes on while this event loop runs "
            "(no store keeps its outcome: only the task of submit() gives it, awaited again); "
            "to wait longer, pass timeout=None (as long as the run takes) or a larger timeout"
        )
        release.set()
        assert await task.result(timeout=WAIT_S) == "in_done"

    @pytest.mark.parametrize(
        ("store", "said"),
        [
            (
                lambda release: MemoryCheckpointStorage(),
                "run 'r1' did not finish within 0.02 s; it goes on while this event loop runs: "
                "await clutch.result('r1') for its outcome (if the loop ends first, the run is "
                "stored as cancelled, and resume_latest('r1') continues it); to wait longer, "
                "pass timeout=None (as long as the run takes) or a larger timeout",
            ),
            (
                SlowToStore,
                "run 'r1' was not stored within 0.02 s (its write to the store took longer); "
                "it goes on while this event loop runs: once it is stored, "
                "await clutch.result('r1') for its outcome; to wait longer, pass timeout=None "
                "(as long as the run takes) or a larger timeout",
            ),
        ],
        ids=["stored", "not-stored"],
    )
    async def test_a_checkpointed_run_timed_out_goes_on_and_says_how_to_get_its_outcome(
        self, store: Callable[[asyncio.Event], MemoryCheckpointStorage], said: str
    ) -> None:
        release = asyncio.Event()
        clutch = gated_clutch(release, checkpoint=CheckpointConfig(store(release)))
        with pytest.raises(TimeoutError) as info:
            await clutch.run("in", timeout=0.02, run_id="r1")
        assert str(info.value) == said
        release.set()
        async with asyncio.timeout(WAIT_S):
            while not await clutch.list_runs():  # stored once the store answers
                await asyncio.sleep(0.001)
        assert await clutch.result("r1", timeout=WAIT_S) == "in_done"

    def test_a_checkpointed_run_timed_out_is_stored_cancelled_when_its_loop_ends(
        self, tmp_path: Path
    ) -> None:
        url = f"sqlite:///{tmp_path / 'runs.db'}"
        release = asyncio.Event()

        async def time_out() -> None:
            clutch = gated_clutch(release, checkpoint=CheckpointConfig(open_store(url)))
            await clutch.list_runs()  # the store is set up: the run is stored at once
            with pytest.raises(TimeoutError, match=r"^run 'r1' did not finish within 0\.5 s"):
                await clutch.run("in", timeout=0.5, run_id="r1")

        async def resume() -> tuple[list[str], str]:
            release.set()
            async with gated_clutch(release, checkpoint=CheckpointConfig(open_store(url))) as c:
                statuses = [run.status for run in await c.list_runs()]
                return statuses, await c.resume_latest("r1")

        asyncio.run(time_out())  # returns at the TimeoutError: the loop ends, the run is cancelled
        assert asyncio.run(resume()) == (["cancelled"], "in_done")

    async def test_a_timed_out_resume_or_fork_names_its_stored_run(self) -> None:
        # they said "no store keeps its outcome", as of a run without checkpoints
        release, started = asyncio.Event(), asyncio.Event()
        clutch = Clutch("gated", checkpoint=CheckpointConfig(MemoryCheckpointStorage()))

        @clutch.agent()
        async def first(data: str) -> str:
            return data

        @clutch.agent()
        async def second(data: str) -> str:
            started.set()
            await release.wait()
            return data + "_done"

        for run_id in ("r1", "r2"):
            started.clear()
            task = await clutch.submit(run_id, run_id=run_id)
            await asyncio.wait_for(started.wait(), WAIT_S)
            task.cancel()  # stored cancelled, its first step checkpointed
            with pytest.raises(asyncio.CancelledError):
                await task.result(timeout=WAIT_S)
        checkpoint = (await clutch.list_checkpoints("r2"))[-1].checkpoint_id
        waits = {
            "r1": lambda: clutch.resume_latest("r1", timeout=0.05),
            "r2": lambda: clutch.resume(checkpoint, timeout=0.05),
            "f2": lambda: clutch.fork(checkpoint, run_id="f2", timeout=0.05),
        }
        for run_id, wait in waits.items():
            with pytest.raises(TimeoutError) as info:
                await wait()
            assert str(info.value) == (
                f"run {run_id!r} did not finish within 0.05 s; it goes on while this event "
                f"loop runs: await clutch.result({run_id!r}) for its outcome (if the loop ends "
                f"first, the run is stored as cancelled, and resume_latest({run_id!r}) "
                "continues it); to wait longer, pass timeout=None (as long as the run takes) "
                "or a larger timeout"
            )
        release.set()
        for run_id, result in (("r1", "r1_done"), ("r2", "r2_done"), ("f2", "r2_done")):
            assert await clutch.result(run_id, timeout=WAIT_S) == result

    async def test_a_fork_timed_out_before_its_run_is_stored_says_so(self) -> None:
        stores = asyncio.Event()
        stores.set()
        clutch = Clutch("echo", checkpoint=CheckpointConfig(SlowToStore(stores)))

        @clutch.agent()
        async def echo(data: str) -> str:
            return data + "_done"

        assert await clutch.run("in", run_id="r1") == "in_done"
        checkpoint = (await clutch.list_checkpoints("r1"))[0].checkpoint_id
        stores.clear()
        with pytest.raises(TimeoutError) as info:
            await clutch.fork(checkpoint, run_id="f1", timeout=0.05)
        assert str(info.value) == (
            "the run was not read or stored within 0.05 s (the store took longer); it goes on "
            "while this event loop runs: clutch.list_runs() names it once it is stored; to "
            "wait longer, pass timeout=None (as long as the run takes) or a larger timeout"
        )
        stores.set()
        async with asyncio.timeout(WAIT_S):
            while len(await clutch.list_runs()) < 2:  # stored once the store answers
                await asyncio.sleep(0.001)
        assert await clutch.result("f1", timeout=WAIT_S) == "in_done"

    @pytest.mark.parametrize("how", ["submit", "run"])
    async def test_a_timeout_of_a_run_cancelled_from_outside_says_the_cancel_is_requested(
        self, how: str
    ) -> None:
        # it said only that the run goes on, the cancel (nestegg cancel from another
        # process) waiting for the step's next commit
        release, started = asyncio.Event(), asyncio.Event()
        store = MemoryCheckpointStorage()
        clutch = gated_clutch(release, started, CheckpointConfig(store))
        task = await clutch.submit("in", run_id="r1") if how == "submit" else None
        waited = asyncio.ensure_future(
            task.result(timeout=0.2) if task else clutch.run("in", timeout=0.2, run_id="r1")
        )
        await asyncio.wait_for(started.wait(), WAIT_S)
        await cancel_run(store, "r1", time.time(), lease_seconds=30)  # from another process
        with pytest.raises(TimeoutError) as info:
            await waited
        assert type(info.value) is TimeoutError  # eggai-clutch's callers catch it
        assert str(info.value) == (
            "run 'r1' did not finish within 0.2 s: its cancel was requested, and takes effect "
            "at its next commit, where this process stops it, the step under way not "
            "recorded (resume_latest('r1') continues it on purpose); to wait longer, pass "
            "timeout=None (as long as the run takes) or a larger timeout"
        )
        release.set()
        if task is not None:  # at that commit
            with pytest.raises(StaleOwnerError, match=r"^run 'r1' was cancelled from outside"):
                await task.result(timeout=WAIT_S)

    async def test_a_timeout_error_of_the_run_itself_is_raised_as_it_is(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def fetch(data: str) -> str:
            raise TimeoutError("the upstream API did not answer")

        with pytest.raises(TimeoutError, match=r"^the upstream API did not answer$"):
            await clutch.run("in", timeout=WAIT_S)


class TestCancel:
    async def test_cancel_stops_the_running_agent(self) -> None:
        started, agent_cancelled = asyncio.Event(), asyncio.Event()
        later: list[Any] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def slow(data: str) -> str:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                agent_cancelled.set()
                raise
            return data

        @clutch.agent()
        async def after(data: str) -> str:
            later.append(data)
            return data

        task = await clutch.submit("in")
        await asyncio.wait_for(started.wait(), WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert agent_cancelled.is_set()
        assert task.done
        assert later == []

    async def test_cancel_before_the_first_step(self) -> None:
        ran: list[str] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            ran.append(data)
            return data

        task = await clutch.submit("in")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ran == []

    async def test_result_of_a_cancelled_task_raises_cancelled(self) -> None:
        task = await gated_clutch(asyncio.Event()).submit("in")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task.result(timeout=WAIT_S)

    async def test_cancelling_one_task_leaves_the_others(self) -> None:
        release = asyncio.Event()
        clutch = gated_clutch(release)
        doomed = await clutch.submit("a")
        kept = await clutch.submit("b")
        doomed.cancel()
        release.set()
        assert await kept.result(timeout=WAIT_S) == "b_done"
        with pytest.raises(asyncio.CancelledError):
            await doomed


class TestExceptions:
    async def test_agent_error_reaches_the_awaiter(self) -> None:
        later: list[Any] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def failing(data: str) -> str:
            raise ValueError("intentional")

        @clutch.agent()
        async def after(data: str) -> str:
            later.append(data)
            return data

        task = await clutch.submit("in")
        with pytest.raises(ValueError, match="intentional"):
            await task
        assert task.done
        with pytest.raises(ValueError, match="intentional"):
            await task.result(timeout=WAIT_S)
        with pytest.raises(ValueError, match="intentional"):
            await clutch.run("in")
        assert later == []

    async def test_one_failing_task_does_not_disturb_another(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def maybe_fail(data: int) -> int:
            await asyncio.sleep(0)
            if data == 1:
                raise ArithmeticError("one")
            return data

        tasks = [await clutch.submit(i) for i in range(3)]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert results[0] == 0 and results[2] == 2
        assert isinstance(results[1], ArithmeticError)


class TestTaskStream:
    async def test_stream_of_a_submitted_task_sees_every_step(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=3)

        @clutch.agent()
        async def inc(data: int) -> int:
            return data + 1

        task = await clutch.submit(0)
        events = [(e.step, e.data, e.final) async for e in task.stream()]
        assert events == [
            ("inc", 1, False),
            ("inc", 2, False),
            ("inc", 3, False),
            ("_result", 3, True),
        ]

    async def test_two_streams_of_one_task_see_the_same_events(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=20)

        @clutch.agent()
        async def inc(data: int) -> int:
            await asyncio.sleep(0)
            return data + 1

        task = await clutch.submit(0)

        async def collect() -> list[Any]:
            return [e.data async for e in task.stream()]

        first, second = await asyncio.gather(collect(), collect())
        assert first == second == [*range(1, 21), 20]

    async def test_stream_of_a_finished_task_gives_the_result(self) -> None:
        task = await echo_clutch().submit("in")
        await task
        events = [(e.step, e.data, e.final) async for e in task.stream()]
        assert events == [("_result", "in_done", True)]

    async def test_stream_of_a_failed_task_raises(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def failing(data: str) -> str:
            raise ValueError("nope")

        task = await clutch.submit("in")
        with pytest.raises(ValueError, match="nope"):
            async for _ in task.stream():
                pass

    async def test_stream_stops_when_the_consumer_stops_early(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=50)

        @clutch.agent()
        async def inc(data: int) -> int:
            await asyncio.sleep(0)
            return data + 1

        task = await clutch.submit(0)
        stream = task.stream()
        first = await anext(stream)
        await stream.aclose()
        assert first.step == "inc" and first.data == 1
        assert await task.result(timeout=WAIT_S) == 50
        assert task._listeners.queues == []


class TestStepEvent:
    def test_fields(self) -> None:
        event = StepEvent("agent_a", {"key": "value"}, final=False)
        assert event.step == "agent_a"
        assert event.data == {"key": "value"}
        assert event.final is False

    def test_final_defaults_to_false(self) -> None:
        assert StepEvent("a", 1).final is False
        assert StepEvent("_result", "final_data", final=True).final is True

    def test_repr_names_step_and_finality(self) -> None:
        text = repr(StepEvent("test", "data", final=True))
        assert "test" in text and "final=True" in text

    def test_has_no_instance_dict(self) -> None:
        with pytest.raises(AttributeError):
            StepEvent("a", 1).other = 2  # type: ignore[attr-defined]


class TestBadTimeout:
    @pytest.mark.parametrize(
        "timeout",
        ["30", -1, True, [5], float("nan"), float("inf"), 1e300, timedelta(days=3_000_000)],
    )
    async def test_run_refuses_it_before_anything_runs_or_is_stored(self, timeout: Any) -> None:
        store = MemoryCheckpointStorage()
        ran: list[str] = []
        clutch = Clutch("p", checkpoint=CheckpointConfig(storage=store))

        @clutch.agent()
        async def a(data: str) -> str:
            ran.append(data)
            return data

        expected = "timeout must be a timedelta or a number of seconds from 0 to 100 years"
        with pytest.raises(ConfigurationError, match=expected):
            await clutch.run("in", timeout=timeout, run_id="r1")
        await asyncio.sleep(0.05)
        assert ran == []
        assert await store.get_run("r1") is None

    async def test_result_refuses_it_and_the_run_goes_on(self) -> None:
        release = asyncio.Event()
        task = await gated_clutch(release).submit("in")
        with pytest.raises(ConfigurationError, match="got 'soon'"):
            await task.result(timeout="soon")  # type: ignore[arg-type]
        release.set()
        assert await task.result(timeout=WAIT_S) == "in_done"

    async def test_a_timedelta_is_seconds(self) -> None:
        task = await echo_clutch().submit("in")
        assert await task.result(timeout=timedelta(seconds=WAIT_S)) == "in_done"  # type: ignore[arg-type]
