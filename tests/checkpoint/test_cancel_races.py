"""A resume and a cancel of the same run at the same moment, on every store: exactly one
wins, and the other says so. A cancel that comes first (between a resume's read and its
claim) leaves the run cancelled, the resume refused saying who cancelled it; a resume that
claims first is cancelled at its next commit, or completes and the cancel is refused."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from nestegg.checkpoint.ownership import host_id
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import CANCELLED, COMPLETED
from nestegg.errors import RunFinishedError, RunLockedError, StaleOwnerError
from nestegg.testing import fixtures

from .conftest import Pipeline, stored_view
from .test_cancel import FOREIGN, _running

store_name = fixtures.store_name
store_factory = fixtures.store_factory
store = fixtures.store

DELAYS = (0.0, 0.0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.2)
AGENTS = ("a", "b", "c")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    fixtures.parametrize_stores(metafunc)


def _cancelled_first(run_id: str) -> str:
    return (
        f"run {run_id!r} was cancelled from outside (by pid {os.getpid()} on {host_id()}) "
        "before this resume claimed it; nothing was resumed: resume it again to continue "
        "it on purpose"
    )


async def test_a_cancel_between_a_resumes_read_and_its_claim_wins(
    store: CheckpointStorage, store_factory: fixtures.StoreFactory
) -> None:
    pipe = Pipeline(store, AGENTS)
    canceller = Pipeline(await store_factory(), AGENTS)  # another handle: another process
    await store.create_run(_running("raced", FOREIGN))
    claim = store.claim_run
    cancelled: list[bool] = []

    async def racing(run_id: str, *args: Any, **kwargs: Any) -> RunRecord:
        store.claim_run = claim  # type: ignore[method-assign]  # the cancel's claim is plain
        # the cancel commits between the resume's read and its claim
        cancelled.append(await canceller.clutch.cancel(run_id))
        return await claim(run_id, *args, **kwargs)

    store.claim_run = racing  # type: ignore[method-assign]
    with pytest.raises(RunFinishedError) as refused:
        await pipe.clutch.resume_latest("raced")
    assert cancelled == [True] and refused.value.status == CANCELLED
    assert str(refused.value) == _cancelled_first("raced")
    run = await store.get_run("raced")
    assert run is not None and run.status == CANCELLED and pipe.calls == []


async def test_a_cancelled_run_is_not_reopened_by_a_resume_that_read_it_unfinished(
    store: CheckpointStorage,
) -> None:
    pipe = Pipeline(store, AGENTS)
    await store.create_run(_running("read", FOREIGN))
    assert await pipe.clutch.cancel("read") is True
    before = await stored_view(store, "read")
    with pytest.raises(RunFinishedError) as refused:
        await pipe.clutch.resume_latest("read", reopen_cancelled=False)
    assert str(refused.value) == _cancelled_first("read")
    assert await stored_view(store, "read") == before and pipe.calls == []
    checkpoint = (await pipe.clutch.list_checkpoints("read") or [None])[0]
    assert checkpoint is None  # nothing to resume --from; on purpose it goes on:
    assert await pipe.clutch.resume_latest("read") == list(AGENTS)


async def _race(
    resumer: Pipeline, canceller: Pipeline, run_id: str, delay: float
) -> tuple[Any, Any]:
    """A resume (of the run read unfinished, as ``nestegg resume`` reads it) and a cancel
    started ``delay`` seconds later; what each returned or raised."""

    async def cancel() -> bool:
        await asyncio.sleep(delay)
        return await canceller.clutch.cancel(run_id)

    resume = resumer.clutch.resume_latest(run_id, reopen_cancelled=False)
    outcomes = await asyncio.gather(resume, cancel(), return_exceptions=True)
    return outcomes[0], outcomes[1]


async def test_a_resume_and_a_cancel_at_the_same_moment_agree_on_who_won(
    store: CheckpointStorage, store_factory: fixtures.StoreFactory
) -> None:
    resumer = Pipeline(store, AGENTS)
    canceller = Pipeline(await store_factory(), AGENTS)
    for i, delay in enumerate(DELAYS):
        run_id = f"race{i}"
        await store.create_run(_running(run_id, FOREIGN))
        # the later the cancel, the likelier the resume claims first, or even completes
        resumed, cancel = await _race(resumer, canceller, run_id, delay)
        run = await store.get_run(run_id)
        assert run is not None
        if cancel is True:  # the cancel won: the resume says it lost the run
            assert run.status == CANCELLED
            assert isinstance(resumed, RunLockedError | StaleOwnerError), resumed
            assert str(resumed).startswith(f"run {run_id!r} was cancelled from outside ")
        else:  # the resume won: it completed, the cancel was refused as too late
            assert isinstance(cancel, RunFinishedError) and cancel.status == COMPLETED, cancel
            assert run.status == COMPLETED and resumed == list(AGENTS)
