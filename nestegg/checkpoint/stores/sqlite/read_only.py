"""Opening an existing SQLite store for reading only, as the commands that only read do.

The file is never created, converted to WAL or given a schema: a 0-byte or foreign file is
reported as damaged, not turned into an empty store. Where the file and its directory can
be written, the connection is an ordinary one (``mode=rw``, so the file must exist) made
``query_only``: closing it tidies the WAL as any connection does. Where they cannot (a
read-only mount), SQLite opens it ``mode=ro``, and ``immutable`` too when there is no WAL
beside it, since SQLite could not create its shared-memory file there. A file of a schema
older than a reader reads as it is (:data:`READABLE_FROM`) is refused, never upgraded.
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path
from urllib.parse import quote

from nestegg.checkpoint.stores.common import newer_than_known, older_than_read
from nestegg.checkpoint.stores.sqlite.errors import storage_error
from nestegg.checkpoint.stores.sqlite.schema import READABLE_FROM, SCHEMA_VERSION
from nestegg.constants import SQLITE_BUSY_TIMEOUT_MS
from nestegg.errors import StorageError, StorageUnavailableError


def _read_only_uri(path: Path) -> str:
    """A URI that opens ``path`` without creating it: ``mode=rw`` where it can be written
    (its connection is then made ``query_only``, and closing it tidies the WAL as any
    connection does), else ``mode=ro``, ``immutable`` too where SQLite could not keep its
    shared-memory file (a read-only directory with no WAL beside the file: a read-only
    mount)."""
    uri = f"file:{quote(str(path))}"
    if os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        return f"{uri}?mode=rw"
    if not path.with_name(path.name + "-wal").exists():
        return f"{uri}?mode=ro&immutable=1"
    return f"{uri}?mode=ro"


def _check_nestegg_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of the database at ``path``; StorageError when it holds no
    nestegg schema (a 0-byte or foreign file)."""
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == 0:
        size = path.stat().st_size
        what = (
            "it is empty (0 bytes)" if size == 0 else f"it holds no nestegg schema ({size} bytes)"
        )
        raise StorageError(f"the SQLite database {path} is damaged or not a nestegg store: {what}")
    return version


def _check_read_only_schema(conn: sqlite3.Connection, path: Path) -> None:
    """StorageError unless the database opened read-only is of a schema a reader reads as
    it is: the file is not a nestegg store (empty or damaged), is older than
    :data:`READABLE_FROM` or newer than this nestegg."""
    version = _check_nestegg_version(conn, path)
    if version > SCHEMA_VERSION:
        raise newer_than_known(f"the database {path}", version, SCHEMA_VERSION)
    if version < READABLE_FROM:
        who = "as a user who may write it"
        where = f"sqlite:///{path}"
        raise older_than_read(f"the SQLite database {path}", version, READABLE_FROM, who, where)


def check_existing_store(path: Path) -> None:
    """Check, changing nothing, that the existing file at ``path`` holds a nestegg store
    (of any schema version: a command that writes upgrades an older one), so that a
    command that needs a store there does not give a 0-byte or foreign file a schema.

    Raises:
        StorageError: the file is empty or holds no nestegg schema, or the driver failed
            (it is not a database, say).
    """
    try:
        conn = sqlite3.connect(_read_only_uri(path), uri=True, check_same_thread=False)
        with closing(conn):
            conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            _check_nestegg_version(conn, path)
    except (sqlite3.Error, OSError) as error:
        raise storage_error(error, str(path)) from error


def open_read_only(path: Path) -> sqlite3.Connection:
    """A connection that reads the existing database at ``path``.

    Raises:
        StorageUnavailableError: no file there.
        StorageError: the file is empty or not a nestegg store, or of a schema older than
            :data:`READABLE_FROM` or newer than this nestegg.
        sqlite3.Error: the driver failed (the store wraps it).
    """
    if not path.is_file():
        raise StorageUnavailableError(f"no SQLite database at {path}")
    conn = sqlite3.connect(
        _read_only_uri(path),
        uri=True,
        timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        _check_read_only_schema(conn, path)
        conn.execute("PRAGMA query_only = ON")
    except BaseException:
        conn.close()
        raise
    return conn
