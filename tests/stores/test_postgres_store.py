"""What only the PostgreSQL store does: migrations, prefixes, pools, races, lost connections.

Runs against the real server of ``NESTEGG_TEST_PG_URL``; each test has its own table
prefix and drops it afterwards. The contract itself is in test_contract.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.records import Owner
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.stores.postgres.migrations import MIGRATIONS
from nestegg.constants import COMPLETED, EXIT_USAGE
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
    snapshot,
)
from tests.cli.test_subprocess import nestegg
from tests.servers import drop_postgres_tables
from tests.stores.private_servers import PrivatePostgres

pytestmark = pytest.mark.server

psycopg = pytest.importorskip("psycopg")
from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage  # noqa: E402

OpenStore = Callable[..., PostgresCheckpointStorage]


@pytest.fixture
async def open_store(pg_url: str) -> AsyncIterator[OpenStore]:
    """Builds stores on one fresh table prefix; closes them and drops the prefix after."""
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    opened: list[PostgresCheckpointStorage] = []

    def build(**options: Any) -> PostgresCheckpointStorage:
        options.setdefault("table_prefix", prefix)
        store = PostgresCheckpointStorage(pg_url, **options)
        opened.append(store)
        return store

    yield build
    for store in opened:
        await store.close()
    await drop_postgres_tables(pg_url, prefix)


async def _tables(pg_url: str, prefix: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cursor = await conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE left(table_name, %s) = %s"
            " ORDER BY table_name",
            (len(prefix), prefix),
        )
        return [row[0] for row in await cursor.fetchall()]


async def _versions(pg_url: str, prefix: str) -> list[int]:
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        cursor = await conn.execute(
            psycopg.sql.SQL("SELECT version FROM {} ORDER BY version").format(
                psycopg.sql.Identifier(f"{prefix}schema_versions")
            )
        )
        return [row[0] for row in await cursor.fetchall()]


# --- schema ----------------------------------------------------------------------------


async def test_migrations_are_recorded_once_and_setup_is_idempotent(
    open_store: OpenStore, pg_url: str
) -> None:
    store = open_store()
    await store.setup()
    await store.setup()
    again = open_store()
    await again.setup()
    assert await store.schema_version() == len(MIGRATIONS)
    assert await _versions(pg_url, store.table_prefix) == list(range(1, len(MIGRATIONS) + 1))
    names = await _tables(pg_url, store.table_prefix)
    suffixes = {"checkpoints", "events", "journal", "runs", "schema_versions", "signals", "steps"}
    suffixes |= {"lg_threads", "lg_rows"}  # LangGraph threads (nestegg.langgraph)
    assert names == sorted(store.table_prefix + s for s in suffixes)


async def _store_at_version(
    open_store: OpenStore, monkeypatch: pytest.MonkeyPatch, version: int
) -> PostgresCheckpointStorage:
    """A store set up with the schema as version ``version`` left it."""
    from nestegg.checkpoint.stores.postgres import store as postgres

    with monkeypatch.context() as patched:
        patched.setattr(postgres, "MIGRATIONS", MIGRATIONS[:version])
        old = open_store()
        await old.setup()
    return old


async def test_a_version_2_schema_upgrades_and_its_truncations_then_drop_the_journal(
    open_store: OpenStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await _store_at_version(open_store, monkeypatch, 2)
    run = await create(old)
    await commit_steps(old, run, range(1, 4))
    journal = [make_journal(run.run_id, step, 0) for step in range(1, 4)]
    await old.commit(make_commit(run, journal=journal))
    assert await _versions(pg_url, old.table_prefix) == [1, 2]
    await old.close()

    new = open_store()
    await new.setup()
    assert await _versions(pg_url, new.table_prefix) == list(range(1, len(MIGRATIONS) + 1))
    assert await new.read_journal(run.run_id, 3) == [journal[2]]
    await new.commit(make_commit(run, truncate_after=1))
    assert [s.seq for s in await new.load_steps(run.run_id)] == [1]
    assert [await new.read_journal(run.run_id, step) for step in range(1, 4)] == [
        [journal[0]],
        [],
        [],
    ]


async def _plan_of_list_forks(pg_url: str, store: PostgresCheckpointStorage) -> str:
    """How PostgreSQL reads the forks of a run of ``store``, sequential scans off (a small
    table is read whole otherwise)."""
    async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as conn:
        await conn.execute("SET enable_seqscan = off")
        query = b"EXPLAIN " + store._queries["list_forks"]
        rows = await (await conn.execute(query, ["p", None])).fetchall()
        return "\n".join(row[0] for row in rows)


async def test_a_version_6_schema_gets_the_index_of_forks_a_reader_lists_them_without_it(
    open_store: OpenStore, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = await _store_at_version(open_store, monkeypatch, 6)
    await create(old, run_id="p")
    forks = [await create(old, run_id=f"f{i}", parent_run="p") for i in (1, 2)]
    grandchild = await create(old, run_id="g", parent_run="f1")
    await old.close()
    index = f"{old.table_prefix}runs_parent_idx"

    reader = open_store(read_only=True)
    assert await reader.list_forks("p") == forks[::-1]
    assert await reader.list_forks("f1") == [grandchild]
    assert await _versions(pg_url, old.table_prefix) == list(range(1, 7))  # as it was
    assert index not in await _plan_of_list_forks(pg_url, reader)

    new = open_store()
    await new.setup()
    assert await _versions(pg_url, old.table_prefix) == list(range(1, len(MIGRATIONS) + 1))
    assert await new.list_forks("p") == forks[::-1]
    plan = await _plan_of_list_forks(pg_url, new)
    assert f"Index Scan using {index}" in plan and "Sort" not in plan, plan


async def test_concurrent_setup_from_many_tasks_and_pools(
    open_store: OpenStore, pg_url: str
) -> None:
    stores = [open_store() for _ in range(6)]
    await asyncio.gather(*(s.setup() for s in stores), *(stores[0].setup() for _ in range(3)))
    assert await _versions(pg_url, stores[0].table_prefix) == list(range(1, len(MIGRATIONS) + 1))
    run = await create(stores[1])
    assert await stores[5].get_run(run.run_id) == run


async def test_the_schema_is_created_on_first_use_without_setup(open_store: OpenStore) -> None:
    store = open_store()
    run = await create(store)
    assert await store.get_run(run.run_id) == run


async def test_drop_removes_every_table_and_the_next_use_recreates_them(
    open_store: OpenStore, pg_url: str
) -> None:
    store = open_store()
    run = await create(store)
    await store.drop()
    assert await _tables(pg_url, store.table_prefix) == []
    assert await store.get_run(run.run_id) is None
    assert await store.schema_version() == len(MIGRATIONS)


@pytest.mark.parametrize(
    "prefix",
    ["", "1abc_", "a-b_", "a b", 'x"; DROP TABLE runs; --', "nestegg.", "ünï_", "a" * 33, None],
)
def test_a_table_prefix_that_is_not_an_identifier_is_rejected(prefix: Any) -> None:
    with pytest.raises(InvalidIdentifierError, match="table_prefix"):
        PostgresCheckpointStorage("postgresql://nobody@127.0.0.1/none", table_prefix=prefix)


def test_bad_construction_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="url or a pool"):
        PostgresCheckpointStorage()
    with pytest.raises(ConfigurationError, match="min_size"):
        PostgresCheckpointStorage("postgresql://x@127.0.0.1/x", min_size=5, max_size=2)
    for url in (5, b"postgresql://x@127.0.0.1/x"):
        with pytest.raises(
            ConfigurationError, match=rf"a postgresql:// URL \(a str\) or a pool, got {url!r}"
        ):
            PostgresCheckpointStorage(url)  # type: ignore[arg-type]


def test_a_url_option_libpq_does_not_take_is_refused_naming_it() -> None:
    # psycopg would raise ProgrammingError at the first connection
    with pytest.raises(ConfigurationError, match='invalid URI query parameter: "sslmod"'):
        PostgresCheckpointStorage("postgresql://x@127.0.0.1/x?sslmod=require")
    with pytest.raises(ConfigurationError, match='invalid connection option "foo"'):
        PostgresCheckpointStorage("host=127.0.0.1 foo=1")
    PostgresCheckpointStorage("postgresql://x@127.0.0.1/x?sslmode=require&application_name=a")


@pytest.mark.parametrize("timeout", ["abc", "-3", "2.5", "", "\u0663"])
def test_a_connect_timeout_that_is_no_whole_number_of_seconds_is_refused(timeout: str) -> None:
    # the store's own connect_timeout stood in for it, and nothing was said
    url = f"postgresql://x@127.0.0.1/x?connect_timeout={timeout}"
    with pytest.raises(ConfigurationError) as raised:
        PostgresCheckpointStorage(url.replace("x@", "x:s3cret@"))
    assert str(raised.value) == (
        f"PostgreSQL store URL {url!r}: the option connect_timeout takes a whole number of "
        f"seconds from 0, got {timeout!r}"
    )
    with pytest.raises(ConfigurationError, match="the option connect_timeout takes"):
        PostgresCheckpointStorage(f"host=127.0.0.1 connect_timeout='{timeout}'")
    PostgresCheckpointStorage("postgresql://x@127.0.0.1/x?connect_timeout=0")
    PostgresCheckpointStorage("host=127.0.0.1 connect_timeout=10")


def test_a_url_option_libpq_does_not_take_is_refused_in_one_line() -> None:
    url = "postgresql://x@127.0.0.1/x?max_pending_commits=8"
    with pytest.raises(ConfigurationError) as raised:
        PostgresCheckpointStorage(url)
    assert str(raised.value) == (  # libpq's reason ended in a newline, inside the message
        f'PostgreSQL store URL {url!r}: invalid URI query parameter: "max_pending_commits" '
        "(libpq takes its connection options there, such as ?sslmode=require; the store's "
        "table prefix: table_prefix=)"
    )


# --- ownership -------------------------------------------------------------------------


async def test_exactly_one_of_many_concurrent_claimers_wins(open_store: OpenStore) -> None:
    stores = [open_store(max_size=5) for _ in range(3)]
    run = await create(stores[0])
    now = time.time()

    async def claim(number: int) -> Any:
        owner = Owner(host=f"host-{number}", pid=number, started="1")
        try:
            return await stores[number % 3].claim_run(run.run_id, run.fence, owner, now + 30, now)
        except RunLockedError as exc:
            return exc

    results = await asyncio.gather(*(claim(n) for n in range(40)))
    winners = [r for r in results if not isinstance(r, RunLockedError)]
    assert len(winners) == 1
    stored = await stores[0].get_run(run.run_id)
    assert stored is not None
    assert stored.fence == run.fence + 1
    assert stored.owner == winners[0].owner


async def test_a_stale_commit_is_rejected_and_writes_nothing(open_store: OpenStore) -> None:
    store = open_store()
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    now = time.time()
    await store.claim_run(run.run_id, run.fence, OWNER, now + 30, now)
    before = (
        await store.get_run(run.run_id),
        await store.load_steps(run.run_id),
        await store.read_events(run.run_id),
        await store.list_checkpoints(run.run_id),
        await store.read_journal(run.run_id, 3),
    )
    kept = before[3][0].checkpoint_id
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
    after = (
        await store.get_run(run.run_id),
        await store.load_steps(run.run_id),
        await store.read_events(run.run_id),
        await store.list_checkpoints(run.run_id),
        await store.read_journal(run.run_id, 3),
    )
    assert after == before


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


# --- connections -----------------------------------------------------------------------


async def test_an_unreachable_server_is_storage_unavailable_quickly() -> None:
    store = PostgresCheckpointStorage(
        "postgresql://postgres@127.0.0.1:1/test", connect_timeout=1, retries=0
    )
    started = time.monotonic()
    try:
        with pytest.raises(StorageUnavailableError, match=r"127\.0\.0\.1:1"):
            await store.get_run("run-1")
    finally:
        await store.close()
    assert time.monotonic() - started < 10


async def test_a_urls_connect_timeout_is_the_stores_unless_one_is_given() -> None:
    store = PostgresCheckpointStorage("postgresql://postgres@127.0.0.1:1/test?connect_timeout=2")
    started = time.monotonic()
    try:
        with pytest.raises(StorageUnavailableError, match="Connection refused"):
            await store.get_run("run-1")  # a refused connection is retried for 2 s, not 10
    finally:
        await store.close()
    assert 1.5 < time.monotonic() - started < 8
    given = "postgresql://x@127.0.0.1/x?connect_timeout=2"
    assert PostgresCheckpointStorage(given, connect_timeout=5)._connect_timeout == 5
    for url in ("postgresql://x@127.0.0.1/x", "postgresql://x@127.0.0.1/x?connect_timeout=0"):
        assert PostgresCheckpointStorage(url)._connect_timeout == 10  # 0 waits for ever: none


@pytest.mark.parametrize(
    ("where", "cause", "expected"),
    [
        ("127.0.0.1:1/test", "Connection refused", StorageUnavailableError),
        # settings the server refuses: the URL is what is wrong
        (
            "postgres@127.0.0.1:{port}/no_such_database",
            'database "no_such_database"',
            ConfigurationError,
        ),
        (
            "nestegg_no_such_role@127.0.0.1:{port}/test",
            'role "nestegg_no_such_role"',
            ConfigurationError,
        ),
    ],
)
async def test_a_server_that_cannot_be_used_is_named_with_psycopg_s_own_reason(
    pg_url: str, where: str, cause: str, expected: type[Exception]
) -> None:
    port = psycopg.conninfo.conninfo_to_dict(pg_url).get("port", 5432)
    store = PostgresCheckpointStorage(f"postgresql://{where.format(port=port)}", connect_timeout=2)
    started = time.monotonic()
    try:
        with pytest.raises(expected, match=cause) as caught:
            await store.get_run("run-1")
    finally:
        await store.close()
    assert "pool initialization" not in str(caught.value)
    assert "\n" not in str(caught.value)  # libpq's lines joined: "refused; Is the server ..."
    assert time.monotonic() - started < 2  # within the connect timeout; at once when refused


async def test_reads_and_commits_ride_through_killed_connections(
    open_store: OpenStore, pg_url: str
) -> None:
    name = f"nestegg-test-{uuid.uuid4().hex[:8]}"
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}application_name={name}"
    prefix = open_store().table_prefix
    store = PostgresCheckpointStorage(url, table_prefix=prefix, min_size=3, max_size=3)
    try:
        run = await create(store)
        await commit_steps(store, run, range(1, 3))
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            cursor = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            )
            assert (await cursor.fetchone())[0] >= 1
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2]
        await commit_steps(store, run, range(3, 5))
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3, 4]
    finally:
        await store.close()


async def test_a_given_pool_is_used_and_left_open(open_store: OpenStore, pg_url: str) -> None:
    from psycopg_pool import AsyncConnectionPool

    prefix = open_store().table_prefix
    pool = AsyncConnectionPool(pg_url, min_size=1, max_size=2, open=False)  # not autocommit
    await pool.open()
    try:
        store = PostgresCheckpointStorage(pool=pool, table_prefix=prefix)
        run = await create(store)
        await commit_steps(store, run, range(1, 4), checkpoints=True)
        await store.close()
        assert not pool.closed
        async with pool.connection() as conn:
            cursor = await conn.execute(
                psycopg.sql.SQL("SELECT count(*) FROM {}").format(
                    psycopg.sql.Identifier(f"{prefix}steps")
                )
            )
            assert (await cursor.fetchone())[0] == 3
    finally:
        await pool.close()


async def test_a_given_pool_gets_back_the_connection_the_store_kept(
    open_store: OpenStore, pg_url: str
) -> None:
    from psycopg_pool import AsyncConnectionPool

    prefix = open_store().table_prefix
    pool = AsyncConnectionPool(pg_url, min_size=2, max_size=2, open=False, timeout=3)
    await pool.open()
    try:
        store = PostgresCheckpointStorage(pool=pool, table_prefix=prefix)
        run = await create(store)
        await commit_steps(store, run, range(1, 3))
        await store.close()
        async with pool.connection() as first, pool.connection() as second:
            assert first is not second
    finally:
        await pool.close()


@pytest.mark.parametrize("max_size", [1, 2])
async def test_small_pools_serve_many_tasks_at_once(open_store: OpenStore, max_size: int) -> None:
    store = open_store(min_size=1, max_size=max_size)
    runs = [await create(store) for _ in range(6)]
    await asyncio.gather(*(commit_steps(store, run, range(1, 6)) for run in runs))
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1, 2, 3, 4, 5]


async def test_without_prepared_statements_for_pgbouncer(open_store: OpenStore) -> None:
    store = open_store(prepare_threshold=None)
    run = await create(store)
    await commit_steps(store, run, range(1, 12), checkpoints=True)
    assert len(await store.load_steps(run.run_id)) == 11


async def test_two_hundred_runs_commit_at_once_in_one_process(open_store: OpenStore) -> None:
    store = open_store(max_size=10)
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


async def _each_at_once(store: Any, commits: list[Any]) -> list[str]:
    """``commits`` sent at once (the first alone, the rest as one group); each one's error
    class name, or "ok"."""

    async def one(commit: Any) -> str:
        try:
            await store.commit(commit)
        except Exception as error:
            return type(error).__name__
        return "ok"

    return await asyncio.gather(*(one(c) for c in commits))


def _mixed_commits(runs: list[Any], seq: int, kept: dict[str, list[str]]) -> list[Any]:
    """One commit per run doing one kind of change after another: steps with journal
    entries and checkpoints, a truncation, pruning, a finished run, a stale fence."""
    commits = []
    for number, run in enumerate(runs):
        rid, kind = run.run_id, (number + seq) % 5
        checkpoint = make_checkpoint(rid, seq)
        fields: dict[str, Any] = {
            "steps": [make_step(rid, seq)],
            "events": [make_event(rid, seq * 2), make_event(rid, seq * 2 + 1)],
            "journal": [make_journal(rid, seq, 0), make_journal(rid, seq, 1)],
            "checkpoints": [checkpoint],
            "step_seq": seq,
            "lease_until": 1000.0 + seq,
            "updated_at": 2000.0 + seq,
        }
        if kind == 1 and seq > 2:
            fields |= {"truncate_after": seq - 2, "journal_after": seq - 3}
            kept[rid] = []
        elif kind == 2:
            fields["prune"] = kept[rid][:-1]
            del kept[rid][:-1]
        elif kind == 3:
            fields |= {"status": COMPLETED, "result": b"done %d" % seq, "error": b"none"}
        fence = run.fence - 1 if kind == 4 and seq == 3 else run.fence
        kept[rid].append(checkpoint.checkpoint_id)
        commits.append(make_commit(run, fence=fence, **fields))
    return commits


async def test_a_group_of_commits_of_every_kind_leaves_what_they_leave_one_by_one(
    open_store: OpenStore,
) -> None:
    store, alone = open_store(), MemoryCheckpointStorage()
    runs = [await create(store, run_id=f"mixed-{n:02d}") for n in range(12)]
    for run in runs:
        await alone.create_run(run)
    kept: dict[str, list[str]] = {run.run_id: [] for run in runs}
    ghost = make_run("ghost")
    for seq in range(1, 6):
        commits = _mixed_commits(runs, seq, kept)
        outcomes = await _each_at_once(store, [*commits, make_commit(ghost)])
        expected = [await _each_at_once(alone, [c]) for c in commits]
        assert outcomes == [*(e[0] for e in expected), "RunNotFoundError"]
    # Two commits of one run in one group land in their order.
    first, second = runs[0], runs[1]
    more = [make_commit(first, step_seq=7), make_commit(second, step_seq=8)]
    more.append(make_commit(second, steps=[make_step(second.run_id, 9)], step_seq=9))
    assert await _each_at_once(store, more) == ["ok"] * 3
    for commit in more:
        await alone.commit(commit)
    for run in runs:
        assert await snapshot(store, run.run_id) == await snapshot(alone, run.run_id)


# --- optional driver -------------------------------------------------------------------

_WITHOUT_PSYCOPG = """
import sys
sys.modules["psycopg"] = None
sys.modules["psycopg_pool"] = None
import nestegg, nestegg.checkpoint
from nestegg.errors import MissingDependencyError
for build in (
    lambda: nestegg.checkpoint.PostgresCheckpointStorage("postgresql://x@127.0.0.1/x"),
    lambda: nestegg.checkpoint.open_store("postgresql://x@127.0.0.1/x"),
    lambda: nestegg.checkpoint.SQLCheckpointStorage("postgresql://x@127.0.0.1/x"),
):
    try:
        build()
    except MissingDependencyError as exc:
        print(exc)
    else:
        print("no error")
"""


def test_without_psycopg_constructing_names_the_extra_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PSYCOPG], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3
    assert all("pip install 'nestegg[postgres]'" in line for line in lines), lines


def test_importing_nestegg_does_not_import_psycopg() -> None:
    code = (
        "import sys, nestegg, nestegg.checkpoint, nestegg.checkpoint.stores; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('psycopg', 'redis')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


async def test_a_url_without_the_password_the_server_asks_for_is_refused_at_once(
    tmp_path: Path,
) -> None:
    server = PrivatePostgres(password="s3cret")  # TCP connections need it: scram-sha-256
    server.start()
    try:
        store = PostgresCheckpointStorage(server.url, connect_timeout=30)
        started = time.monotonic()
        with pytest.raises(ConfigurationError) as refused:
            await store.setup()
        assert time.monotonic() - started < 10  # not retried until the timeout
        assert str(refused.value).startswith(
            f"PostgreSQL at {server.url} refused the store's settings: "
        )
        assert "no password supplied" in str(refused.value)
        await store.close()
        command = await asyncio.to_thread(nestegg, tmp_path, "runs", "--store", server.url)
        assert command.returncode == EXIT_USAGE, command.stderr
        assert "no password supplied (check the user, password" in command.stderr
    finally:
        server.remove()


async def test_a_session_the_server_ends_is_unavailable_and_the_store_recovers(
    pg_url: str,
) -> None:
    # pg_terminate_backend: 'consuming input failed: FATAL: terminating connection due to
    # administrator command', no SQLSTATE; a lost session, not a refusal of the settings
    name = f"nestegg_terminated_{uuid.uuid4().hex[:8]}"
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    url = f"{pg_url}{'&' if '?' in pg_url else '?'}application_name={name}"
    store = PostgresCheckpointStorage(url, table_prefix=prefix, retries=0, min_size=1, max_size=1)
    try:
        await store.create_run(make_run("r1"))
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as admin:
            cursor = await admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            )
            assert (await cursor.fetchone()) == (1,)
        await asyncio.sleep(0.5)  # the server has closed it: libpq finds it so on the query
        with pytest.raises(StorageUnavailableError) as lost:
            await store.get_run("r1")
        assert not isinstance(lost.value, ConfigurationError)
        assert "terminating connection due to administrator command" in str(lost.value)
        run = await store.get_run("r1")  # a new connection: the store goes on
        assert run is not None and run.run_id == "r1"
    finally:
        await store.close()
        await drop_postgres_tables(pg_url, prefix)


def _two_hosts(pg_url: str, second: str | None = None) -> str:
    """``pg_url`` naming its server twice (libpq's failover list), the second as
    ``second`` if given."""
    from urllib.parse import urlsplit

    parts = urlsplit(pg_url)
    user, at, host = parts.netloc.rpartition("@")
    server = host if ":" in host else f"{host}:5432"
    return parts._replace(netloc=f"{user}{at}{server},{second or server}").geturl()


async def test_a_url_with_several_hosts_opens_and_works(pg_url: str) -> None:
    from nestegg.checkpoint.stores import open_store

    prefix = f"t{uuid.uuid4().hex[:12]}_"
    url = _two_hosts(pg_url)
    failover = f"{url}{'&' if '?' in url else '?'}target_session_attrs=read-write"
    stores = [
        open_store(f"{failover}&table_prefix={prefix}"),
        PostgresCheckpointStorage(failover, table_prefix=prefix),
    ]
    try:
        for store in stores:
            await store.setup()
        await stores[0].create_run(make_run("r1"))
        run = await stores[1].get_run("r1")
        assert run is not None and run.run_id == "r1"
    finally:
        for store in stores:
            await store.close()
        await drop_postgres_tables(pg_url, prefix)


def test_a_url_with_a_bad_port_in_its_second_host_is_refused_naming_it(pg_url: str) -> None:
    from nestegg.checkpoint.stores import open_store

    url = _two_hosts(pg_url, "127.0.0.1:99999")
    for build in (open_store, PostgresCheckpointStorage):
        with pytest.raises(ConfigurationError) as refused:
            build(url)
        assert "host 2 of 2, '127.0.0.1:99999', cannot be read" in str(refused.value)


async def test_a_statement_the_server_gives_up_on_fails_its_step_not_given_back(
    open_store: OpenStore, pg_url: str
) -> None:
    """statement_timeout (57014) is the statement's own length, no outage: the same commit
    would time out again, so the step fails and the run with it, rather than staying
    running for a resume (or a worker) to try it again and again."""
    joiner = "&" if "?" in pg_url else "?"
    timing_out = f"{pg_url}{joiner}options=-c%20statement_timeout%3D5"
    reader = open_store()
    await reader.setup()
    store = PostgresCheckpointStorage(timing_out, table_prefix=reader.table_prefix)
    clutch = Clutch("p", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def big(data: dict[str, str]) -> dict[str, str]:
        return {"x": "y" * 40_000_000}

    try:
        with pytest.raises(StorageError) as raised:
            await clutch.run({}, run_id="slow")
        assert not isinstance(raised.value, StorageUnavailableError)
        assert "statement timeout" in str(raised.value)
        run = await reader.get_run("slow")
        assert run is not None and run.status == "failed"
    finally:
        await store.close()
