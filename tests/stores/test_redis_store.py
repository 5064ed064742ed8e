"""What only the Redis store does: key prefixes, scripts, expiry, races, lost connections.

Runs against the real server of ``NESTEGG_TEST_REDIS_URL``; each test has its own key
prefix and deletes its keys afterwards. The contract itself is in test_contract.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import Any

import pytest

from nestegg.checkpoint.records import Owner
from nestegg.constants import COMPLETED, FAILED, WAITING
from nestegg.errors import (
    ConfigurationError,
    InvalidIdentifierError,
    RunLockedError,
    StaleOwnerError,
    StorageError,
    StorageUnavailableError,
)
from nestegg.testing.builders import (
    OWNER,
    commit_steps,
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_journal,
    make_run,
    make_step,
)
from nestegg.urls import without_password
from tests.servers import delete_redis_keys

pytestmark = pytest.mark.server

aioredis = pytest.importorskip("redis.asyncio")
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage, run_index  # noqa: E402
from nestegg.checkpoint.stores.redis.layout import command_bytes, run_from_hash  # noqa: E402

OpenStore = Callable[..., RedisCheckpointStorage]


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[Any]:
    """A plain client on the test server, to look at keys behind the store's back."""
    plain = aioredis.Redis.from_url(redis_url)
    yield plain
    await plain.aclose()


@pytest.fixture
async def open_store(redis_url: str) -> AsyncIterator[OpenStore]:
    """Builds stores on one fresh key prefix; closes them and deletes the keys after."""
    prefix = f"nestegg-test:{uuid.uuid4().hex[:12]}:"
    opened: list[RedisCheckpointStorage] = []

    def build(**options: Any) -> RedisCheckpointStorage:
        options.setdefault("prefix", prefix)
        store = RedisCheckpointStorage(options.pop("url", redis_url), **options)
        opened.append(store)
        return store

    yield build
    for store in opened:
        await store.close()
    await delete_redis_keys(redis_url, prefix)


async def _keys(client: Any, prefix: str) -> list[bytes]:
    return sorted([key async for key in client.scan_iter(match=f"{prefix}*")])


@pytest.mark.parametrize(
    "prefix", ["", "a b:", "a\nb:", "tab\t:", "glob*:", "q?:", "[x]:", "back\\:", "x" * 101, None]
)
def test_a_key_prefix_with_spaces_newlines_or_glob_characters_is_rejected(prefix: Any) -> None:
    with pytest.raises(InvalidIdentifierError, match="key prefix"):
        RedisCheckpointStorage("redis://127.0.0.1:6379/0", prefix=prefix)


def test_a_client_that_decodes_responses_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="decode_responses"):
        RedisCheckpointStorage(aioredis.Redis(decode_responses=True))


@pytest.mark.parametrize("target", [None, 6379, b"redis://127.0.0.1"])
def test_something_else_than_a_url_or_a_client_is_refused(target: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"URL or a redis\.asyncio\.Redis client"):
        RedisCheckpointStorage(target)


@pytest.mark.parametrize("ttl", [0, 0.5, timedelta(milliseconds=10), -5])
def test_an_expiry_under_a_second_is_refused(ttl: Any) -> None:
    with pytest.raises(ConfigurationError, match="expire_finished_after"):
        RedisCheckpointStorage("redis://127.0.0.1:6379/0", expire_finished_after=ttl)


async def test_every_key_is_under_the_prefix_and_drop_deletes_them(
    open_store: OpenStore, client: Any
) -> None:
    store = open_store()
    await store.setup()
    run = await create(store, pipeline="p")
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    await create(store, pipeline="p", parent_run=run.run_id)
    keys = await _keys(client, store.prefix)
    kinds = {key[len(store.prefix) :].split(b":")[0] for key in keys}
    assert kinds == {
        b"store",
        b"layout",
        b"forks",
        b"run",
        b"runs",
        b"pipeline",
        b"steps",
        b"events",
        b"checkpoints",
        b"checkpoint_order",
        b"checkpoint",
    }
    await store.drop()
    assert await _keys(client, store.prefix) == []


# --- ownership -------------------------------------------------------------------------


async def test_exactly_one_of_many_concurrent_claimers_wins(open_store: OpenStore) -> None:
    stores = [open_store() for _ in range(3)]
    run = await create(stores[0])
    now = time.time()

    async def claim(number: int) -> Any:
        owner = Owner(host=f"host-{number}", pid=number, started="1")
        try:
            return await stores[number % 3].claim_run(run.run_id, run.fence, owner, now + 30, now)
        except RunLockedError as exc:
            return exc

    results = await asyncio.gather(*(claim(n) for n in range(60)))
    winners = [r for r in results if not isinstance(r, RunLockedError)]
    assert len(winners) == 1
    stored = await stores[0].get_run(run.run_id)
    assert stored is not None
    assert stored.fence == run.fence + 1
    assert stored.owner == winners[0].owner


async def test_a_stale_commit_is_rejected_and_writes_nothing(
    open_store: OpenStore, client: Any
) -> None:
    store = open_store()
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    now = time.time()
    await store.claim_run(run.run_id, run.fence, OWNER, now + 30, now)
    keys = await _keys(client, store.prefix)
    before = [await client.dump(key) for key in keys]
    kept = (await store.list_checkpoints(run.run_id))[0].checkpoint_id
    stale = make_commit(
        run,
        steps=[make_step(run.run_id, 3)],
        events=[make_event(run.run_id, 3)],
        journal=[make_journal(run.run_id, 3, 0)],
        checkpoints=[make_checkpoint(run.run_id, 3)],
        prune=[kept],
        truncate_after=1,
        status=COMPLETED,
        result=b"stale",
        step_seq=3,
        event_seq=3,
        updated_at=now + 99,
    )
    with pytest.raises(StaleOwnerError, match="newer owner"):
        await store.commit(stale)
    assert await _keys(client, store.prefix) == keys
    assert [await client.dump(key) for key in keys] == before


async def test_a_commit_applied_twice_leaves_what_one_left(open_store: OpenStore) -> None:
    store = open_store()
    run = await create(store)
    commit = make_commit(
        run,
        steps=[make_step(run.run_id, 1)],
        events=[make_event(run.run_id, 1), make_event(run.run_id, 2)],
        journal=[make_journal(run.run_id, 1, 0)],
        checkpoints=[make_checkpoint(run.run_id, 1)],
        step_seq=1,
        event_seq=2,
    )
    await store.commit(commit)
    once = (await store.load_steps(run.run_id), await store.read_events(run.run_id))
    await store.commit(commit)  # what a retry after a lost reply does
    assert (await store.load_steps(run.run_id), await store.read_events(run.run_id)) == once
    assert len(await store.list_checkpoints(run.run_id)) == 1
    assert len(await store.read_journal(run.run_id, 1)) == 1


async def test_a_commit_of_more_events_than_one_zadd_takes_stores_them_all(
    open_store: OpenStore,
) -> None:
    store = open_store()
    run = await create(store)
    events = [make_event(run.run_id, seq) for seq in range(1, 1202)]
    await store.commit(make_commit(run, events=events, event_seq=1201))
    assert await store.read_events(run.run_id) == events


# --- expiry ----------------------------------------------------------------------------


async def test_finished_runs_get_a_redis_expiry_and_a_claim_removes_it(
    open_store: OpenStore, client: Any
) -> None:
    store = open_store(expire_finished_after=timedelta(hours=1))
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    await store.commit(make_commit(run, journal=[make_journal(run.run_id, 1, 0)]))
    run_keys = [k for k in await _keys(client, store.prefix) if run.run_id.encode() in k]
    checkpoint_keys = [
        f"{store.prefix}checkpoint:{c.checkpoint_id}".encode()
        for c in await store.list_checkpoints(run.run_id)
    ]
    assert len(run_keys) == 7
    assert set(checkpoint_keys) <= set(await _keys(client, store.prefix))
    assert {await client.ttl(k) for k in run_keys + checkpoint_keys} == {-1}

    await store.commit(make_commit(run, status=COMPLETED, result=b"done"))
    ttls = [await client.ttl(k) for k in run_keys + checkpoint_keys]
    assert all(3500 < ttl <= 3600 for ttl in ttls), ttls

    now = time.time()
    await store.claim_run(run.run_id, run.fence, OWNER, now + 30, now, reopen=True)
    assert {await client.ttl(k) for k in run_keys + checkpoint_keys} == {-1}


async def test_the_index_of_a_runs_forks_expires_with_the_run(
    open_store: OpenStore, client: Any
) -> None:
    # Else, once the run and its forks expired, their index stayed for good.
    store = open_store(expire_finished_after=timedelta(hours=1))
    run = await create(store, run_id="p", pipeline="a")
    fork = await create(store, run_id="f1", pipeline="a", parent_run="p")
    index = f"{store.prefix}forks:p"
    await store.commit(make_commit(fork, status=COMPLETED, result=b"done"))
    assert await client.ttl(index) == -1  # the run it indexes is not finished
    await store.commit(make_commit(run, status=COMPLETED, result=b"done"))
    assert 3500 < await client.ttl(index) <= 3600
    now = time.time()
    await store.claim_run(run.run_id, run.fence, OWNER, now + 30, now, reopen=True)
    assert await client.ttl(index) == -1
    assert await _fork_ids(store, "p") == ["f1"]


async def test_runs_that_redis_expired_vanish_from_every_read(
    open_store: OpenStore, client: Any
) -> None:
    store = open_store(expire_finished_after=1)
    gone = await create(store, pipeline="p")
    kept = await create(store, pipeline="p")
    await commit_steps(store, gone, range(1, 3), checkpoints=True)
    checkpoint = (await store.list_checkpoints(gone.run_id))[-1]
    await store.commit(make_commit(gone, status=COMPLETED))
    await asyncio.sleep(2.2)
    assert await store.get_run(gone.run_id) is None
    assert await store.get_checkpoint(checkpoint.checkpoint_id) is None
    assert [r.run_id for r in await store.list_runs(pipeline="p")] == [kept.run_id]
    assert [r.run_id for r in await store.list_runs()] == [kept.run_id]
    assert await client.zscore(f"{store.prefix}runs", gone.run_id) is None
    assert await store.load_steps(gone.run_id) == []


async def _forks_family(store: RedisCheckpointStorage) -> list[str]:
    """Run ``p`` with forks f1, f2, f3 (newest last), a fork ``g`` of f1 and a run that is
    no fork; the ids of p's forks, newest first."""
    await create(store, run_id="p", pipeline="a")
    for run_id in ("f1", "f2", "f3"):
        await create(store, run_id=run_id, pipeline="a", parent_run="p")
    await create(store, run_id="g", pipeline="a", parent_run="f1")
    await create(store, run_id="other", pipeline="b")
    return ["f3", "f2", "f1"]


async def _fork_ids(
    store: RedisCheckpointStorage, run_id: str, limit: int | None = None
) -> list[str]:
    return [run.run_id for run in await store.list_forks(run_id, limit)]


async def test_a_store_of_layout_0_gets_its_forks_index_on_setup_a_reader_scans_it(
    open_store: OpenStore, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A store written before forks were indexed: no forks:<id> keys, no layout key.
    store = open_store()
    await store.setup()
    forks = await _forks_family(store)
    await client.delete(
        f"{store.prefix}layout", *[k for k in await _keys(client, store.prefix) if b":forks:" in k]
    )
    before = {key: await client.dump(key) for key in await _keys(client, store.prefix)}

    reader = open_store(read_only=True)
    await reader.setup()
    assert await _fork_ids(reader, "p") == forks
    assert await _fork_ids(reader, "p", 2) == forks[:2]
    assert await _fork_ids(reader, "f1") == ["g"]
    assert {key: await client.dump(key) for key in await _keys(client, store.prefix)} == before

    writer = open_store()
    await writer.setup()
    assert await client.get(f"{store.prefix}layout") == b"1"
    assert await client.zrevrange(f"{store.prefix}forks:p", 0, -1) == [f.encode() for f in forks]
    assert await client.zrange(f"{store.prefix}forks:f1", 0, -1) == [b"g"]

    async def no_scan(*args: Any) -> Any:
        raise AssertionError("scanned every run")

    monkeypatch.setattr(RedisCheckpointStorage, "_scan_forks", no_scan)
    for handle in (writer, reader, store):  # every handle reads the index now
        assert await _fork_ids(handle, "p") == forks
        assert await _fork_ids(handle, "f1") == ["g"]
    await writer.setup()  # built once
    assert await _fork_ids(writer, "p") == forks


async def test_forks_whose_keys_redis_expired_are_dropped_from_the_index_when_read(
    open_store: OpenStore, client: Any
) -> None:
    store = open_store()
    await store.setup()
    await _forks_family(store)
    index = f"{store.prefix}forks:p"
    await client.delete(f"{store.prefix}run:f3", f"{store.prefix}run:f1")  # as by a TTL
    reader = open_store(read_only=True)
    assert await _fork_ids(reader, "p") == ["f2"]
    assert await client.zcard(index) == 3  # a reader writes nothing
    await create(store, run_id="f1", pipeline="a")  # its id again, no fork
    assert await _fork_ids(store, "p", 1) == ["f2"]
    assert await _fork_ids(store, "p") == ["f2"]
    assert await client.zrange(index, 0, -1) == [b"f2"]


async def test_a_listing_by_status_reads_only_the_runs_it_shows(
    open_store: OpenStore, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index holds every run: a filter by status read and parsed each run's hash, so
    listing the few running runs of a store of 10,000 took most of a second. Redis now
    sends only the runs of the statuses asked for."""
    store = open_store()
    runs = [await create(store, pipeline="p", status=FAILED if i % 4 == 0 else COMPLETED)
            for i in range(12)]  # fmt: skip
    failed = [run.run_id for run in reversed(runs) if run.status == FAILED]
    gone = runs[4].run_id  # a failed run whose keys Redis expired: its index entry goes
    await client.delete(f"{store.prefix}run:{gone}")
    parsed: list[str] = []

    def counted(raw: dict[bytes, bytes]) -> Any:
        parsed.append(raw[b"run_id"].decode())
        return run_from_hash(raw)

    monkeypatch.setattr(run_index, "run_from_hash", counted)
    expected = [run_id for run_id in failed if run_id != gone]
    assert [r.run_id for r in await store.list_runs(statuses=[FAILED])] == expected
    assert sorted(parsed) == sorted(expected)
    assert await client.zscore(f"{store.prefix}runs", gone) is None
    parsed.clear()
    assert [r.run_id for r in await store.list_runs(statuses=[FAILED], limit=1)] == expected[:1]
    assert [
        r.run_id for r in await store.list_runs(pipeline="p", statuses=[FAILED, COMPLETED])
    ] == [r.run_id for r in reversed(runs) if r.run_id != gone]
    assert await store.list_runs(statuses=[WAITING]) == []
    assert sorted(await store.expire_runs([FAILED], time.time() + 10)) == sorted(expected)
    assert len(await store.list_runs()) == 9


# --- connections -----------------------------------------------------------------------


async def test_an_unreachable_server_is_storage_unavailable_quickly() -> None:
    store = RedisCheckpointStorage("redis://127.0.0.1:1/0", connect_timeout=1, retries=0)
    started = time.monotonic()
    try:
        unavailable = r"Redis at redis://127\.0\.0\.1:1/0 is unavailable"
        with pytest.raises(StorageUnavailableError, match=unavailable):
            await store.get_run("run-1")
        with pytest.raises(StorageUnavailableError):
            await store.setup()
    finally:
        await store.close()
    assert time.monotonic() - started < 10


async def test_reads_and_commits_ride_through_killed_connections(
    open_store: OpenStore, client: Any, redis_url: str
) -> None:
    name = f"nestegg-test-{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}client_name={name}"
    store = open_store(url=url)
    run = await create(store)
    await commit_steps(store, run, range(1, 3))
    killed = 0
    for connection in await client.client_list():
        if connection.get("name") == name:
            killed += await client.client_kill_filter(_id=connection["id"])
    assert killed >= 1
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
    await commit_steps(store, run, range(3, 5))
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3, 4]


async def test_a_commit_after_its_connection_was_killed_needs_no_retry(
    open_store: OpenStore, client: Any, redis_url: str
) -> None:
    name = f"nestegg-test-{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}client_name={name}"
    store = open_store(url=url, retries=0)
    run = await create(store)
    await commit_steps(store, run, range(1, 3))
    for connection in await client.client_list():
        if connection.get("name") == name:
            await client.client_kill_filter(_id=connection["id"])
    await commit_steps(store, run, range(3, 5))
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3, 4]


async def test_scripts_flushed_from_redis_are_loaded_again(
    open_store: OpenStore, client: Any
) -> None:
    store = open_store()
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    await client.script_flush()
    await commit_steps(store, run, range(3, 5), checkpoints=True)
    assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3, 4]
    assert len(await store.list_checkpoints(run.run_id)) == 4


async def test_scripts_sent_while_the_kept_connection_is_busy(redis_url: str, client: Any) -> None:
    from nestegg.checkpoint.stores.redis.connection import RedisConnection

    connection = RedisConnection(redis_url, max_connections=4, connect_timeout=5.0, retries=0)
    echo = connection.client.register_script("return {ARGV[1], KEYS[1]}")
    fails = connection.client.register_script("return redis.error_reply('no such thing')")
    sent_apart = []
    pipeline = connection._pipeline

    async def counted(packed: bytes, count: int) -> list[Any]:
        sent_apart.append(count)
        return await pipeline(packed, count)

    connection._pipeline = counted  # type: ignore[method-assign]
    try:
        for flushed in (False, True):
            if flushed:
                await client.script_flush()  # not there: the busy path loads it again
            else:
                await client.script_load(echo.script)
                await client.script_load(fails.script)
            # The first call takes the kept connection; the others, sent while it is busy,
            # go out packed on other pool connections.
            replies = await asyncio.gather(
                *(connection.script(echo, [f"k{i}"], [i]) for i in range(3))
            )
            assert replies == [[str(i).encode(), f"k{i}".encode()] for i in range(3)]
        assert sent_apart == [1, 1, 1, 1]
        await client.script_load(fails.script)
        first, second = await asyncio.gather(
            connection.script(echo, ["k"], [1]),
            connection.script(fails, [], []),
            return_exceptions=True,
        )
        assert first == [b"1", b"k"]
        assert isinstance(second, StorageError) and "no such thing" in str(second)
    finally:
        await connection.close()


async def test_a_script_sent_apart_that_gets_no_reply_in_time_is_unavailable(
    redis_url: str,
) -> None:
    from nestegg.checkpoint.stores.redis.connection import RedisConnection

    connection = RedisConnection(redis_url, max_connections=4, connect_timeout=0.3, retries=0)
    echo = connection.client.register_script("return 1")
    busy = connection.client.register_script(  # keeps Redis busy for 0.8 s
        "local t = redis.call('TIME') repeat local n = redis.call('TIME') "
        "until (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > 800000 return 1"
    )
    try:
        await connection.script(echo, [], [])  # loaded, and a connection kept
        await connection.client.script_load(busy.script)
        first, second = await asyncio.gather(
            connection.script(busy, [], []), connection.script(echo, [], []), return_exceptions=True
        )
        assert isinstance(first, StorageUnavailableError), first  # on the kept connection
        assert isinstance(second, StorageUnavailableError), second  # sent apart
        assert "no reply in 0.3 s" in str(second)
    finally:
        await asyncio.sleep(0.8)  # Redis is free again
        await connection.close()


@pytest.mark.parametrize("max_connections", [1, 2])
async def test_small_pools_serve_many_tasks_at_once(
    open_store: OpenStore, redis_url: str, max_connections: int
) -> None:
    pool = aioredis.BlockingConnectionPool.from_url(redis_url, max_connections=max_connections)
    client = aioredis.Redis.from_pool(pool)
    try:
        store = open_store(url=client)
        runs = [await create(store) for _ in range(6)]
        await asyncio.gather(*(commit_steps(store, run, range(1, 6)) for run in runs))
        for run in runs:
            assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3, 4, 5]
        await store.close()
    finally:
        await client.aclose()


@pytest.mark.parametrize("database", ["abc", "-1", "1.5", "99999999999"])
def test_a_url_whose_database_is_no_number_is_refused(database: str) -> None:
    with pytest.raises(ConfigurationError, match=f"is a number from 0 .*got '{database}'"):
        RedisCheckpointStorage(f"redis://127.0.0.1:6379/{database}")


def test_a_url_option_redis_py_does_not_take_is_refused_naming_it() -> None:
    # redis-py would raise TypeError at the first command
    with pytest.raises(ConfigurationError, match=r"unknown query option 'socket_timout' \("):
        RedisCheckpointStorage("redis://127.0.0.1:6379/0?socket_timout=5")
    with pytest.raises(ConfigurationError, match="unknown query options 'a', 'b'"):
        RedisCheckpointStorage("rediss://127.0.0.1:6379/0?ssl_cert_reqs=none&a=1&b=2")
    RedisCheckpointStorage("redis://127.0.0.1:6379/0?socket_timeout=5&health_check_interval=3")


@pytest.mark.parametrize(
    ("query", "option", "reason"),
    [
        (
            "ssl_cert_reqs=bogus",
            "ssl_cert_reqs",
            "Invalid SSL Certificate Requirements Flag: bogus",
        ),
        ("protocol=5", "protocol", "protocol must be either 2 or 3"),
        (
            "socket_timeout=abc",
            "socket_timeout",
            "Invalid value for 'socket_timeout' in connection URL.",
        ),
        (
            "ssl_cert_reqs=none&protocol=x",
            "protocol",
            "Invalid value for 'protocol' in connection URL.",
        ),
    ],
)
def test_a_url_option_value_redis_py_does_not_take_is_refused_naming_it(
    query: str, option: str, reason: str
) -> None:
    # redis-py would refuse the first two only at the first command (exit 1 or 4, not 2)
    url = f"rediss://u:s3cret@127.0.0.1:6379/0?{query}"
    with pytest.raises(ConfigurationError) as refused:
        RedisCheckpointStorage(url)
    assert str(refused.value) == (
        f"Redis store URL 'rediss://u@127.0.0.1:6379/0?{query}': redis-py does not take the "
        f"value of the query option {option!r}: {reason}"
    )
    RedisCheckpointStorage("rediss://127.0.0.1:6379/0?ssl_cert_reqs=optional&protocol=3")


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("timeout=-1", "?timeout= is a number of seconds above 0 (such as timeout=20), got '-1'"),
        (
            "socket_timeout=nan",
            "?socket_timeout= is a number of seconds above 0 (such as socket_timeout=20), "
            "got 'nan'",
        ),
        ("max_connections=0", "?max_connections= is a whole number from 1, got '0'"),
    ],
)
def test_a_wait_or_pool_size_redis_py_would_misuse_is_refused_naming_it(
    query: str, reason: str
) -> None:
    # redis-py takes them, then gives up every command at once (a StorageUnavailableError
    # retried for ever) or, for a pool of 0, uses its default size
    with pytest.raises(ConfigurationError) as refused:
        RedisCheckpointStorage(f"redis://127.0.0.1:6379/0?{query}")
    assert str(refused.value) == f"Redis store URL 'redis://127.0.0.1:6379/0?{query}': {reason}"


async def test_a_database_the_server_does_not_have_is_a_configuration_error(
    redis_url: str,
) -> None:
    store = RedisCheckpointStorage(f"{redis_url.rsplit('/', 1)[0]}/99")
    try:
        with pytest.raises(
            ConfigurationError, match=r"Redis at redis://\S+/99 has no such database"
        ):
            await store.setup()
    finally:
        await store.close()


def test_commands_are_packed_as_redis_py_packs_them() -> None:
    from redis.asyncio.connection import Connection

    args = ["EVALSHA", "abc", 2, "k:1", b"\x00bytes\r\n", -7, 1.5, "\u00e9", b""]
    assert command_bytes(args) == b"".join(Connection().pack_command(*args))
    assert command_bytes([*args, 2**70]) == b"".join(Connection().pack_command(*args, 2**70))
    assert command_bytes([]) == b"*0\r\n"


def test_commands_are_packed_the_same_without_hiredis(monkeypatch: pytest.MonkeyPatch) -> None:
    from nestegg.checkpoint.stores.redis import layout

    args = ["EVALSHA", "abc", 2, b"\x00bytes\r\n", -7, 1.5, "\u00e9", b""]
    packed_in_c = command_bytes(args)
    with_a_bool = command_bytes([*args, True])  # which hiredis refuses: packed here
    monkeypatch.setattr(layout, "_pack_in_c", None)
    assert command_bytes(args) == packed_in_c
    expected = b"*9\r\n" + packed_in_c.removeprefix(b"*8\r\n") + b"$4\r\nTrue\r\n"
    assert command_bytes([*args, True]) == with_a_bool == expected


async def test_a_given_client_is_used_and_left_open(open_store: OpenStore, client: Any) -> None:
    prefix = open_store().prefix
    store = RedisCheckpointStorage(client, prefix=prefix)
    run = await create(store)
    await store.close()
    assert await client.ping()
    assert await client.exists(f"{prefix}run:{run.run_id}") == 1


async def test_two_hundred_runs_commit_at_once_in_one_process(open_store: OpenStore) -> None:
    store = open_store()
    now = time.time()

    async def one_run(number: int) -> None:
        run = await create(store, run_id=f"run-{number:03d}")
        claimed = await store.claim_run(run.run_id, run.fence, OWNER, now + 30, now)
        kept: list[str] = []
        for seq in range(1, 6):
            checkpoint = make_checkpoint(run.run_id, seq)
            kept.append(checkpoint.checkpoint_id)
            await store.commit(
                make_commit(
                    claimed,
                    steps=[make_step(run.run_id, seq)],
                    events=[make_event(run.run_id, seq)],
                    checkpoints=[checkpoint],
                    prune=kept[:-2],
                    step_seq=seq,
                    event_seq=seq,
                )
            )
            del kept[:-2]

    await asyncio.gather(*(one_run(n) for n in range(200)))
    runs = await store.list_runs()
    assert len(runs) == 200
    assert {r.step_seq for r in runs} == {5}
    for number in (0, 99, 199):
        run_id = f"run-{number:03d}"
        assert [s.seq for s in await store.load_steps(run_id)] == [1, 2, 3, 4, 5]
        assert [c.seq for c in await store.list_checkpoints(run_id)] == [4, 5]


# --- optional driver -------------------------------------------------------------------

_WITHOUT_REDIS = """
import sys
sys.modules["redis"] = None
import nestegg, nestegg.checkpoint
from nestegg.errors import MissingDependencyError
for build in (
    lambda: nestegg.checkpoint.RedisCheckpointStorage("redis://127.0.0.1:6379/0"),
    lambda: nestegg.checkpoint.open_store("redis://127.0.0.1:6379/0"),
):
    try:
        build()
    except MissingDependencyError as exc:
        print(exc)
    else:
        print("no error")
"""


def test_without_redis_py_constructing_names_the_extra_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_REDIS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert all("pip install 'nestegg[redis]'" in line for line in lines), lines


async def test_an_error_reply_in_a_batch_names_the_server_as_every_other_error(
    open_store: OpenStore, client: Any, redis_url: str
) -> None:
    store = open_store()
    await store.setup()
    server = f"Redis at {without_password(redis_url)} failed: WRONGTYPE"

    def named(results: list[Any]) -> None:
        # The first call goes alone, the others wait and go together, in one pipeline.
        assert all(isinstance(r, StorageError) for r in results), results
        assert all(str(r).startswith(server) for r in results), results

    await client.set(f"{store.prefix}runs", b"not a sorted set")
    runs = [make_run() for _ in range(4)]
    named(await asyncio.gather(*(store.create_run(r) for r in runs), return_exceptions=True))
    await client.delete(f"{store.prefix}runs")
    runs = [await create(store) for _ in range(4)]
    for run in runs:
        await client.set(f"{store.prefix}run:{run.run_id}", b"not a hash")
    now = time.time()
    commits = (store.commit(make_commit(run)) for run in runs)
    named(await asyncio.gather(*commits, return_exceptions=True))
    claims = (store.claim_run(r.run_id, r.fence, OWNER, now + 30, now) for r in runs)
    named(await asyncio.gather(*claims, return_exceptions=True))
