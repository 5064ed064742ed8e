"""PostgreSQL store: psycopg 3 (async) with a psycopg_pool connection pool.

Tables are named ``<table_prefix>runs``, ``…steps``, ``…events``, ``…journal`` and
``…checkpoints`` in the connection's current schema; they are created on first use from
the ordered migrations in :mod:`~nestegg.checkpoint.stores.postgres_schema` under an
advisory lock, so several processes may set up one database at once. A commit is one
call of a PL/pgSQL function: one round trip, one transaction, fenced by the run row.
The store keeps one pool connection (and its cursor) between operations, so that a
step's commit does not go through the pool; operations that overlap it take others.

psycopg and psycopg_pool are imported only here.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.postgres_schema import (
    DROP_STATEMENTS,
    MIGRATIONS,
    OBJECT_SUFFIXES,
    QUERIES,
    TABLE_SUFFIXES,
    checkpoint_from_row,
    commit_params,
    run_from_row,
    validate_table_prefix,
)
from nestegg.checkpoint.stores.postgres_threads import PostgresThreadRows
from nestegg.checkpoint.stores.retry import retry_unavailable
from nestegg.constants import (
    DEFAULT_TABLE_PREFIX,
    PG_POOL_MAX_SIZE,
    PG_POOL_MIN_SIZE,
    PG_PREPARE_THRESHOLD,
    RUNNING,
    STORE_CONNECT_TIMEOUT,
    STORE_RETRIES,
)
from nestegg.errors import (
    ConfigurationError,
    MissingDependencyError,
    RunExistsError,
    RunLockedError,
    RunNotFoundError,
    StaleOwnerError,
    StorageError,
    StorageUnavailableError,
)

_DRIVER_ERROR: ImportError | None = None
try:
    import psycopg
    import psycopg_pool
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
except ImportError as exc:  # the constructor names the extra to install
    _DRIVER_ERROR = exc

T = TypeVar("T")
Connection = Any  # psycopg.AsyncConnection[Any]; Any keeps the module importable without it
Cursor = Any  # psycopg.AsyncCursor[Any]

_HOLD_SECONDS = 60.0
"""How long the store keeps one pool connection between operations before it gives it
back (so that the pool's checks and ``max_lifetime`` still reach it)."""


def _require_driver() -> None:
    if _DRIVER_ERROR is not None:
        raise MissingDependencyError(
            f"the PostgreSQL store needs psycopg 3 and psycopg_pool ({_DRIVER_ERROR.name} is "
            "missing): pip install 'nestegg[postgres]'"
        ) from _DRIVER_ERROR


@contextmanager
def _driver_errors(where: str) -> Iterator[None]:
    """The one place where psycopg's exceptions become nestegg's."""
    try:
        yield
    except psycopg.OperationalError as exc:  # lost or refused connections, pool timeouts
        raise StorageUnavailableError(f"PostgreSQL at {where} is unavailable: {exc}") from exc
    except psycopg.Error as exc:
        raise StorageError(f"PostgreSQL at {where} failed: {exc}") from exc


def _describe(conninfo: str) -> str:
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "the configured server"
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


class PostgresCheckpointStorage(PostgresThreadRows):
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
        connect_timeout: seconds to wait for a connection before
            ``StorageUnavailableError``.
        retries: retries (with backoff) of reads and commits after a connection failure,
            none starting later than ``connect_timeout`` after the first try; a commit
            is idempotent under its fence, so repeating it is safe.

    Raises:
        MissingDependencyError: psycopg or psycopg_pool is not installed.
        InvalidIdentifierError: a bad ``table_prefix``.
        ConfigurationError: neither ``url`` nor ``pool``, or bad pool sizes.

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
        connect_timeout: float = STORE_CONNECT_TIMEOUT,
        retries: int = STORE_RETRIES,
    ) -> None:
        _require_driver()
        self.table_prefix = validate_table_prefix(table_prefix)
        if url is None and pool is None:
            raise ConfigurationError("PostgresCheckpointStorage needs a url or a pool")
        if not 1 <= min_size <= max_size:
            raise ConfigurationError(
                f"PostgresCheckpointStorage pool sizes need 1 <= min_size <= max_size, got "
                f"min_size={min_size}, max_size={max_size}"
            )
        self._url = url
        self._pool: Any = pool
        self._owns_pool = pool is None
        self._min_size = min_size
        self._max_size = max_size
        self._connection_options: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": prepare_threshold,
        }
        self._connect_timeout = connect_timeout
        self._retries = retries
        self._where = _describe(url) if url is not None else "the given pool"
        self._queries: dict[str, bytes] = {}
        self._migrations: list[list[bytes]] = []
        self._drop: list[bytes] = []
        self._ready = False
        self._setup_lock = asyncio.Lock()
        self._held: Connection = None
        self._held_cursor: Cursor = None
        self._held_until = 0.0
        self._held_busy = False
        digest = hashlib.blake2b(f"nestegg-schema:{table_prefix}".encode(), digest_size=8)
        self._lock_key = int.from_bytes(digest.digest(), "big", signed=True)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresCheckpointStorage:
        """A store for a ``postgresql://`` URL; ``options`` as in the constructor."""
        return cls(url, **options)

    # -- connections and schema -------------------------------------------------------------

    async def _open_pool(self) -> None:
        if self._pool is not None:
            return
        pool = psycopg_pool.AsyncConnectionPool(
            self._url or "",
            open=False,
            timeout=self._connect_timeout,
            name=f"nestegg-{self.table_prefix}",
            min_size=self._min_size,
            max_size=self._max_size,
            kwargs=self._connection_options,
        )
        try:
            with _driver_errors(self._where):
                await pool.open(wait=True, timeout=self._connect_timeout)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    def _render(self, conn: Connection) -> None:
        names = {key: sql.Identifier(self.table_prefix + s) for key, s in TABLE_SUFFIXES.items()}
        names |= {key: sql.Identifier(self.table_prefix + s) for key, s in OBJECT_SUFFIXES.items()}

        def render(template: str) -> bytes:
            rendered: bytes = sql.SQL(template).format(**names).as_bytes(conn)
            return rendered

        self._queries = {key: render(q) for key, q in QUERIES.items()}
        self._migrations = [[render(s) for s in m] for m in MIGRATIONS]
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

    async def setup(self) -> None:
        """Connect and bring the schema to the newest version (idempotent; safe when
        several processes do it at once).

        Raises:
            StorageUnavailableError: the server cannot be reached.
        """
        if self._ready:
            return
        async with self._setup_lock:
            if self._ready:
                return
            await self._open_pool()

            async def migrate() -> None:
                with _driver_errors(self._where):
                    async with self._pool.connection() as conn:
                        self._render(conn)
                        await self._migrate(conn)

            await retry_unavailable(
                migrate, self._retries, self._pool.check, deadline=self._connect_timeout
            )
            self._ready = True

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
        await self._release_held()
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            self._ready = False
            await pool.close()

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

    async def _release_held(self) -> None:
        conn, self._held, self._held_cursor = self._held, None, None
        if conn is not None and self._pool is not None:
            await self._pool.putconn(conn)  # rolls back or replaces it as needed

    async def _on_cursor(self, operation: Callable[[Cursor], Awaitable[T]]) -> T:
        """Run ``operation`` on a cursor of the connection this store keeps between
        operations when it is free (a step's commit then skips the pool and reuses the
        cursor), else on one of a connection from the pool."""
        if self._held_busy or self._pool.max_size < 2:  # a pool of one is never held
            async with self._pool.connection() as conn:
                return await operation(conn.cursor())
        self._held_busy = True
        try:
            if self._held is None:
                self._held = await self._pool.getconn()
                self._held_cursor = self._held.cursor()
                self._held_until = time.monotonic() + _HOLD_SECONDS
            try:
                result = await operation(self._held_cursor)
                if not self._held.autocommit:
                    await self._held.commit()
            except BaseException:
                await self._release_held()
                raise
            if time.monotonic() > self._held_until:
                await self._release_held()
            return result
        finally:
            self._held_busy = False

    async def _with_connection(
        self, operation: Callable[[Cursor], Awaitable[T]], *, idempotent: bool
    ) -> T:
        if not self._ready:
            await self.setup()

        async def attempt() -> T:
            with _driver_errors(self._where):
                return await self._on_cursor(operation)

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
        owner = run.owner
        params = [
            run.run_id,
            run.pipeline,
            run.status,
            run.input,
            run.created_at,
            run.updated_at,
            run.fence,
            owner.host if owner else None,
            owner.pid if owner else None,
            owner.started if owner else None,
            run.lease_until,
            run.result,
            run.error,
            run.step_seq,
            run.event_seq,
            run.parent_run,
            run.parent_checkpoint,
        ]

        async def insert(cursor: Cursor) -> Any:
            await cursor.execute(self._queries["create_run"], params)
            return await cursor.fetchone()

        if await self._with_connection(insert, idempotent=False) is None:
            raise RunExistsError(f"run {run.run_id!r} exists", run.run_id)

    async def get_run(self, run_id: str) -> RunRecord | None:
        row = await self._fetchone("get_run", [run_id])
        return run_from_row(row) if row else None

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        params = {
            "pipeline": pipeline,
            "statuses": list(statuses) if statuses is not None else None,
            "limit": limit,
        }
        return [run_from_row(row) for row in await self._fetchall("list_runs", params)]

    async def claim_run(
        self, run_id: str, expected_fence: int, owner: Owner, lease_until: float, now: float
    ) -> RunRecord:
        params = [owner.host, owner.pid, owner.started, lease_until, RUNNING, now]
        params += [run_id, expected_fence]

        async def claim(cursor: Cursor) -> Any:
            await cursor.execute(self._queries["claim_run"], params, binary=True)
            return await cursor.fetchone()

        row = await self._with_connection(claim, idempotent=False)
        if row is not None:
            return run_from_row(row)
        if await self._fetchone("run_exists", [run_id]) is None:
            raise RunNotFoundError(f"no run {run_id!r}", run_id)
        raise RunLockedError(f"run {run_id!r} was claimed by another owner", run_id)

    async def commit(self, commit: Commit) -> None:
        params = commit_params(commit)
        row = await self._fetchone("commit", params)
        stored = row[0] if row else None
        if stored == commit.fence:
            return
        if stored is None:
            raise RunNotFoundError(f"no run {commit.run_id!r}", commit.run_id)
        raise StaleOwnerError(
            f"run {commit.run_id!r} is owned by a newer owner (fence {stored}, "
            f"this write carries {commit.fence})",
            commit.run_id,
        )

    # -- reads --------------------------------------------------------------------------

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        params = {"run_id": run_id, "after": after, "upto": upto}
        rows = await self._fetchall("load_steps", params)
        return [StepRecord(run_id, seq, agent, bytes(body)) for seq, agent, body in rows]

    async def load_history(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        return await self.load_steps(run_id, after, upto)  # this store keeps no blocks

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        return [checkpoint_from_row(r) for r in await self._fetchall("list_checkpoints", [run_id])]

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        row = await self._fetchone("get_checkpoint", [checkpoint_id])
        return checkpoint_from_row(row) if row else None

    async def read_events(
        self, run_id: str, since_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        rows = await self._fetchall("read_events", [run_id, since_seq, limit])
        return [EventRecord(run_id, seq, at, kind, bytes(body)) for seq, at, kind, body in rows]

    async def read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        rows = await self._fetchall("read_journal", [run_id, step])
        return [JournalRecord(run_id, s, position, bytes(body)) for s, position, body in rows]

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
