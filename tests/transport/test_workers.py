"""Workers in real processes on a real broker (Redis Streams, then RabbitMQ) and the
Redis store: SIGKILLed at random, stopped with SIGTERM, split by agent, fed duplicates.

What must hold whatever happens: every run completes with the result of an
uninterrupted run, no step is committed twice (one ``step_completed`` event per step),
and a journaled call that completed never runs again (its side-effect counter equals the
count the journal recorded).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from nestegg.checkpoint.codec import unseal_json, unseal_value
from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.constants import (
    RECORD_MAX_BYTES,
    RUN_COMPLETED,
    STEP_COMPLETED,
    STEP_FAILED,
    STORE_RETRIES,
)
from nestegg.errors import RunFailedError
from nestegg.testing.builders import create
from nestegg.transport.base import StepMessage, channel_name
from nestegg.transport.verdicts import pointer_fence
from nestegg.urls import without_password
from tests.transport.apps import STEPS, make_chain, make_slow, make_split
from tests.transport.conftest import Deployment, wait_until

pytestmark = [pytest.mark.crash, pytest.mark.server]

CHAOS_RUNS = 30
CHAOS_WORKERS = 3
CHAOS_KILLS = 6


def uninterrupted_result() -> dict[str, Any]:
    """What a chain run returns when nothing interrupts it."""
    trail = [f"{'ping' if step % 2 else 'pong'}{step}" for step in range(1, STEPS + 1)]
    return {"trail": trail, "n": STEPS}


async def effect_counts(deployment: Deployment) -> dict[str, int]:
    """The side-effect counters: ``run:step`` -> executions."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(deployment.redis_url)
    try:
        raw = await client.hgetall(f"{deployment.prefix}effects")
    finally:
        await client.aclose()
    return {key.decode(): int(value) for key, value in raw.items()}


async def check_run(store: RedisCheckpointStorage, run_id: str, effects: dict[str, int]) -> int:
    """Assert the run committed each step once and no completed call ran again; the
    number of side effects that ran more than once (calls cut short by a kill)."""
    events = await store.read_events(run_id)
    steps = Counter(unseal_json(e.body, "event")["seq"] for e in events if e.kind == STEP_COMPLETED)
    assert steps == Counter(range(1, STEPS + 1)), f"run {run_id}: step commits {steps}"
    assert [e.kind for e in events].count(RUN_COMPLETED) == 1
    repeated = 0
    for step in range(1, STEPS + 1):
        journal = await store.read_journal(run_id, step)
        assert len(journal) == 1, f"run {run_id} step {step}: journal {journal}"
        recorded = unseal_value(journal[0].body, "journal")["result"]
        assert effects[f"{run_id}:{step}"] == recorded, f"run {run_id} step {step} ran again"
        repeated += recorded > 1
    return repeated


async def test_workers_killed_at_random_lose_nothing_and_repeat_nothing(
    deployment: Deployment, store: RedisCheckpointStorage
) -> None:
    seed = os.environ.get("NESTEGG_CRASH_SEED") or str(random.SystemRandom().randrange(2**32))
    print(f"NESTEGG_CRASH_SEED={seed}")
    rng = random.Random(seed)
    options = ("--concurrency", "2")
    workers = [deployment.start_worker("chain", *options) for _ in range(CHAOS_WORKERS)]
    chain = make_chain()
    run_ids = [f"chaos-{i}" for i in range(CHAOS_RUNS)]
    kills_mid_work = 0
    try:
        for run_id in run_ids:
            await chain.submit({}, run_id=run_id)
        for _ in range(CHAOS_KILLS):
            await asyncio.sleep(rng.uniform(0.3, 0.9))
            victim = rng.randrange(len(workers))
            workers[victim].kill()
            workers[victim] = deployment.start_worker("chain", *options)
            kills_mid_work += bool(await store.list_runs(statuses=["running"]))
        results = await asyncio.gather(*(chain.result(r, timeout=90) for r in run_ids))
    finally:
        await chain.stop()
    assert results == [uninterrupted_result()] * CHAOS_RUNS
    assert kills_mid_work >= CHAOS_KILLS // 2, f"only {kills_mid_work} kills hit running work"
    effects = await effect_counts(deployment)
    repeated = [await check_run(store, run_id, effects) for run_id in run_ids]
    print(f"kills mid-work: {kills_mid_work}; calls cut short and made again: {sum(repeated)}")


async def test_a_step_longer_than_the_lease_is_not_taken_from_its_live_worker(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.lease, deployment.slow = 1.0, 3.5
    deployment.apply(monkeypatch)
    for _ in range(2):
        deployment.start_worker("slow")
    slow = make_slow()
    try:
        result = await slow.run({}, run_id="long", timeout=20)
    finally:
        await slow.stop()
    assert (await effect_counts(deployment))["long:1"] == 1
    run = await store.get_run("long")
    # created 1, claimed once: no takeover (the 3.5 s step outlasted the worker's turn with
    # the run, but no message waited for its one slot, so it went on with the next step)
    assert run is not None and run.fence == 2
    assert set(result) == {"crawled", "after"}


async def test_a_worker_killed_while_it_goes_on_with_a_run_is_taken_over_after_the_lease(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.pace = 0.15  # ten steps of 0.15 to 0.2 s: more than one step in a worker's turn
    deployment.apply(monkeypatch)
    workers = [deployment.start_worker("chain") for _ in range(2)]
    chain = make_chain()
    try:
        await chain.run({}, run_id="warm-up", timeout=30)  # both workers are up
        await chain.submit({}, run_id="victim")
        run = await store.get_run("victim")
        while run is None or run.step_seq < 2:
            await asyncio.sleep(0.01)
            run = await store.get_run("victim")
        assert run.fence == 2, "the worker that took the first step went on with the run"
        assert run.owner is not None
        victim = next(w for w in workers if w.process.pid == run.owner.pid)
        victim.kill()
        killed, seq = time.monotonic(), run.step_seq
        while (await store.get_run("victim")).step_seq <= seq:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        took = time.monotonic() - killed
        result = await chain.result("victim", timeout=30)
    finally:
        await chain.stop()
    # the lease (2 s) and the step run again, well before a sweep (after 5 leases)
    assert took < deployment.lease + 1.5, f"{took:.2f} s from the kill to the next step"
    assert result == uninterrupted_result()
    await check_run(store, "victim", await effect_counts(deployment))


async def test_a_takeover_from_a_worker_killed_in_a_step_is_in_the_event_log(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.slow = 30.0  # the first worker is killed in its first step, after its call
    deployment.apply(monkeypatch)
    first = deployment.start_worker("slow")
    slow = make_slow()
    try:
        task = await slow.submit({}, run_id="taken")
        await wait_until(lambda: _effects_sync(deployment).get("taken:1") == 1, 20, "the call")
        await _journaled(store, "taken")
        first.kill()
        deployment.slow = 0.0
        second = deployment.start_worker("slow")
        result = await task.result(timeout=40)
    finally:
        await slow.stop()
    assert result["crawled"] == second.process.pid
    events = await event_log(store, "taken")
    kinds = [kind for kind, _ in events]
    # the first worker's opening and start went with its journaled call, as on one process
    assert kinds[:2] == ["run_started", "step_started"]
    # the takeover says whose run it took, as a resume of an interrupted run does
    assert kinds[2:5] == ["run_interrupted", "run_resumed", "step_started"]
    (_, interrupted), (_, resumed) = events[2:4]
    assert interrupted["owner"]["pid"] == first.process.pid and interrupted["steps"] == 0
    assert resumed["previous"] == "interrupted" and resumed["seq"] == 0
    assert resumed["previous_owner"] == interrupted["owner"]
    assert kinds[5:] == ["step_completed", "checkpoint_saved", "step_started", "step_completed",
                         "checkpoint_saved", "run_completed"]  # fmt: skip
    assert _effects_sync(deployment) == {"taken:1": 1}  # replayed, not made again


async def event_log(store: RedisCheckpointStorage, run_id: str) -> list[tuple[str, Any]]:
    """The run's events: (kind, payload) each."""
    return [(e.kind, unseal_json(e.body, "event")) for e in await store.read_events(run_id)]


async def _journaled(store: RedisCheckpointStorage, run_id: str) -> None:
    """Wait until step 1 of the run has journaled its call (its commit is stored)."""
    deadline = time.monotonic() + 20
    while not await store.read_journal(run_id, 1):
        assert time.monotonic() < deadline, "the call was not journaled"
        await asyncio.sleep(0.02)


async def test_sigterm_lets_the_step_finish_within_the_grace_period(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.slow = 1.5
    deployment.apply(monkeypatch)
    worker = deployment.start_worker("slow", "--grace", "10")
    slow = make_slow()
    try:
        await slow.submit({}, run_id="drained")
        await wait_until(lambda: _effects_sync(deployment).get("drained:1") == 1, 15, "the step")
        worker.terminate()
        assert worker.wait(timeout=10) == 0, worker.errors()
        assert worker.errors().splitlines()[1:] == [
            "warning: draining 1 step (grace 10 s)",
            "warning: step 1 of run 'drained' ended during the drain",
            "warning: drain over: 1 step ended, 0 released",
        ]
        run = await store.get_run("drained")
        assert run is not None and run.step_seq == 1, "the step under way was committed"
        deployment.start_worker("slow")
        result = await slow.result("drained", timeout=15)
    finally:
        await slow.stop()
    assert result["after"] != worker.process.pid
    assert (await effect_counts(deployment))["drained:1"] == 1


async def test_sigterm_past_the_grace_period_releases_the_run_at_once(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment.lease, deployment.slow = 6.0, 2.0
    deployment.apply(monkeypatch)
    first = deployment.start_worker("slow", "--grace", "0.2")
    slow = make_slow()
    try:
        await slow.submit({}, run_id="released")
        await wait_until(lambda: _effects_sync(deployment).get("released:1") == 1, 15, "the step")
        second = deployment.start_worker("slow")
        await asyncio.sleep(1.0)  # the second worker is up and idle
        first.terminate()
        stopped = time.monotonic()
        assert first.wait(timeout=5) == 0, first.errors()
        assert first.errors().splitlines()[1:] == [
            "warning: draining 1 step (grace 0.2 s)",
            "warning: step 1 of run 'released' did not end within the grace period: released "
            "for another worker",
            "warning: drain over: 0 steps ended, 1 released",
        ]
        result = await slow.result("released", timeout=20)
        took = time.monotonic() - stopped
    finally:
        await slow.stop()
    assert result["crawled"] == second.process.pid
    assert took < deployment.lease, f"{took:.1f} s: the run waited for the lease"
    assert (await effect_counts(deployment))["released:1"] == 1  # replayed, not paid again
    events = await event_log(store, "released")
    kinds = [kind for kind, _ in events]
    # the drain says that it gave the step under way back; the worker that took it says
    # whose step it resumed, as after a takeover
    assert kinds[:5] == ["run_started", "step_started", "run_interrupted", "run_resumed",
                         "step_started"]  # fmt: skip
    (_, released), (_, resumed) = events[2:4]
    assert released == {"owner": released["owner"], "steps": 0, "released": True}
    assert released["owner"]["pid"] == first.process.pid
    assert resumed["previous"] == "interrupted" and resumed["seq"] == 0
    assert resumed["previous_owner"] == released["owner"]
    assert kinds.count("run_interrupted") == kinds.count("run_resumed") == 1


async def test_duplicate_messages_commit_nothing_twice(
    deployment: Deployment, store: RedisCheckpointStorage
) -> None:
    deployment.start_worker("chain", "--concurrency", "4")
    chain = make_chain()
    assert chain.transport is not None
    try:
        task = await chain.submit({}, run_id="dup")
        first = StepMessage("dup", 1, 1, "ping")
        for _ in range(3):
            await chain.transport.publish(channel_name("chain", "ping"), first)
        assert await task.result(timeout=20) == uninterrupted_result()
        before = await store.read_events("dup")
        for seq in (1, 5, STEPS, STEPS + 1):
            await chain.transport.publish(channel_name("chain"), StepMessage("dup", seq, 2))
        await asyncio.sleep(1.0)
        assert await store.read_events("dup") == before
    finally:
        await chain.stop()
    await check_run(store, "dup", await effect_counts(deployment))


async def test_a_message_for_a_run_not_in_the_workers_store_is_dropped_with_a_warning(
    deployment: Deployment, store: RedisCheckpointStorage
) -> None:
    # a caller on another store (or a run deleted meanwhile): the worker says so
    worker = deployment.start_worker("chain")
    chain = make_chain()
    assert chain.transport is not None
    await create(store, run_id="theirs", pipeline="split")
    try:
        for run_id in ("elsewhere", "theirs"):
            message = StepMessage(run_id, 1, 1, "ping")
            await chain.transport.publish(channel_name("chain", "ping"), message)
        # its first step comes after them in the same channel
        assert await chain.run({}, run_id="after", timeout=30) == uninterrupted_result()
    finally:
        await chain.stop()
    worker.terminate()
    assert worker.wait(timeout=20) == 0
    where = f"redis at {without_password(deployment.redis_url)}, key prefix {deployment.prefix!r}"
    dropped = (
        "the message is dropped (the run was deleted, or the process that sent the message "
        "uses another store than this worker)"
    )
    errors = worker.errors()
    assert (
        f"warning: step 1 of run 'elsewhere': the store of this worker ({where}) has no such "
        f"run; {dropped}\n"
    ) in errors
    assert (
        f"warning: step 1 of run 'theirs': the store of this worker ({where}) has a run of "
        f"pipeline 'split', not 'chain', of that id; {dropped}\n"
    ) in errors
    assert await store.read_events("theirs") == []


async def test_a_caller_killed_while_waiting_gets_its_result_from_a_new_process(
    deployment: Deployment,
) -> None:
    import subprocess
    import sys

    deployment.start_worker("chain")
    script = (
        "import asyncio\n"
        "from tests.transport.apps import make_chain\n"
        "asyncio.run(make_chain().run({}, run_id='orphan', timeout=None))\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script], env=deployment.env())
    try:
        await wait_until(lambda: "orphan:1" in _effects_sync(deployment), 15, "the first step")
    finally:
        caller.kill()
        caller.wait()
    chain = make_chain()
    try:
        assert await chain.result("orphan", timeout=20) == uninterrupted_result()
    finally:
        await chain.stop()


async def test_workers_hosting_different_agents_share_a_pipeline(
    deployment: Deployment,
) -> None:
    edges = deployment.start_worker("split", "--agents", "first,third")
    middle = deployment.start_worker("split", "--agents", "second")
    split = make_split()
    try:
        result = await split.run({"x": 1}, timeout=20)
        with pytest.raises(RunFailedError) as failed:
            await split.run({"fail": "no"}, run_id="failing", timeout=20)
    finally:
        await split.stop()
    assert result == {
        "x": 1,
        "first": edges.process.pid,
        "second": middle.process.pid,
        "third": edges.process.pid,
    }
    error = failed.value
    assert (error.run_id, error.agent, error.error_type) == ("failing", "third", "ValueError")
    assert error.error_message == "bad input no"


async def test_a_step_output_too_large_for_a_store_fails_the_run_not_given_back(
    deployment: Deployment,
) -> None:
    # About 130 MB in the worker: the output and its JSON, over RECORD_MAX_BYTES.
    worker = deployment.start_worker("split")
    split = make_split()
    try:
        with pytest.raises(RunFailedError) as failed:
            await split.run({"large": True}, run_id="too-large", timeout=30)
    finally:
        await split.stop()
    error = failed.value
    assert (error.agent, error.error_type) == ("third", "RecordTooLargeError")
    assert error.error_message.startswith("cannot store data: it is 67,108,9")
    assert f"over the {RECORD_MAX_BYTES:,} bytes" in error.error_message
    worker.terminate()
    assert worker.wait(timeout=20) == 0
    assert "giving it back" not in worker.errors()


async def test_a_worker_whose_clutch_lacks_the_next_agent_leaves_the_step_to_one_that_has_it(
    deployment: Deployment, store: RedisCheckpointStorage
) -> None:
    older = deployment.start_worker("split", "--agents", "first,second")
    split = make_split()
    assert split.transport is not None
    try:
        task = await split.submit({"x": 1}, run_id="lost")
        before = await _run_when(store, "lost", lambda run: run.step_seq == 2 and _released(run))
        older.kill()
        # pointed at again through the pipeline's channel, as a sweep or a drain does
        message = StepMessage("lost", 3, pointer_fence(before), None)
        await split.transport.publish(channel_name("split"), message)
        lacking = deployment.start_worker("split_without_third")
        await _run_when(store, "lost", lambda run: run.fence > before.fence and _released(run))
        newer = deployment.start_worker("split", "--agents", "third")
        result = await task.result(timeout=20)
    finally:
        await split.stop()
    pid = older.process.pid
    assert result == {"x": 1, "first": pid, "second": pid, "third": newer.process.pid}
    lacking.terminate()
    assert lacking.wait(timeout=20) == 0
    assert "run 'lost' continues with agent 'third'" in lacking.errors()


async def test_a_store_error_while_loading_the_run_gives_the_step_back_not_failing_the_run(
    deployment: Deployment, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
    from tests.servers import drop_postgres_tables

    tables = f"ne_load_{uuid.uuid4().hex[:8]}_"
    # the worker's reads give up after 300 ms waiting for a lock
    monkeypatch.setenv("NESTEGG_TEST_PG_STORE", f"{pg_url}?options=-c%20lock_timeout%3D300")
    monkeypatch.setenv("NESTEGG_TEST_PG_TABLES", tables)
    store = PostgresCheckpointStorage(pg_url, table_prefix=tables)
    split = make_split(store=store)
    try:
        deployment.start_worker("split_on_postgres", "--agents", "first,second")
        task = await split.submit({"x": 1}, run_id="blocked")
        before = await _run_when(store, "blocked", lambda run: run.step_seq == 2 and _released(run))
        async with await psycopg.AsyncConnection.connect(pg_url) as blocker:
            # the checkpoints cannot be read while this transaction holds the lock
            await blocker.execute(f"LOCK TABLE {tables}checkpoints IN ACCESS EXCLUSIVE MODE")
            third = deployment.start_worker("split_on_postgres", "--agents", "third")
            await _run_when(store, "blocked", lambda run: run.fence > before.fence)  # claimed
            await asyncio.sleep(1.0)  # its load timed out meanwhile
            await blocker.rollback()
        result = await task.result(timeout=20)
    finally:
        await split.stop()
        await drop_postgres_tables(pg_url, tables)
    assert result["third"] == third.process.pid


async def test_a_step_whose_commit_the_store_drops_is_given_back_not_failing_the_run(
    deployment: Deployment, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server drops the connection of each try of step 1's commit (as it drops one
    # whose message is too large): the commit fails with StorageUnavailableError after
    # its retries, while the store answers everything else, a failure record too.
    import psycopg

    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
    from tests.servers import drop_postgres_tables

    tables = f"ne_drop_{uuid.uuid4().hex[:8]}_"
    monkeypatch.setenv("NESTEGG_TEST_PG_STORE", pg_url)
    monkeypatch.setenv("NESTEGG_TEST_PG_TABLES", tables)
    store = PostgresCheckpointStorage(pg_url, table_prefix=tables)
    await store.setup()
    split = make_split(store=store)
    try:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(f"CREATE SEQUENCE {tables}drops")
            await admin.execute(
                f"CREATE FUNCTION {tables}drop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                f" IF NEW.seq = 1 AND nextval('{tables}drops') <= {STORE_RETRIES + 1} THEN"
                " PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(5);"
                " END IF; RETURN NEW; END $$"
            )
            await admin.execute(
                f"CREATE TRIGGER {tables}drop BEFORE INSERT ON {tables}steps"
                f" FOR EACH ROW EXECUTE FUNCTION {tables}drop()"
            )
        worker = deployment.start_worker("split_on_postgres")
        result = await split.run({"x": 1}, run_id="dropped", timeout=60)
        events = [e.kind for e in await store.read_events("dropped")]
    finally:
        await split.stop()
        await drop_postgres_tables(pg_url, tables)
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            await admin.execute(f"DROP SEQUENCE IF EXISTS {tables}drops")
    assert result["third"] == worker.process.pid
    assert STEP_FAILED not in events and events.count(STEP_COMPLETED) == 3
    worker.terminate()
    assert worker.wait(timeout=20) == 0
    assert "is unavailable" in worker.errors()


async def test_a_store_refusing_its_settings_gives_the_step_back_not_failing_the_run(
    deployment: Deployment, store: RedisCheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A password rotation while a worker runs: its store (a Redis ACL user) is refused
    # (StoreRefusedError) until the user's password is the one it has again.
    from urllib.parse import urlsplit

    import redis

    user, password = f"nestegg-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    admin = redis.Redis.from_url(deployment.redis_url)
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["*"],
        channels=["*"],
        commands=["+@all"],
    )
    parts = urlsplit(deployment.redis_url)
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 6379}"
    monkeypatch.setenv("NESTEGG_TEST_USER_STORE", parts._replace(netloc=netloc).geturl())
    split = make_split(store=store)
    try:
        deployment.start_worker("split", "--agents", "first,second")
        third = deployment.start_worker("split_as_user", "--agents", "third")
        before = await split.run({"x": 0}, run_id="before")  # its store is set up
        assert before["third"] == third.process.pid
        admin.acl_setuser(
            user, enabled=True, reset_passwords=True, passwords=[f"+{uuid.uuid4().hex}"]
        )
        admin.client_kill_filter(user=user)  # it logs in again: refused
        task = await split.submit({"x": 1}, run_id="refused")
        await _run_when(store, "refused", lambda run: run.step_seq == 2 and _released(run))
        await asyncio.sleep(2.5)  # the third step's message was taken, and given back
        run = await store.get_run("refused")
        assert run is not None and run.status == "running" and run.step_seq == 2
        admin.acl_setuser(user, enabled=True, reset_passwords=True, passwords=[f"+{password}"])
        result = await task.result(timeout=20)
    finally:
        await split.stop()
        admin.acl_deluser(user)
        admin.close()
    assert result["third"] == third.process.pid
    third.terminate()
    assert third.wait(timeout=20) == 0
    errors = third.errors()
    assert "refused the store's settings" in errors and "giving it back" in errors
    assert "Traceback" not in errors, errors


async def _run_when(
    store: RedisCheckpointStorage, run_id: str, check: Callable[[RunRecord], bool]
) -> RunRecord:
    """The run once ``check`` holds for it (or once it is no longer running)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        run = await store.get_run(run_id)
        if run is not None and (check(run) or run.status != "running"):
            return run
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for run {run_id!r}")


def _released(run: RunRecord) -> bool:
    return run.lease_until is not None and run.lease_until <= run.updated_at


def _effects_sync(deployment: Deployment) -> dict[str, int]:
    import redis

    client = redis.Redis.from_url(deployment.redis_url)
    try:
        raw = client.hgetall(f"{deployment.prefix}effects")
    finally:
        client.close()
    return {key.decode(): int(value) for key, value in raw.items()}
