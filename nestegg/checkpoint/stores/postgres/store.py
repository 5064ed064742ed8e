"""PostgreSQL store: psycopg 3 (async) with a psycopg_pool connection pool.

Tables are named ``<table_prefix>runs``, ``…steps``, ``…events``, ``…journal``, ``…signals`` and
``…checkpoints`` in the connection's current schema; they are created on first use from
the ordered migrations in :mod:`~nestegg.checkpoint.stores.postgres.schema` under an
advisory lock, so several processes may set up one database at once. A commit is one
call of a PL/pgSQL function: one round trip, one transaction, fenced by the run row; the
commits of many runs that arrive together are one call of another, which applies them
set by set (group commit), each still fenced by its own run row.
Every operation takes a connection from the pool (``pool.connection()``) and gives it
back.

psycopg and psycopg_pool are imported only in this package.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import hashlib
import math
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.common import (
    change_set,
    claim_refusal,
    commit_outcome,
    run_claimed,
    run_exists,
    run_not_found,
)
from nestegg.checkpoint.stores.group import GroupCalls, GroupCommitter, Outcome, outcome_of
from nestegg.checkpoint.stores.postgres.errors import driver_errors, is_final
from nestegg.checkpoint.stores.postgres.migrations import MIGRATIONS, migration_names
from nestegg.checkpoint.stores.postgres.schema import (
    DROP_STATEMENTS,
    OBJECT_SUFFIXES,
    QUERIES,
    TABLE_SUFFIXES,
    checkpoint_from_row,
    commit_params,
    run_from_row,
    validate_table_prefix,
)
from nestegg.checkpoint.stores.postgres.threads import PostgresThreadRows
from nestegg.checkpoint.stores.retry import backoff_delay, retry_unavailable
from nestegg.constants import (
    DEFAULT_TABLE_PREFIX,
    PG_POOL_MAX_SIZE,
    PG_POOL_MIN_SIZE,
    PG_PREPARE_THRESHOLD,
    RUNNING,
    SERVER_BATCHES_IN_FLIGHT,
    STORE_CONNECT_TIMEOUT,
    STORE_RETRIES,
)
from nestegg.errors import (
    ConfigurationError,
    StorageError,
    StorageUnavailableError,
)

T = TypeVar("T")
Connection = Any  # psycopg.AsyncConnection[Any]
Cursor = Any  # psycopg.AsyncCursor[Any]


@contextmanager
def _answer_by(conn: Connection, deadline: float) -> Iterator[None]:
    """Cut ``conn`` off (shut its socket down, so that the query waiting on it fails at once
    with psycopg's OperationalError) if the server has not answered by ``deadline``
    (``time.monotonic()``); a stopped or unreachable server would keep it waiting forever."""

    def cut() -> None:
        try:
            with socket.socket(fileno=socket.dup(conn.pgconn.socket)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except (OSError, psycopg.Error):  # already closed: the query has failed already
            pass

    loop = asyncio.get_running_loop()
    handle = loop.call_later(max(0.0, deadline - time.monotonic()), cut)
    try:
        yield
    finally:
        handle.cancel()


def _close_at_exit(
    store_ref: weakref.ref[PostgresCheckpointStorage], loop: asyncio.AbstractEventLoop
) -> None:
    """Close the pool of a store nobody closed while its event loop can still run that:
    else the pool's tasks are destroyed pending when the interpreter exits (with
    ``asyncio.run`` they are cancelled already; with ``run_until_complete`` they are not)."""
    store = store_ref()
    if store is None or store._pool is None or loop.is_closed() or loop.is_running():
        return
    with contextlib.suppress(Exception):  # best effort at exit: nothing is left to tell
        loop.run_until_complete(store.close())


def _until(deadline: float) -> float:
    """Seconds left before ``deadline`` (a little at least, so that a pool asked at the
    deadline still hands over a connection it has idle)."""
    return max(0.01, deadline - time.monotonic())


def _describe(conninfo: str) -> str:
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "the configured server"
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def _same(run_id: str) -> str:
    return run_id


def _run_id_of(run: RunRecord) -> str:
    return run.run_id


def _claimed_id(params: list[Any]) -> str:
    """The run id of a claim's parameters."""
    return str(params[-3])


def _create_params(run: RunRecord) -> list[Any]:
    owner = run.owner
    return [
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
        connect_timeout: seconds an operation waits for a connection and the server's
            answer, retries included, before ``StorageUnavailableError`` (a query still
            unanswered then is abandoned and its connection dropped).
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
            "connect_timeout": max(1, math.ceil(connect_timeout)),
        }
        self._connect_timeout = connect_timeout
        self._retries = retries
        self._where = _describe(url) if url is not None else "the given pool"
        self._queries: dict[str, bytes] = {}
        self._migrations: list[list[bytes]] = []
        self._drop: list[bytes] = []
        self._ready = False
        self._setup_lock = asyncio.Lock()
        self._group = GroupCommitter(
            self._commit_one, self._commit_many, in_flight=SERVER_BATCHES_IN_FLIGHT
        )
        # Thousands of runs starting at once: their reads, creations and claims go out
        # together too, not one by one through the pool's few connections.
        self._get_runs = GroupCalls(self._get_one, self._get_many, _same)
        self._create_runs = GroupCalls(self._create_one, self._create_many, _run_id_of)
        self._claims = GroupCalls(self._claim_one, self._claim_many, _claimed_id)
        self._exit_hook: Callable[[], None] | None = None
        digest = hashlib.blake2b(f"nestegg-schema:{table_prefix}".encode(), digest_size=8)
        self._lock_key = int.from_bytes(digest.digest(), "big", signed=True)

    @classmethod
    def from_url(cls, url: str, **options: Any) -> PostgresCheckpointStorage:
        """A store for a ``postgresql://`` URL; ``options`` as in the constructor."""
        return cls(url, **options)

    # -- connections and schema -------------------------------------------------------------

    async def _probe(self) -> None:
        """Connect once, outside the pool, retrying until ``connect_timeout`` while the
        server cannot be reached: a pool that fails only says that it timed out, where
        psycopg's own error names the cause (refused, no such database, authentication)."""
        deadline = time.monotonic() + self._connect_timeout
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                async with asyncio.timeout(remaining):
                    conn = await psycopg.AsyncConnection.connect(
                        self._url or "", connect_timeout=max(1, math.ceil(remaining))
                    )
                await conn.close()
                return
            except TimeoutError:
                raise StorageUnavailableError(
                    f"PostgreSQL at {self._where} is unavailable: no answer within "
                    f"{self._connect_timeout:g} s"
                ) from None
            except psycopg.OperationalError as exc:
                delay = backoff_delay(attempt)
                if is_final(exc) or time.monotonic() + delay >= deadline:
                    raise StorageUnavailableError(
                        f"PostgreSQL at {self._where} is unavailable: {exc}"
                    ) from exc
            await asyncio.sleep(delay)
            attempt += 1

    async def _open_pool(self) -> None:
        if self._pool is not None:
            return
        await self._probe()
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
            with driver_errors(self._where):
                await pool.open(wait=True, timeout=self._connect_timeout)
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        loop = asyncio.get_running_loop()
        self._exit_hook = functools.partial(_close_at_exit, weakref.ref(self), loop)
        atexit.register(self._exit_hook)

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
                with driver_errors(self._where):
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
        await self._group.drain()
        if self._owns_pool and self._pool is not None:
            pool, self._pool = self._pool, None
            self._ready = False
            if self._exit_hook is not None:
                atexit.unregister(self._exit_hook)
                self._exit_hook = None
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

    async def _on_cursor(self, operation: Callable[[Cursor], Awaitable[T]], deadline: float) -> T:
        """Run ``operation`` on a cursor of a connection from the pool, waiting for the
        connection and for the server's answer until ``deadline`` at most."""
        async with self._pool.connection(timeout=_until(deadline)) as conn:
            with _answer_by(conn, deadline):
                return await operation(conn.cursor())

    async def _with_connection(
        self, operation: Callable[[Cursor], Awaitable[T]], *, idempotent: bool
    ) -> T:
        if not self._ready:
            await self.setup()

        deadline = time.monotonic() + self._connect_timeout

        async def attempt() -> T:
            with driver_errors(self._where):
                return await self._on_cursor(operation, deadline)

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

    async def _create_one(self, run: RunRecord) -> bool:
        async def insert(cursor: Cursor) -> Any:
            await cursor.execute(self._queries["create_run"], _create_params(run))
            return await cursor.fetchone()

        return await self._with_connection(insert, idempotent=False) is not None

    async def _create_many(self, runs: Sequence[RunRecord]) -> list[bool | BaseException]:
        """Many runs created in one round trip (one pipeline of inserts)."""
        params = [_create_params(run) for run in runs]
        try:
            rows = await self._many_returning("create_run", params, idempotent=False)
        except StorageUnavailableError:
            raise
        except StorageError:  # one bad run: each alone, so that it fails alone
            return [await outcome_of(self._create_one, run) for run in runs]
        return [row is not None for row in rows]

    async def _many_returning(
        self, query: str, params: list[list[Any]], *, idempotent: bool
    ) -> list[Any]:
        """``query`` run once per parameter list, in one pipeline and one transaction (an
        error undoes all of them, so that each can be tried alone); each one's first row."""

        async def run(cursor: Cursor) -> list[Any]:
            async with cursor.connection.transaction():
                await cursor.executemany(self._queries[query], params, returning=True)
            rows = [await cursor.fetchone()]
            while cursor.nextset():
                rows.append(await cursor.fetchone())
            return rows

        return await self._with_connection(run, idempotent=idempotent)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._get_runs.call(run_id)

    async def _get_one(self, run_id: str) -> RunRecord | None:
        row = await self._fetchone("get_run", [run_id])
        return run_from_row(row) if row else None

    async def _get_many(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        rows = await self._fetchall("get_runs", [list(run_ids)])
        found = {run.run_id: run for run in map(run_from_row, rows)}
        return [found.get(run_id) for run_id in run_ids]

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        params = {
            "pipeline": pipeline,
            "statuses": list(statuses) if statuses is not None else None,
            "limit": limit,
            "before_at": before[0] if before is not None else None,
            "before_id": before[1] if before is not None else None,
        }
        return [run_from_row(row) for row in await self._fetchall("list_runs", params)]

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

    async def _claim_one(self, params: list[Any]) -> RunRecord:
        async def claim(cursor: Cursor) -> Any:
            await cursor.execute(self._queries["claim_run"], params, binary=True)
            return await cursor.fetchone()

        return await self._claimed(params, await self._with_connection(claim, idempotent=False))

    async def _claim_many(self, claims: Sequence[list[Any]]) -> list[RunRecord | BaseException]:
        """Many runs claimed in one round trip (one pipeline of fenced updates)."""
        try:
            rows = await self._many_returning("claim_run", list(claims), idempotent=False)
        except StorageUnavailableError:
            raise
        except StorageError:  # one bad claim: each alone, so that it fails alone
            return [await outcome_of(self._claim_one, params) for params in claims]
        return [
            await outcome_of(functools.partial(self._claimed, params), row)
            for params, row in zip(claims, rows, strict=True)
        ]

    async def _claimed(self, params: list[Any], row: Any) -> RunRecord:
        """The run a claim's ``row`` holds; without one, why the claim failed."""
        if row is not None:
            return run_from_row(row)
        run_id = _claimed_id(params)
        stored = await self._fetchone("claim_state", [run_id])
        if stored is None:
            raise run_not_found(run_id)
        expected_fence, reopen = params[-2:]
        refusal = claim_refusal(run_id, stored[0], stored[1], expected_fence, reopen)
        raise refusal or run_claimed(run_id)

    async def commit(self, commit: Commit) -> None:
        await self._group.commit(commit)

    async def _commit_one(self, commit: Commit) -> None:
        row = await self._fetchone("commit", commit_params(change_set(commit)))
        outcome = commit_outcome(commit, row[0] if row else None)
        if outcome is not None:
            raise outcome

    async def _commit_many(self, commits: Sequence[Commit]) -> list[Outcome]:
        """Many runs' commits in one statement, one round trip (group commit), each fenced
        on its own: one call of the group's commit function, or when a run has more than
        one commit in the group, one call of the commit function per commit, in order. An
        error of the statement (not of the connection) has every commit tried alone, so
        that it fails alone."""
        columns: list[list[Any]] = [[], [], [], []]
        for commit in commits:
            for column, value in zip(columns, commit_params(change_set(commit)), strict=True):
                column.append(value)
        try:
            if len(set(columns[0])) == len(commits):
                stored = (await self._fetchone("commit_many", columns))[0]
            else:
                stored = [row[0] for row in await self._fetchall("commit_each", columns)]
        except StorageUnavailableError:
            raise
        except StorageError:
            return [await outcome_of(self._commit_one, commit) for commit in commits]
        return [commit_outcome(c, fence) for c, fence in zip(commits, stored, strict=True)]

    # -- reads --------------------------------------------------------------------------

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        params = {"run_id": run_id, "after": after, "upto": upto}
        rows = await self._fetchall("load_steps", params)
        return [StepRecord(run_id, seq, agent, bytes(body)) for seq, agent, body in rows]

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

    async def put_signal(self, signal: SignalRecord, replace: bool = False) -> bool:
        params = {
            "run_id": signal.run_id,
            "name": signal.name,
            "at": signal.at,
            "body": signal.body,
        }
        query = self._queries["replace_signal" if replace else "put_signal"]

        async def put(cursor: Cursor) -> Any:
            await cursor.execute(query, params, binary=True)
            return await cursor.fetchone()

        if await self._with_connection(put, idempotent=replace) is not None:
            return True
        if await self._fetchone("run_exists", [signal.run_id]) is None:
            raise run_not_found(signal.run_id)
        return False

    async def read_signals(self, run_id: str) -> list[SignalRecord]:
        rows = await self._fetchall("read_signals", [run_id])
        return [SignalRecord(run_id, name, at, bytes(body)) for name, at, body in rows]

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
