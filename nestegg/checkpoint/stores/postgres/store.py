"""PostgreSQL store: psycopg 3 (async) with a psycopg_pool connection pool.

Tables are named ``<table_prefix>runs``, ``…steps``, ``…events``, ``…journal``, ``…signals`` and
``…checkpoints`` in the connection's current schema; they are created on first use from
the ordered migrations in :mod:`~nestegg.checkpoint.stores.postgres.schema` under an
advisory lock, so several processes may set up one database at once. A commit is one
call of a PL/pgSQL function: one round trip, one transaction, fenced by the run row; the
commits of many runs that arrive together are one call of another, which applies them
set by set (group commit), each still fenced by its own run row
(:mod:`~nestegg.checkpoint.stores.postgres.batches` holds these grouped operations, and
those of run reads, creations and claims). Every operation takes a connection from the
pool (``pool.connection()``) and gives it back; building and closing the pool and holding
a query to its deadline are in :mod:`~nestegg.checkpoint.stores.postgres.connection`, the
reads (runs listed, a run's steps, checkpoints, events, journal and signals) in
:mod:`~nestegg.checkpoint.stores.postgres.reads`.

psycopg and psycopg_pool are imported only in this package.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import hashlib
import math
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
from psycopg import sql

from nestegg.cancellation import cancel_and_wait
from nestegg.checkpoint.records import Commit, Owner, RunRecord
from nestegg.checkpoint.stores.common import (
    check_size,
    newer_than_known,
    older_than_read,
    run_exists,
)
from nestegg.checkpoint.stores.group import MAX_BATCH, GroupCalls, GroupCommitter, run_id_of
from nestegg.checkpoint.stores.postgres.batches import PostgresBatches, claimed_id
from nestegg.checkpoint.stores.postgres.connection import (
    Connection,
    Cursor,
    check_conninfo,
    close_at_exit,
    close_with_loop,
    closed_at_shutdown,
    describe,
    on_cursor,
    open_pool,
)
from nestegg.checkpoint.stores.postgres.errors import driver_errors
from nestegg.checkpoint.stores.postgres.migrations import (
    MIGRATIONS,
    READABLE_FROM,
    migration_names,
)
from nestegg.checkpoint.stores.postgres.reads import PostgresReads
from nestegg.checkpoint.stores.postgres.schema import (
    DROP_STATEMENTS,
    OBJECT_SUFFIXES,
    QUERIES,
    TABLE_SUFFIXES,
    validate_table_prefix,
)
from nestegg.checkpoint.stores.postgres.threads import PostgresThreadRows
from nestegg.checkpoint.stores.retry import retry_unavailable
from nestegg.checkpoint.stores.step_gate import pending_limit
from nestegg.constants import (
    DEFAULT_TABLE_PREFIX,
    MAX_PENDING_COMMITS,
    PG_POOL_MAX_SIZE,
    PG_POOL_MIN_SIZE,
    PG_PREPARE_THRESHOLD,
    RUNNING,
    SERVER_BATCHES_IN_FLIGHT,
    STORE_CONNECT_TIMEOUT,
    STORE_RETRIES,
)
from nestegg.errors import ConfigurationError, StorageError

T = TypeVar("T")


class PostgresCheckpointStorage(PostgresBatches, PostgresReads, PostgresThreadRows):
    """Keeps runs in PostgreSQL, shared by every process and machine that reaches it.

    Args:
        url: a libpq URL (``postgresql://user@host:5432/db``); needed unless ``pool``
            is given.
        pool: an open ``psycopg_pool.AsyncConnectionPool`` to use instead of building one
            from ``url`` (not closed by :meth:`close`); its connections may be in
            autocommit mode or not.
        table_prefix: prefix of every table and function name (an SQL identifier).
        min_size: smallest size of the pool built from ``url``.
        max_size: largest size of the pool built from ``url``.
        prepare_threshold: psycopg prepares a statement after this many uses on a
            connection; ``None`` never prepares (needed behind PgBouncer in transaction
            mode).
        connect_timeout: seconds an operation waits for a connection and the server's
            answer, retries included, before ``StorageUnavailableError`` (a query still
            unanswered then is abandoned and its connection dropped); None: the ``url``'s
            ``?connect_timeout=`` if it gives one from 1, else 10.
        retries: retries (with backoff) of reads and commits after a connection failure,
            none starting later than ``connect_timeout`` after the first try; a commit
            is idempotent under its fence, so repeating it is safe.
        read_only: open it for a reader (what the ``nestegg`` commands that only read do):
            :meth:`setup` creates and migrates nothing, and the connections of a pool built
            from ``url`` are read-only (``default_transaction_read_only``), so a role
            allowed only to SELECT from the store's tables reads it; a schema older than
            a reader reads (:data:`READABLE_FROM`) is refused, not migrated.

        max_pending_commits: the commits waiting to be written or being written, at most,
            before the runs using this store wait to start their next steps (None, the
            default: no limit). With a limit such as 64, a commit is written in
            milliseconds with a thousand runs whose steps never wait, at the cost of some of
            their aggregate steps a second (README, "Steps held back").
    Raises:
        MissingDependencyError: psycopg or psycopg_pool is not installed.
        InvalidIdentifierError: a bad ``table_prefix``.
        ConfigurationError: neither ``url`` nor ``pool``, bad pool sizes, or a ``url``
            libpq cannot read or whose ``connect_timeout`` is no whole number of seconds.

    Example:
        >>> store = PostgresCheckpointStorage("postgresql://app@db:5432/app", max_size=20)
        >>> clutch = Clutch("p", checkpoint=CheckpointConfig(storage=store))
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        pool: Any = None,
        table_prefix: str = DEFAULT_TABLE_PREFIX,
        min_size: int = PG_POOL_MIN_SIZE,
        max_size: int = PG_POOL_MAX_SIZE,
        prepare_threshold: int | None = PG_PREPARE_THRESHOLD,
        connect_timeout: float | None = None,
        retries: int = STORE_RETRIES,
        read_only: bool = False,
        max_pending_commits: int | None = MAX_PENDING_COMMITS,
    ) -> None:
        self.table_prefix = validate_table_prefix(table_prefix)
        self.read_only = read_only
        if url is None and pool is None:
            raise ConfigurationError("PostgresCheckpointStorage needs a url or a pool")
        if not 1 <= min_size <= max_size:
            raise ConfigurationError(
                f"PostgresCheckpointStorage pool sizes need 1 <= min_size <= max_size, got "
                f"min_size={min_size}, max_size={max_size}"
            )
        given = check_conninfo(url) if url is not None else None  # its ?connect_timeout=
        if connect_timeout is None:
            connect_timeout = STORE_CONNECT_TIMEOUT if given is None else given
        self._url = url
        self._pool: Any = pool
        self._owns_pool = pool is None
        self._min_size = min_size
        self._max_size = max_size
        self._connection_options: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": prepare_threshold,
            "connect_timeout": max(1, math.ceil(connect_timeout)),
        }
        self._connect_timeout = connect_timeout
        self._retries = retries
        self._where = describe(url) if url is not None else "the given pool"
        self._queries: dict[str, bytes] = {}
        self._migrations: list[list[bytes]] = []
        self._drop: list[bytes] = []
        self._ready = False
        self._setup_lock = asyncio.Lock()
        # A written batch's runs all go on in one turn of the loop: told a few at a time,
        # they cost PostgreSQL more, smaller batches (10 to 20% fewer steps a second at
        # 1,000 runs), and its commit's tail, the server's WAL flush, stayed the same
        # (bench/concurrent_runs.py, docs/benchmarks.md).
        self._group = GroupCommitter(
            self._commit_one,
            self._commit_many,
            in_flight=SERVER_BATCHES_IN_FLIGHT,
            wake_per_turn=MAX_BATCH,
            max_pending=pending_limit(max_pending_commits, "PostgresCheckpointStorage"),
        )
        # Thousands of runs starting at once: their reads, creations and claims go out
        # together too, not one by one through the pool's few connections.
        self._get_runs = GroupCalls(self._get_one, self._get_many, str)
        self._create_runs = GroupCalls(self._create_one, self._create_many, run_id_of)
        self._claims = GroupCalls(self._claim_one, self._claim_many, claimed_id)
        self._exit_hook: Callable[[], None] | None = None
        self._closer: asyncio.Task[None] | None = None
        self._shutdown: AsyncGenerator[None, None] | None = None
        digest = hashlib.blake2b(f"nestegg-schema:{table_prefix}".encode(), digest_size=8)
        self._lock_key = int.from_bytes(digest.digest(), "big", signed=True)

    ABSENT = (
        "no nestegg tables there (a run creates them; a store with a prefix of its own: "
        "?table_prefix=app_)"
    )
    """Why a command that only reads finds no store here (:meth:`exists` is False)."""

    @property
    def where(self) -> str:
        """Where this store is, as a command's message names it: the server (its URL
        without the password, or the given pool) and the table prefix."""
        return f"{self._where}, table prefix {self.table_prefix!r}"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresCheckpointStorage:
        """A store for a ``postgresql://`` URL; ``options`` as in the constructor."""
        return cls(url, **options)

    # -- connections and schema -------------------------------------------------------------

    async def _open_pool(self) -> None:
        if self._pool is not None:
            return
        self._pool = await open_pool(
            self._url or "",
            self._where,
            self._connect_timeout,
            name=f"nestegg-{self.table_prefix}",
            min_size=self._min_size,
            max_size=self._max_size,
            options=self._connection_options,
            read_only=self.read_only,
        )
        loop = asyncio.get_running_loop()
        self._closer = loop.create_task(
            close_with_loop(weakref.ref(self), self._pool), name=f"{self._pool.name}-closer"
        )
        self._exit_hook = functools.partial(close_at_exit, weakref.ref(self), loop)
        atexit.register(self._exit_hook)
        self._shutdown = closed_at_shutdown(self._closer)
        await anext(self._shutdown)  # the loop finalizes it as it shuts down

    def _let_go(self, pool: Any) -> None:
        """Forget ``pool``, which its closer closes, if it is still this store's: the next
        use opens another."""
        if self._pool is not pool:
            return
        self._pool = None
        self._closer = None
        self._shutdown = None
        self._ready = False
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
            self._exit_hook = None

    def _render(self, conn: Connection) -> None:
        names = {key: sql.Identifier(self.table_prefix + s) for key, s in TABLE_SUFFIXES.items()}
        names |= {key: sql.Identifier(self.table_prefix + s) for key, s in OBJECT_SUFFIXES.items()}

        def render(template: str) -> bytes:
            rendered: bytes = sql.SQL(template).format(**names).as_bytes(conn)
            return rendered

        def render_migration(statement: str) -> bytes:  # its names frozen in its text
            frozen = {n: sql.Identifier(self.table_prefix + n) for n in migration_names(statement)}
            rendered: bytes = sql.SQL(statement).format(**frozen).as_bytes(conn)
            return rendered

        self._queries = {key: render(q) for key, q in QUERIES.items()}
        self._migrations = [[render_migration(s) for s in m] for m in MIGRATIONS]
        self._drop = [render(s) for s in DROP_STATEMENTS]

    async def _migrate(self, conn: Connection) -> int:
        q = self._queries
        async with conn.transaction():
            await conn.execute(q["lock_schema"], [self._lock_key])
            await conn.execute(q["version_table"])
            version = int((await (await conn.execute(q["schema_version"])).fetchone())[0])
            for index in range(version, len(self._migrations)):
                for statement in self._migrations[index]:
                    await conn.execute(statement)
                await conn.execute(q["record_version"], [index + 1])
        return max(version, len(self._migrations))

    async def _check_readable(self, conn: Connection) -> None:
        """For a reader: the store's tables are there, of a schema it reads as it is;
        nothing is created or migrated."""
        if not await self._versions_found(conn):
            raise StorageError(f"no store at {self._where}: {self.ABSENT}")
        found = await conn.execute(self._queries["schema_version"])
        version = int((await found.fetchone())[0])
        what = f"PostgreSQL at {self._where}: the store"
        if version > len(MIGRATIONS):
            raise newer_than_known(what, version, len(MIGRATIONS))
        if version < READABLE_FROM:
            who = "as a role that may alter its tables"
            raise older_than_read(what, version, READABLE_FROM, who, self._where)

    async def setup(self) -> None:
        """Connect and bring the schema to the newest version (idempotent; safe when
        several processes do it at once); a store opened :attr:`read_only` only checks
        that its schema is one a reader reads.

        Raises:
            StorageUnavailableError: the server cannot be reached.
            StorageError: read-only, no tables or a schema older than :data:`READABLE_FROM`.
        """
        if self._ready:
            return
        async with self._setup_lock:
            if self._ready:
                return
            await self._open_pool()

            async def migrate() -> None:
                with driver_errors(self._where):
                    async with self._pool.connection() as conn:
                        self._render(conn)
                        if self.read_only:
                            await self._check_readable(conn)
                        else:
                            await self._migrate(conn)

            await retry_unavailable(
                migrate, self._retries, self._pool.check, deadline=self._connect_timeout
            )
            self._ready = True

    async def exists(self) -> bool:
        """Whether this store's tables are in the database, found without creating them
        (what a command that only reads checks before :meth:`setup`).

        Raises:
            StorageUnavailableError: the server cannot be reached.
        """
        await self._open_pool()

        async def look() -> bool:
            with driver_errors(self._where):
                async with self._pool.connection() as conn:
                    return await self._versions_found(conn)

        return await retry_unavailable(
            look, self._retries, self._pool.check, deadline=self._connect_timeout
        )

    async def _versions_found(self, conn: Connection) -> bool:
        """Whether the version table is there (looked up without reading or creating it)."""
        versions = self.table_prefix + TABLE_SUFFIXES["versions"]
        name = sql.Identifier(versions).as_string(conn)
        found = await conn.execute("SELECT to_regclass(%s)", [name])
        row = await found.fetchone()
        return row is not None and row[0] is not None

    async def schema_version(self) -> int:
        """The schema version stored in the database (0 before setup).

        Raises:
            StorageUnavailableError: the server cannot be reached.
        """
        await self.setup()
        row = await self._fetchone("schema_version", [])
        return int(row[0]) if row else 0

    async def close(self) -> None:
        """Close the pool this store built from its URL (a given pool stays open)."""
        await self._group.drain()
        if self._closer is not None:  # only a pool built from the URL has one
            await cancel_and_wait(self._closer)

    async def drop(self) -> None:
        """Delete this store's tables and function, with everything stored in them.

        Meant for tests and for removing nestegg from a database; the next use creates
        the schema again.
        """
        await self.setup()

        async def drop(cursor: Cursor) -> None:
            async with cursor.connection.transaction():
                await cursor.execute(self._queries["lock_schema"], [self._lock_key])
                for statement in self._drop:
                    await cursor.execute(statement)

        await self._with_connection(drop, idempotent=True)
        self._ready = False

    async def _with_connection(
        self, operation: Callable[[Cursor], Awaitable[T]], *, idempotent: bool
    ) -> T:
        if not self._ready:
            await self.setup()

        deadline = time.monotonic() + self._connect_timeout

        async def attempt() -> T:
            with driver_errors(self._where):
                return await on_cursor(self._pool, operation, deadline)

        if not idempotent:
            return await attempt()
        return await retry_unavailable(
            attempt, self._retries, self._pool.check, deadline=self._connect_timeout
        )

    async def _fetchall(self, query: str, params: Sequence[Any] | dict[str, Any]) -> list[Any]:
        async def fetch(cursor: Cursor) -> list[Any]:
            await cursor.execute(self._queries[query], params, binary=True)
            rows: list[Any] = await cursor.fetchall()
            return rows

        return await self._with_connection(fetch, idempotent=True)

    async def _fetchone(self, query: str, params: Sequence[Any]) -> Any:
        async def fetch(cursor: Cursor) -> Any:
            await cursor.execute(self._queries[query], params, binary=True)
            return await cursor.fetchone()

        return await self._with_connection(fetch, idempotent=True)

    # -- runs ---------------------------------------------------------------------------

    async def create_run(self, run: RunRecord) -> None:
        if not await self._create_runs.call(run):
            raise run_exists(run.run_id)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._get_runs.call(run_id)

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
        params = [owner.host, owner.pid, owner.started, lease_until, RUNNING, now]
        return await self._claims.call([*params, run_id, expected_fence, reopen])

    def step_admission(self) -> Awaitable[None] | None:
        """None when a run may start its next step now; else what it awaits first."""
        return self._group.step_admission()

    async def commit(self, commit: Commit) -> None:
        check_size(commit)
        await self._group.commit(commit)

    # -- deletion -----------------------------------------------------------------------

    async def _delete_runs(self, query: str, params: Sequence[Any] | dict[str, Any]) -> list[str]:
        async def delete(cursor: Cursor) -> list[str]:
            async with cursor.connection.transaction():
                # Deleting the run rows locks them: a commit of these runs waits, then
                # finds no run; the children are deleted in a fresh snapshot after that.
                await cursor.execute(self._queries[query], params)
                ids = [row[0] for row in await cursor.fetchall()]
                if ids:
                    await cursor.execute(self._queries["delete_run_data"], {"ids": ids})
            return ids

        return await self._with_connection(delete, idempotent=True)

    async def delete_run(self, run_id: str) -> bool:
        return bool(await self._delete_runs("delete_runs", [[run_id]]))

    async def delete_checkpoints(self, run_id: str, checkpoint_ids: Sequence[str]) -> int:
        if not checkpoint_ids:
            return 0
        return len(await self._fetchall("delete_checkpoints", [run_id, list(checkpoint_ids)]))

    async def expire_runs(
        self, statuses: Sequence[str], updated_before: float, pipeline: str | None = None
    ) -> list[str]:
        params = {"statuses": list(statuses), "before": updated_before, "pipeline": pipeline}
        return await self._delete_runs("expire_runs", params)


__all__ = ["PostgresCheckpointStorage", "validate_table_prefix"]
