"""The caller's side and a worker in this process: result() from any process, streams,
run ids, the sweeper, and what a worker refuses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage
from nestegg.checkpoint.records import Owner
from nestegg.errors import (
    ConfigurationError,
    RunExistsError,
    RunFailedError,
    RunNotFoundError,
    StaleOwnerError,
)
from nestegg.testing import FakeClock
from nestegg.transport.base import channel_name
from nestegg.transport.worker import Worker
from tests.transport import apps
from tests.transport.apps import make_chain, make_slow, make_split, make_split_without_third
from tests.transport.conftest import Deployment, wait_until
from tests.transport.test_workers import _released, _run_when, uninterrupted_result


def local_clutch(path: Path) -> Clutch:
    clutch = Clutch("local", checkpoint=CheckpointConfig(storage=SQLiteCheckpointStorage(path)))

    @clutch.agent()
    async def judge(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("fail"):
            raise KeyError("no verdict")
        if data.get("wait"):
            await asyncio.sleep(data["wait"])
        return {**data, "verdict": "fine"}

    return clutch


async def test_result_works_without_a_transport_from_another_clutch(tmp_path: Path) -> None:
    runner, reader = local_clutch(tmp_path / "db"), local_clutch(tmp_path / "db")
    try:
        await runner.run({"a": 1}, run_id="done")
        with pytest.raises(KeyError):
            await runner.run({"fail": True}, run_id="broken")
        assert await reader.result("done") == {"a": 1, "verdict": "fine"}
        with pytest.raises(RunFailedError) as failed:
            await reader.result("broken")
        with pytest.raises(RunNotFoundError, match="nope"):
            await reader.result("nope")
        task = await runner.submit({"wait": 5}, run_id="slow")
        while not await runner.list_runs("running"):
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError, match=r"'slow' did not finish within 0\.2 s"):
            await reader.result("slow", timeout=0.2)
        task.cancel()
    finally:
        await runner.stop()
        await reader.stop()
    error = failed.value
    assert (error.run_id, error.agent, error.error_type) == ("broken", "judge", "KeyError")
    assert error.error_message == "'no verdict'"
    assert str(error) == "run 'broken' failed in agent 'judge': KeyError: 'no verdict'"


async def test_serve_needs_a_transport_and_known_agents(tmp_path: Path) -> None:
    clutch = local_clutch(tmp_path / "db")
    with pytest.raises(ConfigurationError, match="has no transport"):
        await clutch.serve()


@pytest.mark.server
async def test_a_worker_refuses_unknown_agents_and_bad_concurrency(
    deployment: Deployment,
) -> None:
    chain = make_chain()
    assert chain.transport is not None
    try:
        with pytest.raises(ConfigurationError, match=r"agents \['pang'\] are not agents"):
            Worker(chain, chain.transport, agents=["ping", "pang"])
        with pytest.raises(ConfigurationError, match="concurrency must be an int >= 1"):
            Worker(chain, chain.transport, concurrency=0)
        with pytest.raises(ConfigurationError) as refused:
            Worker(chain, chain.transport, concurrency=True)
        assert str(refused.value) == (
            "concurrency must be an int >= 1, got True (a bool, not a number)"
        )
        for grace in (-1.0, float("nan")):  # NaN was taken: no comparison is true of it
            with pytest.raises(ConfigurationError) as refused:
                Worker(chain, chain.transport, grace=grace)
            assert str(refused.value) == f"grace must be >= 0 seconds, got {grace!r}"
    finally:
        await chain.stop()


@pytest.mark.server
async def test_a_worker_refuses_sweeps_that_would_spin_or_never_come(
    deployment: Deployment,
) -> None:
    # sweep_interval=0 swept the store in a loop that took a core (1,000 scans in 4 s);
    # NaN was taken: no comparison is true of it, so a sweep_after of NaN swept nothing
    chain = make_chain()
    assert chain.transport is not None
    try:
        for interval in (0.0, -1.0, float("nan")):
            with pytest.raises(ConfigurationError) as refused:
                Worker(chain, chain.transport, sweep_interval=interval)
            assert str(refused.value) == f"sweep_interval must be > 0 seconds, got {interval!r}"
        for after in (-5.0, float("nan")):
            with pytest.raises(ConfigurationError) as refused:
                Worker(chain, chain.transport, sweep_after=after)
            assert str(refused.value) == f"sweep_after must be >= 0 seconds, got {after!r}"
        with pytest.raises(ConfigurationError) as refused:
            Worker(chain, chain.transport, agents="ping")
        assert str(refused.value) == (
            "agents is a list of agent names, got the str 'ping' (agents=['ping'])"
        )
        Worker(chain, chain.transport, sweep_interval=0.02, sweep_after=0.0)
    finally:
        await chain.stop()


@contextlib.asynccontextmanager
async def serving(clutch: Clutch, **options: Any) -> AsyncIterator[asyncio.Task[None]]:
    """``clutch.serve(**options)`` in this process for the duration."""
    task = asyncio.ensure_future(clutch.serve(**options))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.server
async def test_stream_yields_each_step_committed_by_the_workers(deployment: Deployment) -> None:
    caller, worker = make_chain(), make_chain()
    try:
        async with serving(worker, concurrency=2):
            events = [event async for event in caller.stream({}, run_id="streamed")]
    finally:
        await caller.stop()
        await worker.stop()
    assert [e.step for e in events] == ["ping", "pong"] * 5 + ["_result"]
    assert [e.data["n"] for e in events[:-1]] == list(range(1, 11))
    assert events[-1].final and events[-1].data == uninterrupted_result()


@pytest.mark.server
async def test_a_worker_holds_its_steps_back_while_its_stores_commits_pile_up(
    deployment: Deployment,
) -> None:
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    limited = RedisCheckpointStorage(
        deployment.redis_url, prefix=deployment.prefix, max_pending_commits=1
    )
    held: list[bool] = []
    admission = limited.step_admission

    def counted_admission() -> Any:
        wait = admission()
        held.append(wait is not None)
        return wait

    limited.step_admission = counted_admission  # type: ignore[method-assign]
    caller, worker = make_chain(), make_chain(limited)
    try:
        async with serving(worker, concurrency=16):
            results = await asyncio.gather(
                *(caller.run({}, run_id=f"held-{i}", timeout=60) for i in range(16))
            )
    finally:
        await caller.stop()
        await worker.stop()
    assert results == [uninterrupted_result()] * 16
    assert len(held) >= 16 * 10  # each step asked
    assert any(held)  # one commit pending at a step's start: it was held back


@pytest.mark.server
async def test_a_run_id_that_completed_returns_its_result_and_publishes_nothing(
    deployment: Deployment,
) -> None:
    caller, worker = make_chain(), make_chain()
    try:
        async with serving(worker):
            first = await caller.run({}, run_id="once", timeout=20)
        again = await caller.run({}, run_id="once", timeout=5)
        with pytest.raises(RunExistsError, match="different input"):
            await caller.run({"other": True}, run_id="once", timeout=5)
        await caller.checkpointed_runs().create_queued({}, "pending")
        queued = r"run 'pending' exists and is the workers' .*await clutch.result\('pending'\)"
        with pytest.raises(RunExistsError, match=queued):  # not "interrupted": queued
            await caller.run({}, run_id="pending", timeout=5)
        other = Clutch("other", transport=apps.transport(), checkpoint=apps.config())

        @other.agent()
        async def ping(data: dict[str, Any]) -> dict[str, Any]:
            return data

        try:
            for run_id in ("once", "pending"):  # never the chain's result, nor its queue
                with pytest.raises(RunExistsError, match="belongs to pipeline 'chain', not"):
                    await other.run({}, run_id=run_id, timeout=5)
        finally:
            await other.stop()
    finally:
        await caller.stop()
        await worker.stop()
    assert first == again == uninterrupted_result()


@pytest.mark.server
async def test_submit_returns_once_the_run_is_stored_else_raises_what_stopped_it(
    deployment: Deployment, store: Any
) -> None:
    caller = make_chain()  # no worker: nothing moves the runs on
    try:
        await caller.checkpointed_runs().create_queued({}, "pending")
        with pytest.raises(RunExistsError, match=r"await clutch\.result"):
            await caller.submit({}, run_id="pending")  # raised here, not by the task
        task = await caller.submit({}, run_id="fresh")
        stored = await store.get_run("fresh")
        task.cancel()
    finally:
        await caller.stop()
    assert stored is not None and stored.status == "running"


@pytest.mark.server
async def test_the_sweeper_resumes_a_run_whose_message_was_lost(deployment: Deployment) -> None:
    caller, worker = make_chain(), make_chain()
    try:
        await caller.checkpointed_runs().create_queued({}, "lost")  # stored, never published
        async with serving(worker, sweep_interval=0.2, sweep_after=0.5):
            assert await caller.result("lost", timeout=20) == uninterrupted_result()
    finally:
        await caller.stop()
        await worker.stop()


async def _swept(
    older: Clutch,
    newer: Clutch,
    store: Any,
    run_id: str,
    said: str,
    caplog: pytest.LogCaptureFixture,
) -> list[int]:
    """Run ``run_id`` through steps 1 and 2 on ``older`` (hosting their agents only), then
    serve ``newer`` with quick sweeps until it logged ``said`` 4 times; their levels."""

    def told() -> list[int]:
        return [r.levelno for r in caplog.records if said in r.getMessage()]

    async with serving(older, agents=["first", "second"]):
        task = await older.submit({"x": 1}, run_id=run_id)
        await _run_when(store, run_id, lambda run: run.step_seq == 2 and _released(run))
    task.cancel()
    with caplog.at_level(logging.DEBUG, logger="nestegg"):
        async with serving(newer, sweep_interval=0.1, sweep_after=0.2):
            # each sweep points this worker at the run again, each claim at a new fence
            await wait_until(lambda: len(told()) >= 4, 20, "4 claims")
    return told()


@pytest.mark.server
async def test_a_step_whose_agent_the_clutch_lacks_is_warned_about_once_across_sweeps(
    deployment: Deployment, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    older, lacking = make_split(), make_split_without_third()
    lacks = "run 'lost' continues with agent 'third'"
    try:
        levels = await _swept(older, lacking, store, "lost", lacks, caplog)
    finally:
        await older.stop()
        await lacking.stop()
    assert levels.count(logging.WARNING) == 1
    run = await store.get_run("lost")
    assert run is not None and run.status == "running" and run.step_seq == 2


class Split(BaseModel):
    """The data ``third`` gets, as a pydantic model."""

    x: int


class SplitWithPages(Split):
    """Split, changed since the run stored its data: a required field more."""

    pages: int


def split_typed(model: type[BaseModel]) -> Clutch:
    """Pipeline ``split`` whose ``third`` takes its data as ``model``."""
    split = apps.make_split_without_third()

    async def third(data: Any) -> dict[str, Any]:
        return {**data.model_dump(), "third": "typed"}

    third.__annotations__["data"] = model
    split.agent()(third)
    return split


@pytest.mark.server
async def test_a_step_whose_data_no_longer_fits_its_model_is_left_to_a_worker_whose_fits(
    deployment: Deployment, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    older, changed, fitting = make_split(), split_typed(SplitWithPages), split_typed(Split)
    misfit = (
        "run 'typed': the stored data of step 2 no longer fits the model SplitWithPages of "
        "agent 'third' (pages: Field required)"
    )
    try:
        levels = await _swept(older, changed, store, "typed", misfit, caplog)
        assert levels.count(logging.WARNING) == 1
        run = await store.get_run("typed")
        assert run is not None and (run.status, run.step_seq, run.error) == ("running", 2, None)
        async with serving(fitting, sweep_interval=0.1, sweep_after=0.2):
            result = await fitting.result("typed", timeout=20)
    finally:
        await older.stop()
        await changed.stop()
        await fitting.stop()
    assert result == {"x": 1, "third": "typed"}


def first_typed() -> Clutch:
    """Pipeline ``typed_first``: one agent, ``first``, which takes its data as a Split."""
    clutch = Clutch("typed_first", transport=apps.transport(), checkpoint=apps.config())

    @clutch.agent()
    async def first(data: Split) -> dict[str, Any]:
        return {"x": data.x}

    return clutch


@pytest.mark.server
async def test_a_new_run_whose_input_does_not_fit_the_first_agents_model_fails(
    deployment: Deployment, store: Any
) -> None:
    # a fresh run's input never fit the model: its step fails, as in a local run (the
    # run is not set aside as data a changed model no longer fits, which never ends)
    caller, worker = first_typed(), first_typed()
    try:
        async with serving(worker):
            with pytest.raises(RunFailedError) as failed:
                await caller.run({"nope": 1}, run_id="unfit", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()
    error = failed.value
    assert (error.run_id, error.agent, error.error_type) == ("unfit", "first", "ValidationError")
    run = await store.get_run("unfit")
    assert run is not None and run.status == "failed"


@pytest.mark.server
async def test_hooks_run_where_they_belong_and_on_step_once_per_step(
    deployment: Deployment,
) -> None:
    from tests.transport.apps import config, transport

    seen: dict[str, list[Any]] = {"request": [], "response": [], "step": []}

    async def on_request(request: dict[str, Any]) -> None:
        seen["request"].append(request)

    async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
        seen["response"].append(response)

    async def on_step(agent: str, data: Any, output: Any) -> None:
        seen["step"].append((agent, output["n"]))

    def build() -> Clutch:
        clutch = Clutch(
            "hooked",
            max_turns=4,
            transport=transport(),
            checkpoint=config(),
            on_request=on_request,
            on_response=on_response,
            on_step=on_step,
        )

        @clutch.agent()
        async def count(data: dict[str, Any]) -> dict[str, Any]:
            return {"n": data["n"] + 1}

        @clutch.agent()
        async def again(data: dict[str, Any]) -> dict[str, Any]:
            return {"n": data["n"] + 1}

        return clutch

    caller, worker = build(), build()
    try:
        async with serving(worker):
            result = await caller.run({"n": 0}, run_id="hooked", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()
    assert result == {"n": 2}
    assert seen["request"] == [{"clutch_id": "hooked", "input": {"n": 0}}]
    assert seen["response"] == [{"_clutch_response": True, "clutch_id": "hooked", "result": result}]
    assert seen["step"] == [("count", 1), ("again", 2)]


@pytest.mark.server
async def test_a_run_its_callers_on_request_refuses_is_stored_failed_for_no_worker_to_take(
    deployment: Deployment,
) -> None:
    from tests.transport.apps import config, transport

    requests: list[str] = []

    async def on_request(request: dict[str, Any]) -> None:
        requests.append(request["clutch_id"])
        if len(requests) == 1:
            raise PermissionError("not allowed")

    caller = Clutch("refused", transport=transport(), checkpoint=config(), on_request=on_request)

    @caller.agent()
    async def answer(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "answered": True}

    try:
        with pytest.raises(PermissionError, match="not allowed"):
            await caller.run({"q": 1}, run_id="refused", timeout=20)
        run = await caller.checkpointed_runs().store.get_run("refused")
        assert run is not None and (run.status, run.step_seq) == ("failed", 0)
        with pytest.raises(RunFailedError) as failed:
            await caller.result("refused", timeout=1)
        assert (failed.value.error_type, failed.value.error_message) == (
            "PermissionError",
            "not allowed",
        )
        assert await caller.list_interrupted() == []  # no sweeper takes it
        assert await caller.resume_latest("refused", here=True) == {"q": 1, "answered": True}
    finally:
        await caller.stop()
    assert requests == ["refused", "refused"]  # the resume awaited the hook again


@pytest.mark.server
@pytest.mark.parametrize("deployment", ["redis"], indirect=True)
async def test_a_caller_stopped_between_the_writes_of_its_refused_run_leaves_it_to_no_sweep(
    deployment: Deployment,
) -> None:
    """A refused run is stored in two writes (the store has none that creates a run with
    its first commit): the run, created failed with the hook's error, then its events.
    Stopped between them (its commit never answers), the run is failed all the same: no
    sweep or recover() takes it, and its resume awaits on_request again."""
    from tests.transport.apps import config, transport

    requests: list[str] = []

    async def on_request(request: dict[str, Any]) -> None:
        requests.append(request["clutch_id"])
        if len(requests) == 1:
            raise PermissionError("not allowed")

    def build() -> Clutch:
        clutch = Clutch("torn", transport=transport(), checkpoint=config(), on_request=on_request)

        @clutch.agent()
        async def answer(data: dict[str, Any]) -> dict[str, Any]:
            return {**data, "answered": True}

        return clutch

    caller, worker = build(), build()
    store = caller.checkpointed_runs().store
    reached = asyncio.Event()

    async def never(commit: Any) -> None:
        reached.set()
        await asyncio.Event().wait()

    store.commit = never  # type: ignore[method-assign]
    try:
        task = asyncio.ensure_future(caller.run({"q": 1}, run_id="torn", timeout=20))
        await asyncio.wait_for(reached.wait(), 10)
        task.cancel()  # the caller's process dies before its second write
        with contextlib.suppress(asyncio.CancelledError, PermissionError):
            await task
        run = await worker.checkpointed_runs().store.get_run("torn")
        assert run is not None and (run.status, run.step_seq, run.event_seq) == ("failed", 0, 0)
        assert await Worker(worker, worker.transport, sweep_after=0.0).sweep() == []
        assert await worker.recover() == {}
        assert await worker.list_interrupted() == []
        assert requests == ["torn"]
        assert await worker.resume_latest("torn", here=True) == {"q": 1, "answered": True}
    finally:
        await caller.stop()
        await worker.stop()
    assert requests == ["torn", "torn"]  # the resume awaited the hook again


@pytest.mark.server
async def test_a_queued_run_resumed_by_a_clutch_without_workers_awaits_on_request_once(
    deployment: Deployment,
) -> None:
    """The caller stored it once its hook passed: a local resume does not ask again."""
    from tests.transport.apps import config, transport

    requests: list[str] = []

    async def on_request(request: dict[str, Any]) -> None:
        requests.append(request["clutch_id"])

    def build(**options: Any) -> Clutch:
        clutch = Clutch("asked-once", checkpoint=config(), on_request=on_request, **options)

        @clutch.agent()
        async def answer(data: dict[str, Any]) -> dict[str, Any]:
            return {**data, "answered": True}

        return clutch

    caller, local = build(transport=transport()), build()
    try:
        task = await caller.submit({"q": 1}, run_id="queued")  # no worker takes it
        task.cancel()
        assert await local.resume_latest("queued") == {"q": 1, "answered": True}
    finally:
        await caller.stop()
        await local.stop()
    assert requests == ["queued"]


@pytest.mark.server
async def test_a_run_whose_slow_on_request_refuses_it_is_never_swept_to_a_worker(
    deployment: Deployment,
) -> None:
    from tests.transport.apps import config, transport

    answered: list[Any] = []

    async def on_request(request: dict[str, Any]) -> None:
        await asyncio.sleep(1.0)  # longer than the sweep waits for an untouched run
        raise PermissionError("not allowed")

    def build() -> Clutch:
        clutch = Clutch(
            "slow-gate", transport=transport(), checkpoint=config(), on_request=on_request
        )

        @clutch.agent()
        async def answer(data: dict[str, Any]) -> dict[str, Any]:
            answered.append(data)
            return {**data, "answered": True}

        return clutch

    caller, worker = build(), build()
    try:
        async with serving(worker, sweep_interval=0.1, sweep_after=0.2):
            with pytest.raises(PermissionError, match="not allowed"):
                await caller.run({"q": 1}, run_id="gated", timeout=20)
            await asyncio.sleep(0.5)  # sweeps that would find it
        run = await caller.checkpointed_runs().store.get_run("gated")
        assert run is not None and (run.status, run.step_seq) == ("failed", 0)
        with pytest.raises(RunFailedError, match="PermissionError: not allowed"):
            await caller.result("gated", timeout=1)
    finally:
        await caller.stop()
        await worker.stop()
    assert answered == []


@pytest.mark.server
async def test_a_selector_pipeline_routes_each_step_to_a_worker_hosting_its_agent(
    deployment: Deployment,
) -> None:
    from nestegg import Strategy
    from tests.transport.apps import config, transport

    asked: list[int] = []
    ran: list[tuple[str, str]] = []

    def build(tag: str) -> Clutch:
        clutch = Clutch("picky", Strategy.SELECTOR, transport=transport(), checkpoint=config())

        @clutch.selector
        async def choose(data: dict[str, Any]) -> str | None:
            asked.append(data["n"])
            return None if data["n"] >= 4 else ("even", "odd")[data["n"] % 2]

        @clutch.agent()
        async def even(data: dict[str, Any]) -> dict[str, Any]:
            ran.append(("even", tag))
            return {"n": data["n"] + 1}

        @clutch.agent()
        async def odd(data: dict[str, Any]) -> dict[str, Any]:
            ran.append(("odd", tag))
            return {"n": data["n"] + 1}

        return clutch

    caller, evens, odds = build("caller"), build("evens"), build("odds")
    try:
        async with serving(evens, agents=["even"]), serving(odds, agents=["odd"]):
            result = await caller.run({"n": 0}, run_id="picky", timeout=20)
    finally:
        for clutch in (caller, evens, odds):
            await clutch.stop()
    assert result == {"n": 4}
    assert ran == [("even", "evens"), ("odd", "odds"), ("even", "evens"), ("odd", "odds")]
    assert asked[-1] == 4 and set(asked) == {0, 1, 2, 3, 4}


@pytest.mark.server
async def test_a_selector_that_raises_on_a_worker_fails_the_run_and_no_sweep_takes_it_up(
    deployment: Deployment,
) -> None:
    from nestegg import Strategy
    from tests.transport.apps import config, transport

    asked: list[int] = []

    def build() -> Clutch:
        clutch = Clutch("picker", Strategy.SELECTOR, transport=transport(), checkpoint=config())

        @clutch.selector
        async def choose(data: dict[str, Any]) -> str | None:
            asked.append(data["n"])
            if data["n"] >= 1:
                raise LookupError(f"no route at n={data['n']}")
            return "step"

        @clutch.agent()
        async def step(data: dict[str, Any]) -> dict[str, Any]:
            return {"n": data["n"] + 1}

        return clutch

    caller, worker = build(), build()
    try:
        async with serving(worker, sweep_interval=0.1, sweep_after=0.2):
            with pytest.raises(RunFailedError) as failed:
                await caller.run({"n": 0}, run_id="broken-pick", timeout=20)
            await asyncio.sleep(0.5)  # sweeps that would find it
        store = caller.checkpointed_runs().store
        run = await store.get_run("broken-pick")
        kinds = [event.kind for event in await store.read_events("broken-pick")]
    finally:
        await caller.stop()
        await worker.stop()
    assert str(failed.value) == "run 'broken-pick' failed in selector: LookupError: no route at n=1"
    assert run is not None and (run.status, run.step_seq) == ("failed", 1)
    assert kinds[-2:] == ["step_failed", "run_failed"]
    assert asked == [0, 1]  # asked once at step 2: not again by a sweep


@pytest.mark.server
async def test_workers_time_claims_steps_and_releases_by_the_checkpoint_clock(
    deployment: Deployment,
) -> None:
    clock = FakeClock(1_700_000_000.0)  # behind the wall clock: a lease from it looks held
    caller, edges, middle = make_split(clock), make_split(clock), make_split(clock)
    try:
        async with serving(edges, agents=["first", "third"]), serving(middle, agents=["second"]):
            result = await caller.run({"x": 1}, run_id="timed", timeout=20)
        store = await caller._book().ready()
        run = await store.get_run("timed")
        events = await store.read_events("timed")
    finally:
        for clutch in (caller, edges, middle):
            await clutch.stop()
    assert set(result) == {"x", "first", "second", "third"}
    assert run is not None and run.updated_at == clock.now
    assert {event.at for event in events} == {clock.now}


@pytest.mark.server
async def test_a_redelivered_message_stops_waiting_once_a_later_claim_holds_its_run(
    deployment: Deployment,
) -> None:
    caller, worker = make_chain(), make_chain()
    deliveries = caller.transport.consume([channel_name("chain", "ping")], hold=30.0)
    try:
        await caller.submit({}, run_id="held")
        await (await asyncio.wait_for(anext(deliveries), 10)).requeue()
        redelivered = await asyncio.wait_for(anext(deliveries), 10)
        store = await caller._book().ready()
        now = time.time()
        taker = Owner(host="elsewhere", pid=1, started="1")  # went on with the run, alive
        await store.claim_run("held", 1, taker, now + 30, now)
        waiting = asyncio.ensure_future(Worker(worker, worker.transport).runner.handle(redelivered))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # its holder may be the dead worker that took the message
        other = Owner(host="elsewhere", pid=2, started="2")  # the next turn's worker
        await store.claim_run("held", 2, other, now + 30, now)
        await asyncio.wait_for(waiting, 5)  # dropped: that holder has a message of its own
        run = await store.get_run("held")
    finally:
        await deliveries.aclose()  # type: ignore[attr-defined]
        await caller.stop()
        await worker.stop()
    assert run is not None and (run.fence, run.owner) == (3, other)


@pytest.mark.server
async def test_a_run_that_no_worker_takes_times_out_saying_so(deployment: Deployment) -> None:
    caller = make_chain()  # no worker: the first step waits in its channel
    try:
        with pytest.raises(TimeoutError) as late:
            await caller.run({}, run_id="unserved", timeout=0.5)
    finally:
        await caller.stop()
    assert type(late.value) is TimeoutError
    assert str(late.value) == (
        "no worker took the first step of run 'unserved' within 0.5 s: is a worker of "
        "pipeline 'chain' running (nestegg worker module:attr), on this caller's store (a "
        "worker on another store drops the step, with a warning)? The run is stored, and a "
        "worker that starts takes it: await clutch.result('unserved') for its outcome; to "
        "wait longer, pass timeout=None (as long as the run takes) or a larger timeout"
    )


@pytest.mark.server
async def test_a_run_that_a_worker_took_times_out_saying_it_goes_on(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.slow = 30.0  # its first step outlasts the wait
    deployment.apply(monkeypatch)
    caller, worker = make_slow(), make_slow()
    try:
        async with serving(worker, grace=0.0):
            with pytest.raises(TimeoutError) as late:
                await caller.run({}, run_id="slow-one", timeout=1.5)
    finally:
        await caller.stop()
        await worker.stop()
    assert str(late.value) == (
        "run 'slow-one' did not finish within 1.5 s (0 steps committed by the workers so "
        "far); it goes on: await clutch.result('slow-one') for its outcome; to wait longer, "
        "pass timeout=None (as long as the run takes) or a larger timeout"
    )


@pytest.mark.server
@pytest.mark.parametrize(
    ("error", "said"),
    [
        (ConfigurationError("the cursor cannot be restored"), "giving it back"),
        (StaleOwnerError("run 'hit' was taken over by another owner"), "dropping the message"),
    ],
)
async def test_a_worker_that_cannot_take_a_step_now_gives_it_back_or_drops_it_and_goes_on(
    deployment: Deployment,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: Exception,
    said: str,
) -> None:
    """An error of no store or broker while a worker takes a step: the message is given
    back (or dropped, when another process has the run, for a sweep to point at it again),
    never left unanswered with a traceback; the run completes."""
    from nestegg.transport.steps import StepRunner

    prepare = StepRunner._prepare
    raised: list[Exception] = []

    async def once(self: StepRunner, *args: Any) -> Any:
        if not raised:
            raised.append(error)
            raise error
        return await prepare(self, *args)

    monkeypatch.setattr(StepRunner, "_prepare", once)
    caller, worker = make_chain(), make_chain()
    try:
        with caplog.at_level(logging.INFO, logger="nestegg"):
            async with serving(worker, sweep_interval=0.1, sweep_after=0.3):
                result = await caller.run({"n": 0}, run_id="hit", timeout=20)
    finally:
        await caller.stop()
        await worker.stop()
    assert result is not None and raised == [error]
    assert any(said in record.getMessage() for record in caplog.records)
    assert not any(record.exc_info for record in caplog.records)
