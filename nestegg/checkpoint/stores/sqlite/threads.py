"""LangGraph thread rows of the SQLite store: two tables of their own (schema version 4).

``lg_threads`` holds one row per thread (its last write), ``lg_rows`` the rows, keyed by
(thread, kind, key); SQLite compares TEXT byte by byte, which is the key order the
:class:`~nestegg.checkpoint.stores.threads.ThreadStore` contract asks for.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from nestegg.checkpoint.stores.sqlite.connection import SQLiteConnection
from nestegg.checkpoint.stores.sqlite.schema import BODY, marks, write_transaction
from nestegg.checkpoint.stores.threads import ThreadChange, ThreadInfo, ThreadRow
from nestegg.constants import SQLITE_THREAD_ROWS_TABLE as ROWS
from nestegg.constants import SQLITE_THREADS_TABLE as THREADS

_TOUCH = f"INSERT OR REPLACE INTO {THREADS} (thread_id, updated_at) VALUES (?, ?)"
_FORGET_EMPTY = (
    f"DELETE FROM {THREADS} WHERE thread_id = ? "
    f"AND NOT EXISTS (SELECT 1 FROM {ROWS} WHERE thread_id = ?)"
)
_DELETE_RANGE = f"DELETE FROM {ROWS} WHERE thread_id = ? AND kind = ? AND key >= ? AND key < ?"
_PUT = f"INSERT OR REPLACE INTO {ROWS} (thread_id, kind, key, body) VALUES (?, ?, ?, ?)"
_PUT_NEW = f"INSERT OR IGNORE INTO {ROWS} (thread_id, kind, key, body) VALUES (?, ?, ?, ?)"
_SCAN = (
    f"SELECT kind, key, {BODY} FROM {ROWS} "
    "WHERE thread_id = ? AND kind = ? AND key >= ? AND key < ?"
)
_LIST = (
    f"SELECT t.thread_id, t.updated_at, count(r.key) FROM {THREADS} t "
    f"JOIN {ROWS} r ON r.thread_id = t.thread_id "
    "GROUP BY t.thread_id ORDER BY t.updated_at DESC, t.thread_id"
)
_COPY = (
    f"INSERT OR REPLACE INTO {ROWS} (thread_id, kind, key, body) "
    f"SELECT ?, kind, key, body FROM {ROWS} WHERE thread_id = ?"
)


def _apply(conn: sqlite3.Connection, thread_id: str, change: ThreadChange, now: float) -> None:
    with write_transaction(conn):
        conn.executemany(_DELETE_RANGE, [(thread_id, *d) for d in change.delete])
        conn.executemany(_PUT_NEW, [(thread_id, r.kind, r.key, r.body) for r in change.put_new])
        conn.executemany(_PUT, [(thread_id, r.kind, r.key, r.body) for r in change.put])
        if change.writes:  # a change that only deletes is no write of the thread
            conn.execute(_TOUCH, (thread_id, now))
        else:  # and may empty it: then its entry goes too
            conn.execute(_FORGET_EMPTY, (thread_id, thread_id))


def _fetch(conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(query, params).fetchall()


def _delete(conn: sqlite3.Connection, thread_ids: list[str]) -> int:
    with write_transaction(conn):
        conn.execute(
            f"DELETE FROM {ROWS} WHERE thread_id IN ({marks(len(thread_ids))})", thread_ids
        )
        query = f"DELETE FROM {THREADS} WHERE thread_id IN ({marks(len(thread_ids))})"
        return conn.execute(query, thread_ids).rowcount


def _copy(conn: sqlite3.Connection, source: str, target: str, now: float) -> bool:
    with write_transaction(conn):
        copied = conn.execute(_COPY, (target, source)).rowcount
        if copied:
            conn.execute(_TOUCH, (target, now))
        return copied > 0


class SQLiteThreadRows:
    """The :class:`~nestegg.checkpoint.stores.threads.ThreadStore` capability in SQLite."""

    _connection: SQLiteConnection

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        """See ThreadStore."""
        size = sum(len(r.body) for r in (*change.put, *change.put_new))
        await self._connection.write(
            _apply, thread_id, change, now, size=size, small=size < 64 * 1024
        )

    async def get_thread_rows(
        self, thread_id: str, kind: str, keys: Sequence[str]
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        if not keys:
            return []
        query = (
            f"SELECT kind, key, {BODY} FROM {ROWS} WHERE thread_id = ? AND kind = ? "
            f"AND key IN ({marks(len(keys))}) ORDER BY key"
        )
        rows = await self._connection.call(_fetch, query, [thread_id, kind, *keys])
        return [ThreadRow(k, key, bytes(body)) for k, key, body in rows]

    async def scan_thread_rows(
        self,
        thread_id: str,
        kind: str,
        low: str,
        high: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        query = f"{_SCAN} ORDER BY key {'DESC' if newest_first else 'ASC'} LIMIT ?"
        params = (thread_id, kind, low, high, -1 if limit is None else limit)
        rows = await self._connection.call(_fetch, query, params)
        return [ThreadRow(k, key, bytes(body)) for k, key, body in rows]

    async def list_threads(self) -> list[ThreadInfo]:
        """See ThreadStore."""
        rows = await self._connection.call(_fetch, _LIST, ())
        return [ThreadInfo(tid, at, count) for tid, at, count in rows]

    async def delete_threads(self, thread_ids: Sequence[str]) -> int:
        """See ThreadStore."""
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return 0
        return await self._connection.write(_delete, ids, small=False)

    async def copy_thread(self, source_id: str, target_id: str, now: float) -> bool:
        """See ThreadStore."""
        return await self._connection.write(_copy, source_id, target_id, now, small=False)
