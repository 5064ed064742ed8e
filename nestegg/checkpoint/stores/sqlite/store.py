"""The embedded default store: one SQLite file, stdlib ``sqlite3`` in WAL mode.

One connection per store (and one for WAL checkpoints);
:mod:`~nestegg.checkpoint.stores.sqlite.connection` decides which thread uses it: a
step's commit runs on the loop thread when SQLite's write lock is free at once,
everything that may wait on the store's worker thread (WAL checkpoints on their own), so
the event loop never waits on a lock or the disk. A group commit's batch of many runs
runs on the worker too, while the loop goes on with the other runs
(:mod:`~nestegg.checkpoint.stores.sqlite.group_writes`). Writes are ``BEGIN IMMEDIATE``
transactions, which makes many runs in one process and several processes on one file
safe. ``synchronous=NORMAL`` keeps a committed step across a process crash (the WAL is
synced at WAL checkpoints).

The schema and its migrations are in :mod:`nestegg.checkpoint.stores.sqlite.schema`;
the reads (runs listed, a run's steps, checkpoints, events, journal and signals) in
:mod:`~nestegg.checkpoint.stores.sqlite.reads`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from nestegg.checkpoint.records import Commit, Owner, RunRecord
from nestegg.checkpoint.stores.common import (
    check_size,
    claim_refusal,
    run_claimed,
    run_exists,
    run_not_found,
    store_path,
)
from nestegg.checkpoint.stores.group import (
    GroupCalls,
    GroupCommitter,
    Outcome,
    outcome_of,
    run_id_of,
    runs_read,
)
from nestegg.checkpoint.stores.sqlite.commits import commit_alone, commit_batch, write_size
from nestegg.checkpoint.stores.sqlite.connection import SQLiteConnection, use_wal
from nestegg.checkpoint.stores.sqlite.errors import is_busy, storage_error
from nestegg.checkpoint.stores.sqlite.group_writes import create_together
from nestegg.checkpoint.stores.sqlite.read_only import open_read_only
from nestegg.checkpoint.stores.sqlite.reads import SQLiteReads, run_filter
from nestegg.checkpoint.stores.sqlite.schema import (
    CHECKPOINTS,
    CLAIM_RUN,
    CLAIM_STATE,
    INSERT_RUN,
    RUNS,
    SELECT_RUN,
    delete_runs,
    ids_per_query,
    marks,
    migrate,
    owner_text,
    run_from_row,
    run_to_row,
    write_transaction,
)
from nestegg.checkpoint.stores.sqlite.threads import SQLiteThreadRows
from nestegg.checkpoint.stores.step_gate import pending_limit
from nestegg.constants import (
    MAX_PENDING_COMMITS,
    RUNNING,
    SQLITE_BUSY_TIMEOUT_MS,
    SQLITE_INLINE_BATCH_BYTES,
    SQLITE_INLINE_BATCH_COMMITS,
    SQLITE_JOURNAL_SIZE_LIMIT,
    SQLITE_WAL_AUTOCHECKPOINT_PAGES,
)
from nestegg.errors import ConfigurationError, StorageError, StorageUnavailableError
from nestegg.urls import query_problem, slashes_problem, without_password

MEMORY_PATH = ":memory:"
_NO_PATH = (
    "it names no file: sqlite:///path/to/file.db (relative to the current directory), "
    "sqlite:////path/to/file.db (absolute), or sqlite:// for a store in memory"
)
RUN_KEYS_KEPT = 10_000
"""Run keys a store remembers between commits (forgotten all at once beyond this)."""


def _make_private_dirs(directory: Path) -> None:
    missing: list[Path] = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir(mode=0o700, exist_ok=True)


def _create_database_file(path: Path) -> None:
    """Create the directory (0700) and an empty database file (0600) if missing."""
    _make_private_dirs(path.parent)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)


class SQLiteCheckpointStorage(SQLiteReads, SQLiteThreadRows):
    """Keeps runs in one SQLite database file; the default store.

    Args:
        path: the database file; it and its directory are created on first use (the
            directory 0700, the files 0600). ``":memory:"`` keeps everything in memory.
        read_only: open an existing file for reading only (``mode=ro``; ``immutable`` in a
            read-only directory), never creating or converting it: a database on a
            read-only mount can be inspected. Writes then fail with StorageUnavailableError;
            a file of a schema older than a reader reads is refused with a StorageError,
            never upgraded.

        max_pending_commits: the commits waiting to be written or being written, at most,
            before the runs using this store wait to start their next steps (None, the
            default: no limit). With a limit such as 64, a commit is written in
            milliseconds with a thousand runs whose steps never wait, at the cost of some of
            their aggregate steps a second (README, "Steps held back").
    Raises:
        StorageUnavailableError: the file cannot be created or opened (on first use).
        StorageError: the database stayed locked beyond the busy timeout, or failed.

    Example:
        >>> store = SQLiteCheckpointStorage(Path("~/.nestegg/nestegg.db").expanduser())
        >>> clutch = Clutch("p", checkpoint=CheckpointConfig(storage=store))
    """

    def __init__(
        self,
        path: str | Path,
        *,
        read_only: bool = False,
        max_pending_commits: int | None = MAX_PENDING_COMMITS,
    ) -> None:
        memory = str(path) == MEMORY_PATH
        self.path = path if memory else store_path(path, "SQLiteCheckpointStorage", "file")
        self._name = str(self.path)
        self.read_only = read_only and isinstance(self.path, Path)
        self._run_keys: dict[str, int] = {}  # run_id -> run_key, checked by every commit
        self._group = GroupCommitter(
            self._commit_one,
            self._commit_many,
            max_pending=pending_limit(max_pending_commits, "SQLiteCheckpointStorage"),
        )
        self._get_runs = GroupCalls(self._get_one, self._get_many, str)
        self._create_runs = GroupCalls(self._create_one, self._create_many, run_id_of)
        self._connection = SQLiteConnection(
            self._open,
            self._storage_error,
            busy_timeout_ms=SQLITE_BUSY_TIMEOUT_MS,
            wal_opener=(
                self._open_for_wal_checkpoints
                if isinstance(self.path, Path) and not self.read_only
                else None
            ),
        )

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        read_only: bool = False,
        max_pending_commits: int | None = MAX_PENDING_COMMITS,
    ) -> SQLiteCheckpointStorage:
        """A store for ``sqlite:///relative.db``, ``sqlite:////absolute.db`` or ``sqlite://``
        (in memory); ``read_only`` and ``max_pending_commits`` as in the constructor.

        Raises:
            ConfigurationError: the URL's scheme is not ``sqlite``, no ``//`` follows it
                (``sqlite:x.db``), a ``/`` follows it with no path (``sqlite:///``, which
                would keep nothing), or it has a query (:func:`open_store` takes
                ``?max_pending_commits=`` out first; there is no other option there).
        """
        parts = urlsplit(url)
        if parts.scheme != "sqlite" or parts.netloc not in ("", "localhost"):
            raise ConfigurationError(
                f"not a SQLite store URL: {url!r} (expected sqlite:///path/to/file.db)"
            )
        problem = (
            slashes_problem(url, "sqlite:///{}", "sqlite:////{}")
            or query_problem(url)
            or (_NO_PATH if parts.path == "/" else None)
        )
        if problem is not None:
            raise ConfigurationError(f"SQLite store URL {without_password(url)!r}: {problem}")
        path = unquote(parts.path)[1:]
        return cls(
            path or MEMORY_PATH, read_only=read_only, max_pending_commits=max_pending_commits
        )

    def __repr__(self) -> str:
        return f"SQLiteCheckpointStorage({self._name!r})"

    def _open(self) -> sqlite3.Connection:
        """Open and set up the connection (on the worker thread)."""
        if isinstance(self.path, Path) and self.read_only:
            return open_read_only(self.path)
        if isinstance(self.path, Path):
            _create_database_file(self.path)
        conn = sqlite3.connect(
            self._name,
            timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
            isolation_level=None,
            cached_statements=64,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            use_wal(conn, SQLITE_BUSY_TIMEOUT_MS / 1000)
            conn.execute("PRAGMA synchronous = NORMAL")
            # SQLiteConnection takes the WAL checkpoints; SQLite's own stay as a backstop.
            conn.execute(f"PRAGMA wal_autocheckpoint = {SQLITE_WAL_AUTOCHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit = {SQLITE_JOURNAL_SIZE_LIMIT}")
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    # -- the contract --------------------------------------------------------------------

    def _open_for_wal_checkpoints(self) -> sqlite3.Connection:
        """A plain connection to the file, for WAL checkpoints (on their own thread)."""
        conn = sqlite3.connect(self._name, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        return conn

    def _storage_error(self, exc: sqlite3.Error | OSError) -> StorageError:
        return storage_error(exc, self._name)

    async def setup(self) -> None:
        """Create the file, its directory and the schema (idempotent; also done lazily)."""
        await self._connection.call(lambda conn: None)

    async def close(self) -> None:
        """Close the connections and stop the threads; a later call reopens them."""
        for group in (self._create_runs, self._get_runs, self._group):
            await group.drain()  # the commits last: a run created or read goes on to one
        await self._connection.close()

    async def create_run(self, run: RunRecord) -> None:
        if not await self._create_runs.call(run):
            raise run_exists(run.run_id)

    async def _create_one(self, run: RunRecord) -> bool:
        row = run_to_row(run)
        return await self._connection.write(_create_run, row, size=len(run.input), small=False)

    async def _create_many(self, runs: Sequence[RunRecord]) -> list[bool | BaseException]:
        """Many runs created in one transaction (thousands of runs starting at once would
        otherwise queue one by one on the worker thread, and their first commits behind
        them); if that fails for another reason than the store (unreachable, or locked
        beyond the busy timeout), each run is created alone, so that a bad one fails
        alone."""
        rows = [run_to_row(run) for run in runs]
        size = sum(len(run.input) for run in runs)
        try:
            created = await self._connection.write(create_together, rows, size=size, small=False)
        except Exception as error:
            if _store_failed(error):
                raise
            return [await outcome_of(self._create_one, run) for run in runs]
        return [*created]

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._get_runs.call(run_id)

    async def _get_one(self, run_id: str) -> RunRecord | None:
        return await self._connection.call(_get_run, run_id)

    async def _get_many(self, run_ids: Sequence[str]) -> list[RunRecord | BaseException | None]:
        """Many runs read in one query; if that fails for another reason than the store,
        each alone, so that a bad id fails alone."""
        try:
            return [*await self._connection.call(_get_runs, list(run_ids))]
        except Exception as error:
            if _store_failed(error):
                raise
            return [await outcome_of(self._get_one, run_id) for run_id in run_ids]

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
        params = (owner_text(owner), lease_until, RUNNING, now, run_id, expected_fence, reopen)
        return await self._connection.write(_claim_run, params, small=False)

    def step_admission(self) -> Awaitable[None] | None:
        """None when a run may start its next step now; else what it awaits first."""
        return self._group.step_admission()

    async def commit(self, commit: Commit) -> None:
        check_size(commit)
        await self._group.commit(commit)

    async def _commit_one(self, commit: Commit) -> None:
        size, small = write_size(commit)
        if len(self._run_keys) > RUN_KEYS_KEPT:
            self._run_keys.clear()
        await self._connection.write(commit_alone, commit, self._run_keys, size=size, small=small)

    async def _commit_many(self, commits: Sequence[Commit]) -> Sequence[Outcome]:
        """Many runs' commits in one transaction (group commit): on the loop thread when
        the write lock is free and the batch small enough, as a commit alone, else on the
        worker thread, while the loop goes on with the other runs."""
        if len(self._run_keys) > RUN_KEYS_KEPT:
            self._run_keys.clear()
        size, small = 0, len(commits) <= SQLITE_INLINE_BATCH_COMMITS
        for commit in commits:
            one_size, one_small = write_size(commit)
            size += one_size
            small = small and one_small
        small = small and size <= SQLITE_INLINE_BATCH_BYTES
        return await self._connection.write(
            commit_batch, commits, self._run_keys, self._name, size=size, small=small
        )

    async def delete_run(self, run_id: str) -> bool:
        return await self._connection.write(_delete_run, run_id, small=False)

    async def delete_checkpoints(self, run_id: str, checkpoint_ids: Sequence[str]) -> int:
        if not checkpoint_ids:
            return 0
        return await self._connection.write(
            _delete_checkpoints, run_id, list(checkpoint_ids), small=False
        )

    async def expire_runs(
        self, statuses: Sequence[str], updated_before: float, pipeline: str | None = None
    ) -> list[str]:
        where, params = run_filter(pipeline, statuses)
        params.append(updated_before)
        query = f"SELECT run_id FROM {RUNS}{where} AND updated_at < ?"
        return await self._connection.write(_expire_runs, query, params, small=False)


# -- work done on the worker thread (or on the loop thread, for a write that can) ------------


def _create_run(conn: sqlite3.Connection, row: tuple[Any, ...]) -> bool:
    with write_transaction(conn):
        return conn.execute(INSERT_RUN, row).rowcount == 1


def _get_run(conn: sqlite3.Connection, run_id: str) -> RunRecord | None:
    row = conn.execute(f"{SELECT_RUN} WHERE run_id = ?", (run_id,)).fetchone()
    return run_from_row(row) if row else None


def _get_runs(conn: sqlite3.Connection, run_ids: list[str]) -> list[RunRecord | None]:
    """The runs of ``run_ids`` (None for each not stored), in their order."""
    found: dict[str, RunRecord] = {}
    most = ids_per_query(conn)
    for start in range(0, len(run_ids), most):
        chunk = run_ids[start : start + most]
        query = f"{SELECT_RUN} WHERE run_id IN ({marks(len(chunk))})"
        found.update((run.run_id, run) for run in map(run_from_row, conn.execute(query, chunk)))
    return runs_read(found, run_ids)


def _store_failed(error: Exception) -> bool:
    """Whether ``error`` is the store's and not one call's: unreachable, or locked beyond
    the busy timeout (calling again one by one would wait for it again)."""
    cause = error.__cause__
    locked = isinstance(cause, sqlite3.Error) and is_busy(cause)
    return isinstance(error, StorageUnavailableError) or locked


def _claim_run(conn: sqlite3.Connection, params: tuple[Any, ...]) -> RunRecord:
    run_id, expected_fence, reopen = params[4:]
    with write_transaction(conn):
        if conn.execute(CLAIM_RUN, params).rowcount == 0:
            stored = conn.execute(CLAIM_STATE, (run_id,)).fetchone()
            if stored is None:
                raise run_not_found(run_id)
            refusal = claim_refusal(run_id, stored[0], stored[1], expected_fence, reopen)
            raise refusal or run_claimed(run_id)
        row = conn.execute(f"{SELECT_RUN} WHERE run_id = ?", (run_id,)).fetchone()
    return run_from_row(row)


def _delete_run(conn: sqlite3.Connection, run_id: str) -> bool:
    with write_transaction(conn):
        return delete_runs(conn, [run_id]) > 0


def _delete_checkpoints(conn: sqlite3.Connection, run_id: str, checkpoint_ids: list[str]) -> int:
    query = (
        f"DELETE FROM {CHECKPOINTS} WHERE run_id = ? "
        f"AND checkpoint_id IN ({marks(len(checkpoint_ids))})"
    )
    with write_transaction(conn):
        return conn.execute(query, [run_id, *checkpoint_ids]).rowcount


def _expire_runs(conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> list[str]:
    with write_transaction(conn):
        run_ids = [row[0] for row in conn.execute(query, params).fetchall()]
        if run_ids:
            delete_runs(conn, run_ids)
    return run_ids


__all__ = ["SQLiteCheckpointStorage"]
