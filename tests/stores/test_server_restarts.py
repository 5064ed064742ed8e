"""A server that crashes and comes back in the middle of a run loses nothing.

Each test starts a private server (never the shared ones), commits steps from a writer
task, kills the server mid-run and starts it again. Every commit either rides through
(bounded retries with backoff) or fails with StorageUnavailableError and, repeated once
the server is back, succeeds; at the end every step is stored exactly once, unaltered.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nestegg.checkpoint.codec import unseal_json
from nestegg.errors import StorageUnavailableError
from nestegg.testing.builders import (
    OWNER,
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_step,
)
from tests.stores.private_servers import PrivatePostgres, PrivateRedis

pytestmark = [pytest.mark.server, pytest.mark.crash]

STEPS = 120
DOWN_FOR_S = 1.0
WRITER_DEADLINE_S = 90


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    pytest.importorskip("redis")
    server = PrivateRedis()
    server.start()
    yield server
    server.remove()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    pytest.importorskip("psycopg")
    server = PrivatePostgres()
    server.start()
    yield server
    server.remove()


async def _write_through_a_restart(store: Any, server: Any) -> dict[str, int]:
    run = await create(store, run_id="restarted")
    now = time.time()
    claimed = await store.claim_run(run.run_id, run.fence, OWNER, now + 60, now)
    counts = {"unavailable": 0, "committed": 0}  # StorageUnavailableErrors; last seq stored

    async def writer() -> None:
        for seq in range(1, STEPS + 1):
            commit = make_commit(
                claimed,
                steps=[make_step(run.run_id, seq, data="x" * 500)],
                events=[make_event(run.run_id, seq)],
                checkpoints=[make_checkpoint(run.run_id, seq)],
                step_seq=seq,
                event_seq=seq,
            )
            while True:
                try:
                    await store.commit(commit)
                    break
                except StorageUnavailableError:
                    counts["unavailable"] += 1
                    await asyncio.sleep(0.2)  # the run stops; it resumes once back
            counts["committed"] = seq
            await asyncio.sleep(0.005)

    task = asyncio.create_task(writer())
    while counts["committed"] < STEPS // 4:
        await asyncio.sleep(0.01)
    await asyncio.to_thread(server.kill)
    await asyncio.sleep(DOWN_FOR_S)
    await asyncio.to_thread(server.start)
    async with asyncio.timeout(WRITER_DEADLINE_S):
        await task

    steps = await store.load_steps(run.run_id)
    assert [s.seq for s in steps] == list(range(1, STEPS + 1))
    assert all(unseal_json(s.body, "step")["seq"] == s.seq for s in steps)
    assert [e.seq for e in await store.read_events(run.run_id)] == list(range(1, STEPS + 1))
    assert len(await store.list_checkpoints(run.run_id)) == STEPS
    stored = await store.get_run(run.run_id)
    assert stored is not None
    assert (stored.step_seq, stored.fence) == (STEPS, claimed.fence)
    return counts


async def _claimed_with_one_step(store: Any) -> Any:
    run = await create(store)
    now = time.time()
    claimed = await store.claim_run(run.run_id, run.fence, OWNER, now + 60, now)
    await store.commit(make_commit(claimed, steps=[make_step(run.run_id, 1)]))
    return claimed


def _check_outcome(counts: dict[str, int], retries: int) -> None:
    if retries == 0:  # no retries: the outage surfaces, and the run goes on afterwards
        assert counts["unavailable"] >= 1


@pytest.mark.parametrize("retries", [0, 4])
async def test_redis_killed_and_restarted_mid_run_loses_nothing(
    private_redis: PrivateRedis, retries: int
) -> None:
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    store = RedisCheckpointStorage(private_redis.url, connect_timeout=2, retries=retries)
    try:
        await store.setup()
        _check_outcome(await _write_through_a_restart(store, private_redis), retries)
    finally:
        await store.close()


@pytest.mark.parametrize("retries", [0, 4])
async def test_postgres_crashed_and_restarted_mid_run_loses_nothing(
    private_postgres: PrivatePostgres, retries: int
) -> None:
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    store = PostgresCheckpointStorage(
        private_postgres.url, connect_timeout=3, max_size=2, retries=retries
    )
    try:
        await store.setup()
        _check_outcome(await _write_through_a_restart(store, private_postgres), retries)
    finally:
        await store.close()


async def test_a_redis_that_stops_answering_is_unavailable_within_the_timeout(
    private_redis: PrivateRedis,
) -> None:
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    store = RedisCheckpointStorage(private_redis.url, connect_timeout=1, retries=0)
    assert private_redis.process is not None
    try:
        claimed = await _claimed_with_one_step(store)
        run = claimed
        private_redis.process.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        try:
            with pytest.raises(StorageUnavailableError):
                await store.commit(make_commit(claimed, steps=[make_step(run.run_id, 2)]))
        finally:
            private_redis.process.send_signal(signal.SIGCONT)
        assert time.monotonic() - started < 5
        await store.commit(make_commit(claimed, steps=[make_step(run.run_id, 2)]))
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
    finally:
        await store.close()


@pytest.mark.parametrize("outage", ["stops answering", "killed"])
async def test_a_postgres_outage_mid_run_is_unavailable_within_the_timeout(
    private_postgres: PrivatePostgres, outage: str
) -> None:
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    store = PostgresCheckpointStorage(private_postgres.url, connect_timeout=2)
    down, up = private_postgres.pause, private_postgres.resume
    if outage == "killed":
        down, up = private_postgres.kill, private_postgres.start
    try:
        claimed = await _claimed_with_one_step(store)
        down()
        started = time.monotonic()
        try:
            with pytest.raises(StorageUnavailableError, match=r"127\.0\.0\.1"):
                async with asyncio.timeout(30):  # without a bound it would wait for good
                    await store.commit(make_commit(claimed, steps=[make_step(claimed.run_id, 2)]))
            waited = time.monotonic() - started
        finally:
            up()
        assert waited < 2 + 1.5  # connect_timeout, and the last backoff at most
        await store.commit(make_commit(claimed, steps=[make_step(claimed.run_id, 2)]))
        assert [s.seq for s in await store.load_steps(claimed.run_id)] == [1, 2]
    finally:
        await store.close()
