"""The run lifecycle: run() with new and existing ids, ownership, listing, recovery and
manual checkpoints."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

import nestegg
from nestegg import Clutch, get_context
from nestegg.checkpoint.admission import same_input
from nestegg.checkpoint.codec import TAG, encode_value, seal
from nestegg.checkpoint.formats import parse_failure
from nestegg.checkpoint.heartbeat import heartbeats
from nestegg.checkpoint.ownership import host_id, process_start_token
from nestegg.checkpoint.records import Commit, Owner, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.constants import (
    COMPLETED,
    FAILED,
    RUN_CANCELLED,
    RUN_FAILED,
    RUN_STARTED,
    STEP_STARTED,
)
from nestegg.errors import (
    CheckpointFallbackWarning,
    CheckpointNotFoundError,
    ConfigurationError,
    NoActiveRunError,
    RunExistsError,
    RunFailedError,
    RunLockedError,
    RunNotFoundError,
    RunWaiting,
)
from nestegg.testing.builders import make_run

from .conftest import Flaky, Pipeline, Tamper, config, replace_agent, stored_view, wait_for

FOREIGN_HOST = "elsewhere#00000000"


async def take_over(store: CheckpointStorage, run_id: str, owner: Owner, lease: float) -> None:
    """Make ``owner`` the run's owner, its lease ending ``lease`` seconds from now (a failed
    run reopened, as its resume does)."""
    run = await store.get_run(run_id)
    assert run is not None
    now = time.time()
    await store.claim_run(run_id, run.fence, owner, now + lease, now, reopen=True)


async def failed_run(store: CheckpointStorage, run_id: str) -> Pipeline:
    """A pipeline a, b, c whose run ``run_id`` failed at b."""
    pipeline = Pipeline(store)
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id=run_id)
    return pipeline


# ------------------------------------------------------------------------- run()


async def test_run_of_a_completed_run_returns_its_result_without_executing(
    checkpoint_store: CheckpointStorage,
    reopen_store: Callable[[], Awaitable[CheckpointStorage]],
) -> None:
    first = Pipeline(checkpoint_store)
    assert await first.clutch.run([], run_id="done") == ["a", "b", "c"]
    before = await stored_view(checkpoint_store, "done")

    again = Pipeline(checkpoint_store)
    assert await again.clutch.run([], run_id="done") == ["a", "b", "c"]
    restarted = Pipeline(await reopen_store())
    assert await restarted.clutch.run([], run_id="done") == ["a", "b", "c"]
    assert await restarted.clutch.resume_latest("done") == ["a", "b", "c"]

    assert again.calls == [] and restarted.calls == []
    assert await stored_view(checkpoint_store, "done") == before


async def test_run_of_a_completed_run_with_another_input_raises_run_exists(
    checkpoint_store: CheckpointStorage,
    reopen_store: Callable[[], Awaitable[CheckpointStorage]],
) -> None:
    first = Pipeline(checkpoint_store)
    assert await first.clutch.run(["alice"], run_id="fixed") == ["alice", "a", "b", "c"]
    before = await stored_view(checkpoint_store, "fixed")

    for store in (checkpoint_store, await reopen_store()):
        again = Pipeline(store)
        with pytest.raises(RunExistsError) as raised:
            await again.clutch.run(["bob"], run_id="fixed")
        assert again.calls == []
        message = str(raised.value)
        assert raised.value.run_id == "fixed"
        assert "completed" in message and "different input" in message
        assert "run_id=" in message and "delete_run('fixed')" in message
        with pytest.raises(RunExistsError, match="different input"):
            await (await again.clutch.submit(["alice", "bob"], run_id="fixed")).result(5)
        with pytest.raises(RunExistsError, match="different input"):
            _ = [event async for event in again.clutch.stream([], run_id="fixed")]
        assert await again.clutch.run(["alice"], run_id="fixed") == ["alice", "a", "b", "c"]
    assert await stored_view(checkpoint_store, "fixed") == before


async def test_run_under_an_id_of_another_pipelines_run_is_refused_whatever_its_status(
    checkpoint_store: CheckpointStorage,
    reopen_store: Callable[[], Awaitable[CheckpointStorage]],
) -> None:
    alpha = Pipeline(checkpoint_store, name="alpha")
    assert await alpha.clutch.run([], run_id="shared") == ["a", "b", "c"]
    failing = Pipeline(checkpoint_store, name="alpha")
    failing.fail.add("b")
    with pytest.raises(Flaky):
        await failing.clutch.run([], run_id="broken")
    before = [await stored_view(checkpoint_store, run_id) for run_id in ("shared", "broken")]

    for store in (checkpoint_store, await reopen_store()):
        beta = Pipeline(store, name="beta")
        for run_id in ("shared", "broken"):  # completed with the same input, failed
            message = (
                f"run {run_id!r} exists and belongs to pipeline 'alpha', not 'beta': a run "
                "id names one run of one pipeline; pass a new id for this run "
                "(run(input, run_id=...))"
            )
            with pytest.raises(RunExistsError, match=re.escape(message)) as raised:
                await beta.clutch.run([], run_id=run_id)
            assert raised.value.run_id == run_id
            with pytest.raises(RunExistsError, match=re.escape(message)):
                await (await beta.clutch.submit([], run_id=run_id)).result(5)
            with pytest.raises(RunExistsError, match=re.escape(message)):
                _ = [event async for event in beta.clutch.stream([], run_id=run_id)]
        assert beta.calls == []
    after = [await stored_view(checkpoint_store, run_id) for run_id in ("shared", "broken")]
    assert after == before


async def test_same_input_is_recognised_in_any_key_order_and_as_a_model(
    checkpoint_store: CheckpointStorage,
) -> None:
    from pydantic import BaseModel

    class Ticket(BaseModel):
        customer: str
        amount: float

    clutch = Clutch("keys", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def echo(data: dict[str, object]) -> dict[str, object]:
        return {**data, "seen": True}

    first = await clutch.run({"customer": "alice", "amount": 1.5}, run_id="k")
    assert await clutch.run({"amount": 1.5, "customer": "alice"}, run_id="k") == first
    assert await clutch.run(Ticket(customer="alice", amount=1.5), run_id="k") == first
    with pytest.raises(RunExistsError, match="different input"):
        await clutch.run({"customer": "alice", "amount": 2.5}, run_id="k")
    with pytest.raises(RunExistsError, match="different input"):
        await clutch.run({"customer": "alice", "amount": 1.5, "x": None}, run_id="k")


async def test_the_same_input_with_a_nan_in_it_gives_the_completed_result_in_any_key_order(
    checkpoint_store: CheckpointStorage,
) -> None:
    """NaN != NaN and a Decimal sNaN cannot be compared at all: the input is compared as
    the codec stores it, where two NaNs are one value."""
    clutch = Clutch("nans", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def echo(data: dict[str, object]) -> dict[str, object]:
        return {"seen": sorted(data)}

    given = {"a": 1, "n": float("nan"), "d": Decimal("NaN"), "s": Decimal("sNaN")}
    first = await clutch.run(given, run_id="nan")
    swapped = {"s": Decimal("sNaN"), "d": Decimal("NaN"), "n": float("nan"), "a": 1}
    assert await clutch.run(swapped, run_id="nan") == first
    with pytest.raises(RunExistsError, match="different input"):
        await clutch.run({**swapped, "a": True}, run_id="nan")  # 1 and True: two inputs
    with pytest.raises(RunExistsError, match="different input"):
        await clutch.run({**swapped, "d": Decimal("sNaN")}, run_id="nan")


def test_an_input_whose_set_another_process_iterates_in_another_order_is_the_same() -> None:
    def sealed(*items: str) -> bytes:
        return seal(orjson.dumps({"tags": {TAG: "set", "v": list(items)}, "n": 1}))

    run = dataclasses.replace(make_run("r"), input=sealed("x", "y", "z"))
    assert same_input(run, sealed("z", "x", "y"))
    assert not same_input(run, sealed("x", "y"))


async def test_a_model_as_the_result_is_its_dict_one_in_it_is_the_model_until_stored(
    checkpoint_store: CheckpointStorage,
) -> None:
    from pydantic import BaseModel

    class Quote(BaseModel):
        amount: float

    whole = Clutch("whole", checkpoint=config(checkpoint_store))
    inside = Clutch("inside", checkpoint=config(checkpoint_store))

    @whole.agent()
    async def quote(data: dict[str, object]) -> Quote:
        return Quote(amount=1.5)

    @inside.agent()
    async def wrap(data: dict[str, object]) -> dict[str, Quote]:
        return {"quote": Quote(amount=1.5)}

    assert await whole.run({}, run_id="w") == {"amount": 1.5}  # dumped, as between agents
    assert await whole.run({}, run_id="w") == {"amount": 1.5}
    assert await whole.resume_latest("w") == {"amount": 1.5}
    first = await inside.run({}, run_id="i")
    assert first == {"quote": Quote(amount=1.5)} and isinstance(first["quote"], Quote)
    assert await inside.run({}, run_id="i") == {"quote": {"amount": 1.5}}  # as stored
    assert await inside.resume_latest("i") == {"quote": {"amount": 1.5}}


async def test_run_of_a_failed_run_raises_run_exists_naming_resume_latest(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "broken")
    pipeline.calls.clear()
    before = await stored_view(checkpoint_store, "broken")

    with pytest.raises(RunExistsError, match=r"resume_latest\('broken'\)") as raised:
        await pipeline.clutch.run([], run_id="broken")

    assert raised.value.run_id == "broken"
    assert "failed" in str(raised.value)
    assert "different input" not in str(raised.value)
    message = (
        "run 'broken' exists with status 'failed': it was started with a different input; "
        "continue it with resume_latest('broken'), or pass a new id for this input"
    )
    with pytest.raises(RunExistsError, match=re.escape(message)):
        await pipeline.clutch.run(["other"], run_id="broken")
    assert pipeline.calls == []
    assert await stored_view(checkpoint_store, "broken") == before


async def test_run_of_a_cancelled_run_raises_run_exists(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    pipeline.gate("b")
    task = await pipeline.clutch.submit([], run_id="stopped")
    await wait_for(pipeline.entered["b"])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    with pytest.raises(RunExistsError, match="resume_latest"):
        await pipeline.clutch.run([], run_id="stopped")
    [info] = await pipeline.clutch.list_runs()
    assert info.status == "cancelled"


async def test_run_of_an_interrupted_run_raises_run_exists(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "orphan")
    gone = Owner(host=FOREIGN_HOST, pid=12345, started="1")
    await take_over(checkpoint_store, "orphan", gone, lease=-1.0)

    with pytest.raises(RunExistsError, match=r"resume_latest\('orphan'\)") as raised:
        await pipeline.clutch.run([], run_id="orphan")
    assert "interrupted" in str(raised.value) and "running" not in str(raised.value)
    assert [r.run_id for r in await pipeline.clutch.list_interrupted()] == ["orphan"]


async def test_run_of_a_run_this_process_executes_raises_run_locked(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    release = pipeline.gate("b")
    task = await pipeline.clutch.submit([], run_id="busy")
    await wait_for(pipeline.entered["b"])

    with pytest.raises(RunLockedError) as raised:
        await pipeline.clutch.run([], run_id="busy")
    assert raised.value.run_id == "busy"
    with pytest.raises(RunLockedError):
        await pipeline.clutch.resume_latest("busy")
    with pytest.raises(RunLockedError):
        await pipeline.clutch.delete_run("busy")
    other = Pipeline(checkpoint_store)
    with pytest.raises(RunLockedError):
        await other.clutch.run([], run_id="busy")
    assert await pipeline.clutch.list_interrupted() == []

    release.set()
    assert await task.result(timeout=5) == ["a", "b", "c"]
    assert pipeline.calls == ["a", "b", "c"] and other.calls == []


async def test_run_owned_by_another_live_process_raises_run_locked(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "theirs")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        token = process_start_token(child.pid)
        assert token is not None
        await take_over(checkpoint_store, "theirs", Owner(host_id(), child.pid, token), lease=-1.0)
        with pytest.raises(RunLockedError):
            await pipeline.clutch.run([], run_id="theirs")
        with pytest.raises(RunLockedError):
            await pipeline.clutch.resume_latest("theirs")
        assert await pipeline.clutch.list_interrupted() == []
    finally:
        child.kill()
        child.wait()
    # Its process is gone: the run is interrupted and may be resumed at once.
    assert [r.run_id for r in await pipeline.clutch.list_interrupted()] == ["theirs"]
    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("theirs") == ["a", "b", "c"]


async def test_run_whose_owner_was_killed_is_interrupted_before_its_parent_reaps_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "zombie")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        token = process_start_token(child.pid)
        assert token is not None
        await take_over(checkpoint_store, "zombie", Owner(host_id(), child.pid, token), lease=60.0)
        os.kill(child.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            await asyncio.sleep(0.01)
        # not reaped yet (no wait()): its pid still exists, as a zombie
        assert process_start_token(child.pid) is None
        assert [r.run_id for r in await pipeline.clutch.list_interrupted()] == ["zombie"]
        pipeline.fail.clear()
        assert await pipeline.clutch.resume_latest("zombie") == ["a", "b", "c"]
    finally:
        child.kill()
        child.wait()


async def test_run_owned_elsewhere_is_locked_until_its_lease_expires(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "remote")
    remote = Owner(host=FOREIGN_HOST, pid=1, started="1")
    await take_over(checkpoint_store, "remote", remote, lease=60.0)
    with pytest.raises(RunLockedError):
        await pipeline.clutch.run([], run_id="remote")
    with pytest.raises(RunLockedError):
        await pipeline.clutch.resume_latest("remote")

    await take_over(checkpoint_store, "remote", remote, lease=-1.0)
    pipeline.fail.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("remote") == ["a", "b", "c"]
    assert pipeline.calls == ["b", "c"]


async def test_run_id_argument_overrides_the_configured_one(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, run_id="configured")
    assert await pipeline.clutch.run(["x"], run_id="given") == ["x", "a", "b", "c"]
    assert [r.run_id for r in await pipeline.clutch.list_runs()] == ["given"]
    assert await checkpoint_store.get_run("configured") is None

    assert await pipeline.clutch.run(["y"]) == ["y", "a", "b", "c"]
    assert {r.run_id for r in await pipeline.clutch.list_runs()} == {"given", "configured"}
    # The configured id now names a completed run: run() of its input returns its result,
    # run() of another input is refused.
    assert await pipeline.clutch.run(["y"]) == ["y", "a", "b", "c"]
    with pytest.raises(RunExistsError, match=r"different input.*delete_run\('configured'\)"):
        await pipeline.clutch.run(["z"])
    assert pipeline.calls == ["a", "b", "c"] * 2


async def test_run_without_a_run_id_generates_a_new_one_each_time(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    seen: list[str] = []

    async def remember(data: list[str]) -> list[str]:
        seen.append(get_context().run_id)
        return data

    pipeline.clutch.agent()(remember)
    for index in range(3):
        assert await pipeline.clutch.run([str(index)]) == [str(index), "a", "b", "c"]

    assert len(set(seen)) == 3
    runs = await pipeline.clutch.list_runs()
    assert sorted(r.run_id for r in runs) == sorted(seen)
    assert all(r.status == "completed" and r.steps == 4 for r in runs)
    assert pipeline.calls == ["a", "b", "c"] * 3


async def test_submit_and_stream_take_a_run_id(checkpoint_store: CheckpointStorage) -> None:
    pipeline = Pipeline(checkpoint_store)
    task = await pipeline.clutch.submit([], run_id="submitted")
    assert await task.result(timeout=5) == ["a", "b", "c"]

    steps = [event.step async for event in pipeline.clutch.stream(["s"], run_id="streamed")]
    assert steps == ["a", "b", "c", "_result"]
    statuses = {r.run_id: r.status for r in await pipeline.clutch.list_runs()}
    assert statuses == {"submitted": "completed", "streamed": "completed"}


async def test_run_id_needs_checkpointing() -> None:
    clutch = Clutch("plain")

    @clutch.agent()
    async def echo(data: str) -> str:
        return data

    with pytest.raises(ConfigurationError, match="checkpoint"):
        await clutch.run("x", run_id="r")
    for call in (
        clutch.resume_latest("r"),
        clutch.resume("c"),
        clutch.list_runs(),
        clutch.cleanup(),
    ):
        with pytest.raises(ConfigurationError, match="checkpoint"):
            await call


# ------------------------------------------------------------ listing and deleting


async def test_list_runs_filters_by_status_and_pipeline(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "r-failed")
    pipeline.fail.clear()
    await pipeline.clutch.run([], run_id="r-done")
    other = Pipeline(checkpoint_store, name="other-pipeline")
    await other.clutch.run([], run_id="r-other")

    assert {r.run_id for r in await pipeline.clutch.list_runs()} == {"r-failed", "r-done"}
    assert [r.run_id for r in await pipeline.clutch.list_runs("failed")] == ["r-failed"]
    assert [r.run_id for r in await pipeline.clutch.list_runs("completed")] == ["r-done"]
    assert await pipeline.clutch.list_runs("running") == []
    [failed] = await pipeline.clutch.list_runs("failed")
    assert failed.pipeline == "pipeline"
    assert failed.error is not None and failed.error["type"] == "Flaky"
    assert failed.error["agent"] == "b"


async def test_list_runs_refuses_an_unknown_status_as_the_command_does(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="r1")
    message = "unknown status 'bogus'; one of running, completed, failed, cancelled, waiting"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        await pipeline.clutch.list_runs("bogus")  # it listed no runs
    with pytest.raises(ConfigurationError, match=r"list_interrupted\(\) lists"):
        await pipeline.clutch.list_runs("interrupted")
    await pipeline.clutch.checkpointed_runs().create_queued([], "q1")
    with pytest.raises(ConfigurationError, match=r"list_runs\('running'\) lists it"):
        await pipeline.clutch.list_runs("queued")  # not 'unknown status'
    [queued] = await pipeline.clutch.list_runs("running")
    assert (queued.run_id, queued.owner) == ("q1", None)
    assert [r.run_id for r in await pipeline.clutch.list_runs(COMPLETED)] == ["r1"]


async def test_events_and_checkpoints_of_an_unknown_run_raise_run_not_found(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="r1")
    for read in (pipeline.clutch.events, pipeline.clutch.list_checkpoints):
        with pytest.raises(RunNotFoundError, match="no run 'nope' in the store"):
            await read("nope")  # an empty list, as if the run had none
    assert await pipeline.clutch.events("r1") != []
    assert await pipeline.clutch.list_checkpoints("r1") != []


async def test_a_run_completed_after_a_failure_no_longer_reports_the_error(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = await failed_run(checkpoint_store, "recovered")
    [failed] = await pipeline.clutch.list_runs()
    assert failed.error is not None
    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest("recovered") == ["a", "b", "c"]
    [info] = await pipeline.clutch.list_runs()
    assert info.status == "completed"
    assert info.error is None


async def test_delete_run_removes_everything_of_the_run(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    await pipeline.clutch.run([], run_id="gone")
    await pipeline.clutch.run([], run_id="kept")
    [checkpoint, *_] = await pipeline.clutch.list_checkpoints("gone")

    assert await pipeline.clutch.delete_run("gone") is True
    assert await pipeline.clutch.delete_run("gone") is False
    assert await stored_view(checkpoint_store, "gone") == {
        "run": None,
        "steps": [],
        "checkpoints": [],
        "events": [],
    }
    with pytest.raises(CheckpointNotFoundError):
        await pipeline.clutch.get_checkpoint(checkpoint.checkpoint_id)
    with pytest.raises(RunNotFoundError):
        await pipeline.clutch.resume_latest("gone")
    assert [r.run_id for r in await pipeline.clutch.list_runs()] == ["kept"]
    assert await pipeline.clutch.run([], run_id="kept") == ["a", "b", "c"]


async def test_delete_run_of_another_pipelines_run_is_refused_and_deletes_nothing(
    checkpoint_store: CheckpointStorage,
) -> None:
    p, q = Pipeline(checkpoint_store, name="p"), Pipeline(checkpoint_store, name="q")
    assert await q.clutch.run([], run_id="q1") == ["a", "b", "c"]
    before = await stored_view(checkpoint_store, "q1")

    with pytest.raises(ConfigurationError) as refused:
        await p.clutch.delete_run("q1")
    assert str(refused.value) == "run 'q1' belongs to pipeline 'q', not 'p': it was not deleted"
    assert await stored_view(checkpoint_store, "q1") == before
    assert await p.clutch.delete_run("never") is False
    assert await q.clutch.delete_run("q1") is True


async def test_result_of_another_pipelines_run_is_refused(
    checkpoint_store: CheckpointStorage,
) -> None:
    p, q = Pipeline(checkpoint_store, name="p"), Pipeline(checkpoint_store, name="q")
    assert await q.clutch.run([], run_id="q1") == ["a", "b", "c"]
    with pytest.raises(ConfigurationError) as refused:
        await p.clutch.result("q1", timeout=5)
    assert str(refused.value) == (
        "run 'q1' belongs to pipeline 'q', not 'p': its result is not this pipeline's"
    )
    assert await q.clutch.result("q1", timeout=5) == ["a", "b", "c"]


async def test_reads_of_another_pipelines_run_are_refused(
    checkpoint_store: CheckpointStorage,
) -> None:
    p, q = Pipeline(checkpoint_store, name="p"), Pipeline(checkpoint_store, name="q")
    assert await q.clutch.run([], run_id="q1") == ["a", "b", "c"]
    checkpoint = (await q.clutch.list_checkpoints("q1"))[-1]
    refusals = {
        "events": ("its events are not this pipeline's", p.clutch.events("q1")),
        "history": ("its history is not this pipeline's", p.clutch.history("q1")),
        "list_checkpoints": ("its checkpoints are not listed", p.clutch.list_checkpoints("q1")),
        "get_checkpoint": (
            f"checkpoint {checkpoint.checkpoint_id!r} is not this pipeline's",
            p.clutch.get_checkpoint(checkpoint.checkpoint_id),
        ),
    }
    for name, (outcome, read) in refusals.items():
        with pytest.raises(ConfigurationError) as refused:
            await read
        assert str(refused.value) == f"run 'q1' belongs to pipeline 'q', not 'p': {outcome}", name
    assert (await q.clutch.history("q1")).run.run_id == "q1"
    assert [e.kind for e in await q.clutch.events("q1")][-1] == "run_completed"
    assert (await q.clutch.get_checkpoint(checkpoint.checkpoint_id)).data == ["a", "b", "c"]
    with pytest.raises(RunNotFoundError):
        await p.clutch.events("never")


# -------------------------------------------------------------------- recovery


async def test_recover_resumes_every_interrupted_run_of_the_pipeline(
    checkpoint_store: CheckpointStorage,
) -> None:
    gone = Owner(host=FOREIGN_HOST, pid=4242, started="1")
    pipeline = Pipeline(checkpoint_store)
    pipeline.fail.add("c")
    for run_id in ("i-1", "i-2"):
        with pytest.raises(Flaky):
            await pipeline.clutch.run([run_id], run_id=run_id)
        await take_over(checkpoint_store, run_id, gone, lease=-1.0)
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["f"], run_id="just-failed")
    other = Pipeline(checkpoint_store, name="other-pipeline")
    other.fail.add("a")
    with pytest.raises(Flaky):
        await other.clutch.run([], run_id="other-run")
    await take_over(checkpoint_store, "other-run", gone, lease=-1.0)

    assert sorted(r.run_id for r in await pipeline.clutch.list_interrupted()) == ["i-1", "i-2"]
    pipeline.fail.clear()
    pipeline.calls.clear()
    results = await pipeline.clutch.recover()

    assert results == {"i-1": ["i-1", "a", "b", "c"], "i-2": ["i-2", "a", "b", "c"]}
    assert pipeline.calls == ["c", "c"]
    assert await pipeline.clutch.list_interrupted() == []
    statuses = {r.run_id: r.status for r in await pipeline.clutch.list_runs()}
    assert statuses == {"i-1": "completed", "i-2": "completed", "just-failed": "failed"}
    assert [r.run_id for r in await other.clutch.list_interrupted()] == ["other-run"]


async def test_recover_leaves_a_run_queued_for_workers_to_them(
    checkpoint_store: CheckpointStorage,
) -> None:
    # A run a caller stored for workers that none took yet (shown queued) was listed as
    # interrupted and run by recover() in its own process, beside the workers' sweeps.
    pipeline = Pipeline(checkpoint_store)
    for run_id in ("lost", "queued"):
        await pipeline.clutch.checkpointed_runs().create_queued([run_id], run_id)
    worker = Owner(host=FOREIGN_HOST, pid=4242, started="1")  # took it, then died
    await take_over(checkpoint_store, "lost", worker, lease=-1.0)
    before = await stored_view(checkpoint_store, "queued")

    assert [r.run_id for r in await pipeline.clutch.list_interrupted()] == ["lost"]
    assert [r.run_id for r in await pipeline.clutch.list_resumable()] == ["lost"]
    assert await pipeline.clutch.recover() == {"lost": ["lost", "a", "b", "c"]}
    assert await stored_view(checkpoint_store, "queued") == before  # left to the workers
    assert await pipeline.clutch.resume_latest("queued") == ["queued", "a", "b", "c"]


# ------------------------------------------------------------ manual checkpoints


async def test_checkpoint_inside_an_agent_records_the_state_the_step_started_from(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, keep_latest=None)
    taken: list[str] = []

    async def b(data: list[str]) -> list[str]:
        pipeline.calls.append("b")
        get_context().metadata["b-started"] = True
        taken.append(await pipeline.clutch.checkpoint())
        return [*data, "b"]

    replace_agent(pipeline.clutch, b)

    assert await pipeline.clutch.run([], run_id="inside") == ["a", "b", "c"]
    [checkpoint_id] = taken
    state = await pipeline.clutch.get_checkpoint(checkpoint_id)
    assert state.seq == 1 and state.turn == 1
    assert state.data == ["a"] and state.next_agent == "b"
    assert state.checkpoint is not None and state.checkpoint.reason == "agent"
    infos = {c.checkpoint_id: c for c in await pipeline.clutch.list_checkpoints("inside")}
    assert infos[checkpoint_id].seq == 1

    pipeline.calls.clear()
    taken.clear()
    assert await pipeline.clutch.resume(checkpoint_id) == ["a", "b", "c"]
    assert pipeline.calls == ["b", "c"]


async def test_checkpoint_from_outside_is_taken_at_the_next_step_boundary(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b", "c", "d"), every_n_steps=100)
    release = pipeline.gate("b")
    task = await pipeline.clutch.submit([], run_id="outside")
    await wait_for(pipeline.entered["b"])

    request = asyncio.ensure_future(pipeline.clutch.checkpoint())
    await asyncio.sleep(0.05)
    assert not request.done()
    release.set()
    checkpoint_id = await asyncio.wait_for(request, 5)
    assert await task.result(timeout=5) == ["a", "b", "c", "d"]

    state = await pipeline.clutch.get_checkpoint(checkpoint_id)
    assert state.checkpoint is not None and state.checkpoint.reason == "manual"
    assert state.seq == 2 and state.data == ["a", "b"]
    pipeline.calls.clear()
    assert await pipeline.clutch.resume(checkpoint_id) == ["a", "b", "c", "d"]
    assert pipeline.calls == ["c", "d"]


async def test_checkpoint_from_outside_names_the_run_when_several_execute(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, every_n_steps=100)
    release = pipeline.gate("a")
    first = await pipeline.clutch.submit(["1"], run_id="one")
    second = await pipeline.clutch.submit(["2"], run_id="two")
    await wait_for(pipeline.entered["a"])
    await asyncio.sleep(0.05)

    with pytest.raises(NoActiveRunError):
        await pipeline.clutch.checkpoint()
    with pytest.raises(NoActiveRunError):
        await pipeline.clutch.checkpoint("three")
    request = asyncio.ensure_future(pipeline.clutch.checkpoint("two"))
    release.set()
    checkpoint_id = await asyncio.wait_for(request, 5)
    await first.result(timeout=5)
    await second.result(timeout=5)
    state = await pipeline.clutch.get_checkpoint(checkpoint_id)
    assert state.run_id == "two" and state.seq == 1 and state.data == ["2", "a"]


async def test_checkpoint_without_an_executing_run_raises_no_active_run(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store)
    with pytest.raises(NoActiveRunError):
        await pipeline.clutch.checkpoint()
    await pipeline.clutch.run([], run_id="finished")
    with pytest.raises(NoActiveRunError):
        await pipeline.clutch.checkpoint()
    with pytest.raises(NoActiveRunError):
        await pipeline.clutch.checkpoint("finished")


async def test_checkpoint_without_checkpointing_raises_configuration_error() -> None:
    clutch = Clutch("plain")
    inside: list[BaseException] = []
    release = asyncio.Event()
    entered = asyncio.Event()

    @clutch.agent()
    async def first(data: str) -> str:
        try:
            await clutch.checkpoint()
        except ConfigurationError as error:
            inside.append(error)
        entered.set()
        await release.wait()
        return data

    with pytest.raises(ConfigurationError, match="checkpoint"):
        await clutch.checkpoint()
    task = await clutch.submit("x")
    await wait_for(entered)
    with pytest.raises(ConfigurationError, match="checkpoint"):
        await clutch.checkpoint()
    release.set()
    assert await task.result(timeout=5) == "x"
    assert len(inside) == 1


class EndedByAnother(MemoryCheckpointStorage):
    """A memory store on which another process ends a run (in ``ends``) right before the
    next claim of it, after the claimer read it unfinished."""

    ends: str | None = None

    async def claim_run(
        self,
        run_id: str,
        expected_fence: int,
        owner: Owner,
        lease_until: float,
        now: float,
        *,
        reopen: bool = False,
    ) -> RunRecord:
        if self.ends is not None:
            status, self.ends = self.ends, None
            result = seal(encode_value(["by", "another"])) if status == COMPLETED else None
            await self.commit(Commit(run_id, expected_fence, status=status, result=result))
        return await super().claim_run(
            run_id, expected_fence, owner, lease_until, now, reopen=reopen
        )


@pytest.mark.parametrize("status", [COMPLETED, FAILED])
async def test_a_run_ended_by_another_process_after_it_was_read_is_not_reopened(
    status: str,
) -> None:
    store = EndedByAnother()
    gone = Owner(host=FOREIGN_HOST, pid=4242, started="1")
    pipeline = Pipeline(store)
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["r"], run_id="r")
    await take_over(store, "r", gone, lease=-1.0)  # interrupted: recover() resumes it
    pipeline.fail.clear()
    pipeline.calls.clear()
    store.ends = status
    outcomes = await pipeline.clutch.recover()
    stored = await store.get_run("r")
    assert stored is not None and stored.status == status and pipeline.calls == []
    if status == COMPLETED:  # its result, as resume_latest gives a completed run's
        assert outcomes == {"r": ["by", "another"]}
    else:  # left out, as a run another process took
        assert outcomes == {}
        store.ends = None
        assert await pipeline.clutch.resume_latest("r") == ["r", "a", "b", "c"]  # on purpose


# ---------------------------------------------------- submit() returns once the run is stored

SUBMIT_AND_EXIT = """
import asyncio, sys
from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig, open_store

clutch = Clutch("late", checkpoint=CheckpointConfig(storage=open_store(sys.argv[1])))

@clutch.agent()
async def slow(data: dict) -> dict:
    await asyncio.sleep(30)
    return {**data, "slow": True}

async def main() -> None:
    await clutch.submit({"n": 1}, run_id="left")  # the loop ends right after

asyncio.run(main())
"""


def test_a_run_submitted_as_the_loop_ends_is_stored_and_resumable(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'n.db'}"
    subprocess.run([sys.executable, "-c", SUBMIT_AND_EXIT, url], check=True, timeout=60)

    async def check() -> None:
        from nestegg.checkpoint import CheckpointConfig, open_store

        store = open_store(url)
        clutch = Clutch("late", checkpoint=CheckpointConfig(storage=store))

        @clutch.agent()
        async def slow(data: dict[str, object]) -> dict[str, object]:
            return {**data, "slow": True}

        run = await store.get_run("left")
        assert run is not None and run.status == "cancelled"  # the loop's end cancelled it
        assert await clutch.resume_latest("left") == {"n": 1, "slow": True}
        await store.close()

    asyncio.run(check())


async def test_submit_raises_what_refuses_the_run_before_it_returns(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b"))
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="taken")
    with pytest.raises(RunExistsError, match="failed"):
        await pipeline.clutch.submit([], run_id="taken")
    pipeline.fail.clear()
    gate = pipeline.gate("a")
    task = await pipeline.clutch.submit([], run_id="fresh")
    assert await checkpoint_store.get_run("fresh") is not None  # stored before it returned
    gate.set()
    assert await task.result(timeout=5) == ["a", "b"]


def beating() -> int:
    """The runs whose lease is still renewed (each test has its own loop)."""
    return heartbeats().beating


async def test_a_run_whose_on_request_hook_raises_leaves_no_heartbeat_behind(
    checkpoint_store: CheckpointStorage,
) -> None:
    async def refuse(request: dict[str, object]) -> None:
        raise Flaky("refused")

    clutch = Clutch("hooked", checkpoint=config(checkpoint_store), on_request=refuse)

    @clutch.agent()
    async def a(data: str) -> str:
        return data

    with pytest.raises(Flaky):
        await clutch.run("x", run_id="hooked")
    assert beating() == 0  # else its lease is renewed as long as the process lives


def hooked(
    store: CheckpointStorage, refusals: int, broken: set[str] | None = None
) -> tuple[Clutch, list[str], list[str]]:
    """A Clutch of agents a, b (those in ``broken`` raise Flaky) whose on_request raises Flaky
    ``refusals`` times, then passes; the run ids its hook was awaited for, and the
    agents that ran."""
    requests: list[str] = []
    ran: list[str] = []

    async def gate(request: dict[str, object]) -> None:
        requests.append(str(request["clutch_id"]))
        if len(requests) <= refusals:
            raise Flaky("not allowed")

    clutch = Clutch("hooked", checkpoint=config(store), on_request=gate)

    async def step(name: str, data: list[str]) -> list[str]:
        ran.append(name)
        if broken and name in broken:
            raise Flaky(f"{name} broke")
        return [*data, name]

    @clutch.agent()
    async def a(data: list[str]) -> list[str]:
        return await step("a", data)

    @clutch.agent()
    async def b(data: list[str]) -> list[str]:
        return await step("b", data)

    return clutch, requests, ran


async def test_a_run_whose_on_request_hook_raises_is_stored_failed_and_its_resume_awaits_it(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch, requests, ran = hooked(checkpoint_store, refusals=2)
    with pytest.raises(Flaky, match="not allowed"):
        await clutch.run([], run_id="refused")
    run = await checkpoint_store.get_run("refused")
    assert run is not None and (run.status, run.step_seq) == (FAILED, 0)
    assert run.error is not None
    failure = parse_failure(run.error, "error")
    assert (failure["type"], failure["message"]) == ("Flaky", "not allowed")
    assert (failure["agent"], failure["hook"]) == (None, "on_request")
    events = [e.kind for e in await checkpoint_store.read_events("refused")]
    assert (events[0], events[-1]) == (RUN_STARTED, RUN_FAILED)  # as when a's step fails
    with pytest.raises(RunFailedError) as failed:
        await clutch.result("refused", timeout=1)
    assert (failed.value.error_type, failed.value.error_message) == ("Flaky", "not allowed")
    assert await clutch.list_interrupted() == [] and await clutch.recover() == {}

    with pytest.raises(Flaky, match="not allowed"):  # its resume asks the hook again
        await clutch.resume_latest("refused")
    run = await checkpoint_store.get_run("refused")
    assert run is not None and run.status == FAILED
    assert await clutch.resume_latest("refused") == ["a", "b"]
    assert requests == ["refused"] * 3 and ran == ["a", "b"]


async def test_a_run_that_died_in_its_on_request_hook_awaits_it_when_recovered(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch, requests, ran = hooked(checkpoint_store, refusals=1)
    with pytest.raises(Flaky):
        await clutch.run([], run_id="died")
    gone = Owner(host=FOREIGN_HOST, pid=4242, started="1")
    await take_over(checkpoint_store, "died", gone, lease=-1.0)  # as if it died in the hook
    assert await clutch.recover() == {"died": ["a", "b"]}
    assert requests == ["died", "died"] and ran == ["a", "b"]


async def test_a_run_killed_in_its_on_request_hook_before_any_event_awaits_it_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    requests: list[object] = []

    async def gate(request: dict[str, object]) -> None:
        requests.append(request["clutch_id"])
        if len(requests) == 1:  # its process dies here: another owner, gone, holds it
            gone = Owner(host=FOREIGN_HOST, pid=4242, started="1")
            await take_over(checkpoint_store, "killed", gone, lease=-1.0)
            raise Flaky("killed")

    clutch = Clutch("hooked", checkpoint=config(checkpoint_store), on_request=gate)

    @clutch.agent()
    async def a(data: str) -> str:
        return data + "!"

    with pytest.raises(Flaky):
        await clutch.run("x", run_id="killed")
    run = await checkpoint_store.get_run("killed")
    assert run is not None and (run.status, run.event_seq, run.error) == ("running", 0, None)
    assert await clutch.recover() == {"killed": "x!"}
    assert requests == ["killed", "killed"]


async def test_a_resume_from_a_recorded_step_does_not_await_on_request(
    checkpoint_store: CheckpointStorage,
) -> None:
    broken = {"b"}
    clutch, requests, ran = hooked(checkpoint_store, refusals=0, broken=broken)
    with pytest.raises(Flaky, match="b broke"):
        await clutch.run([], run_id="later")
    broken.clear()
    assert await clutch.resume_latest("later") == ["a", "b"]
    assert requests == ["later"] and ran == ["a", "b", "b"]


async def test_a_resume_after_the_first_agent_raised_does_not_await_on_request_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    broken = {"a"}
    clutch, requests, ran = hooked(checkpoint_store, refusals=0, broken=broken)
    with pytest.raises(Flaky, match="a broke"):
        await clutch.run([], run_id="flaky")
    broken.clear()
    assert await clutch.resume_latest("flaky") == ["a", "b"]
    assert requests == ["flaky"] and ran == ["a", "a", "b"]


async def test_a_resume_from_the_input_after_steps_ran_does_not_await_on_request(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    broken = {"b"}
    clutch, requests, ran = hooked(checkpoint_store, refusals=0, broken=broken)
    with pytest.raises(Flaky, match="b broke"):
        await clutch.run([], run_id="damaged")
    for checkpoint in await clutch.list_checkpoints("damaged"):
        await tamper.damage_checkpoint(checkpoint.checkpoint_id, lambda raw: raw[:-3])
    broken.clear()
    with pytest.warns(CheckpointFallbackWarning):  # from its input, though a step ran
        assert await clutch.resume_latest("damaged") == ["a", "b"]
    assert requests == ["damaged"] and ran == ["a", "b", "a", "b"]


async def test_a_resume_from_a_checkpoint_inside_the_first_step_does_not_await_on_request(
    checkpoint_store: CheckpointStorage,
) -> None:
    requests: list[object] = []
    inside: list[str] = []

    async def gate(request: dict[str, object]) -> None:
        requests.append(request["clutch_id"])

    clutch = Clutch("hooked", checkpoint=config(checkpoint_store), on_request=gate)

    @clutch.agent()
    async def a(data: list[str]) -> list[str]:
        inside.append(await clutch.checkpoint())
        return [*data, "a"]

    assert await clutch.run([], run_id="done") == ["a"]
    assert (await clutch.get_checkpoint(inside[0])).seq == 0
    assert await clutch.resume(inside[0]) == ["a"]
    assert await clutch.fork(inside[-1], run_id="forked") == ["a"]
    assert requests == ["done"]


async def test_a_run_waiting_in_its_first_step_awaits_on_request_once(
    checkpoint_store: CheckpointStorage,
) -> None:
    requests: list[object] = []

    async def gate(request: dict[str, object]) -> None:
        requests.append(request["clutch_id"])

    clutch = Clutch("hooked", checkpoint=config(checkpoint_store), on_request=gate)

    @clutch.agent()
    async def a(data: str) -> str:
        return data + str(await nestegg.wait_for("go"))

    with pytest.raises(RunWaiting):
        await clutch.run("x", run_id="signalled")
    assert await clutch.signal("signalled", "go", "!") == "x!"

    with pytest.raises(RunWaiting):  # resumed once it waited, its process died
        await clutch.run("y", run_id="died")
    await clutch.signal("died", "go", "?", resume=False)
    gone = Owner(host=FOREIGN_HOST, pid=4242, started="1")
    await take_over(checkpoint_store, "died", gone, lease=-1.0)
    assert await clutch.recover() == {"died": "y?"}
    assert requests == ["signalled", "died"]


async def test_a_run_cancelled_in_its_first_step_does_not_await_on_request_again(
    checkpoint_store: CheckpointStorage,
) -> None:
    entered = asyncio.Event()
    requests: list[object] = []

    async def gate(request: dict[str, object]) -> None:
        requests.append(request["clutch_id"])

    clutch = Clutch("hooked", checkpoint=config(checkpoint_store), on_request=gate)

    @clutch.agent()
    async def a(data: str) -> str:
        if not entered.is_set():
            entered.set()
            await asyncio.sleep(10)
        return data + "!"

    task = await clutch.submit("x", run_id="stopped")
    await wait_for(entered)
    task.cancel()  # before its step's start is written on its own
    with pytest.raises(asyncio.CancelledError):
        await task
    kinds = [e.kind for e in await checkpoint_store.read_events("stopped")]
    assert (kinds[:2], kinds[-1]) == ([RUN_STARTED, STEP_STARTED], RUN_CANCELLED)
    assert await clutch.resume_latest("stopped") == "x!"
    assert requests == ["stopped"]


async def test_a_run_cancelled_in_its_on_request_hook_is_stored_as_cancelled(
    checkpoint_store: CheckpointStorage,
) -> None:
    entered = asyncio.Event()
    requests: list[object] = []

    async def forward(request: dict[str, object]) -> None:
        requests.append(request["clutch_id"])
        entered.set()
        if len(requests) == 1:
            await asyncio.sleep(10)

    clutch = Clutch("hooked", checkpoint=config(checkpoint_store), on_request=forward)

    @clutch.agent()
    async def a(data: str) -> str:
        return data + "!"

    task = await clutch.submit("x", run_id="hooked")
    await wait_for(entered)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    run = await checkpoint_store.get_run("hooked")
    assert run is not None and run.status == "cancelled"
    assert beating() == 0
    assert await clutch.resume_latest("hooked") == "x!"
    assert requests == ["hooked", "hooked"]  # its resume awaited the hook it never passed
