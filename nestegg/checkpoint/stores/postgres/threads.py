"""LangGraph thread rows of the PostgreSQL store: two tables of its own (schema version 4).

``{prefix}lg_threads`` holds one row per thread (its last write), ``{prefix}lg_rows`` the
rows keyed by (thread, kind, key); the columns use the "C" collation, so keys compare
byte by byte as the :class:`~nestegg.checkpoint.stores.threads.ThreadStore` contract asks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from nestegg.checkpoint.stores.threads import ThreadChange, ThreadInfo, ThreadRow

T = TypeVar("T")

_QUERIES = {
    # A change without deletes in one statement (one round trip, one commit): the rows
    # to keep if present and the rows to replace (their keys apart), then the thread's
    # time (rewritten only when it moved by a second or more: a row update less per step).
    # The arrays go in binary (%b): no hex encoding and escaping of the bodies.
    "put_rows": "WITH n AS (INSERT INTO {lg_rows} (thread_id, kind, key, body) "
    "SELECT %(thread)s, k, key, body FROM unnest(%(nk)b::text[], %(nkey)b::text[], "
    "%(nbody)b::bytea[]) AS x(k, key, body) ON CONFLICT (thread_id, kind, key) DO NOTHING), "
    "p AS (INSERT INTO {lg_rows} (thread_id, kind, key, body) "
    "SELECT %(thread)s, k, key, body FROM unnest(%(pk)b::text[], %(pkey)b::text[], "
    "%(pbody)b::bytea[]) AS x(k, key, body) "
    "ON CONFLICT (thread_id, kind, key) DO UPDATE SET body = EXCLUDED.body) "
    "INSERT INTO {lg_threads} (thread_id, updated_at) VALUES (%(thread)s, %(now)s) "
    "ON CONFLICT (thread_id) DO UPDATE SET updated_at = EXCLUDED.updated_at "
    "WHERE {lg_threads}.updated_at < EXCLUDED.updated_at - 1",
    "touch": "INSERT INTO {lg_threads} (thread_id, updated_at) VALUES (%s, %s) "
    "ON CONFLICT (thread_id) DO UPDATE SET updated_at = EXCLUDED.updated_at",
    # A change that only deletes takes the thread's entry if it leaves no row: the entry
    # locked first (a write under way keeps it, or puts it back once this one commits),
    # then looked at with a snapshot that sees every write committed before.
    "lock_thread": "SELECT 1 FROM {lg_threads} WHERE thread_id = %s FOR UPDATE",
    "forget_empty": "DELETE FROM {lg_threads} WHERE thread_id = %s "
    "AND NOT EXISTS (SELECT 1 FROM {lg_rows} WHERE thread_id = %s)",
    "delete_range": "DELETE FROM {lg_rows} WHERE thread_id = %s AND kind = %s "
    "AND key >= %s AND key < %s",
    "put": "INSERT INTO {lg_rows} (thread_id, kind, key, body) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (thread_id, kind, key) DO UPDATE SET body = EXCLUDED.body",
    "put_new": "INSERT INTO {lg_rows} (thread_id, kind, key, body) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (thread_id, kind, key) DO NOTHING",
    "get": "SELECT kind, key, body FROM {lg_rows} WHERE thread_id = %s AND kind = %s "
    "AND key = ANY(%s::text[]) ORDER BY key",
    "scan": "SELECT kind, key, body FROM {lg_rows} WHERE thread_id = %s AND kind = %s "
    "AND key >= %s AND key < %s ORDER BY key LIMIT %s",
    "scan_desc": "SELECT kind, key, body FROM {lg_rows} WHERE thread_id = %s AND kind = %s "
    "AND key >= %s AND key < %s ORDER BY key DESC LIMIT %s",
    "list": "SELECT t.thread_id, t.updated_at, count(*) FROM {lg_threads} t "
    "JOIN {lg_rows} r ON r.thread_id = t.thread_id "
    "GROUP BY t.thread_id, t.updated_at ORDER BY t.updated_at DESC, t.thread_id",
    "delete_rows": "DELETE FROM {lg_rows} WHERE thread_id = ANY(%s::text[])",
    "delete_threads": "DELETE FROM {lg_threads} WHERE thread_id = ANY(%s::text[])",
    "copy": "INSERT INTO {lg_rows} (thread_id, kind, key, body) "
    "SELECT %s, kind, key, body FROM {lg_rows} WHERE thread_id = %s "
    "ON CONFLICT (thread_id, kind, key) DO UPDATE SET body = EXCLUDED.body",
}


def _overlap(change: ThreadChange) -> bool:
    """True if a row of ``put`` has the key of a row of ``put_new``: the two inserts of
    one statement run in an order PostgreSQL leaves open, so such a change takes a
    transaction of its own (``put_new`` first, then ``put``, as ThreadChange says)."""
    if not change.put or not change.put_new:
        return False
    new = {(r.kind, r.key) for r in change.put_new}
    return any((r.kind, r.key) in new for r in change.put)


class PostgresThreadRows:
    """The :class:`~nestegg.checkpoint.stores.threads.ThreadStore` capability in PostgreSQL."""

    table_prefix: str
    _with_connection: Callable[..., Awaitable[Any]]
    __rendered: dict[str, bytes]

    def _thread_query(self, name: str, conn: Any) -> bytes:
        """The statement ``name`` with this store's table names (rendered once)."""
        try:
            rendered = self.__rendered
        except AttributeError:
            rendered = self.__rendered = {}
        if name not in rendered:
            from psycopg import sql  # the driver, imported where the store is used

            names = {
                "lg_threads": sql.Identifier(self.table_prefix + "lg_threads"),
                "lg_rows": sql.Identifier(self.table_prefix + "lg_rows"),
            }
            rendered[name] = sql.SQL(_QUERIES[name]).format(**names).as_bytes(conn)
        return rendered[name]

    async def _thread_fetch(self, name: str, params: Sequence[Any]) -> list[Any]:
        async def fetch(cursor: Any) -> list[Any]:
            query = self._thread_query(name, cursor.connection)
            await cursor.execute(query, params, binary=True)
            rows: list[Any] = await cursor.fetchall()
            return rows

        result: list[Any] = await self._with_connection(fetch, idempotent=True)
        return result

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        """See ThreadStore."""
        if change.writes and not change.delete and not _overlap(change):
            await self._put_thread_rows(thread_id, change, now)
            return

        async def apply(cursor: Any) -> None:
            def q(name: str) -> bytes:
                return self._thread_query(name, cursor.connection)

            async with cursor.connection.transaction():
                if change.delete:
                    await cursor.executemany(
                        q("delete_range"), [(thread_id, *d) for d in change.delete]
                    )
                for name, rows in (("put_new", change.put_new), ("put", change.put)):
                    if rows:
                        await cursor.executemany(
                            q(name), [(thread_id, r.kind, r.key, r.body) for r in rows]
                        )
                if change.writes:  # a change that only deletes is no write of the thread
                    await cursor.execute(q("touch"), (thread_id, now))
                else:  # and may empty it: then its entry goes too
                    await cursor.execute(q("lock_thread"), (thread_id,))
                    await cursor.execute(q("forget_empty"), (thread_id, thread_id))

        await self._with_connection(apply, idempotent=True)

    async def _put_thread_rows(self, thread_id: str, change: ThreadChange, now: float) -> None:
        params: dict[str, Any] = {"thread": thread_id, "now": now}
        for tag, rows in (("n", change.put_new), ("p", change.put)):
            params[f"{tag}k"] = [r.kind for r in rows]
            params[f"{tag}key"] = [r.key for r in rows]
            params[f"{tag}body"] = [r.body for r in rows]

        async def put(cursor: Any) -> None:
            query = self._thread_query("put_rows", cursor.connection)
            await cursor.execute(query, params, binary=True)

        await self._with_connection(put, idempotent=True)

    async def get_thread_rows(
        self, thread_id: str, kind: str, keys: Sequence[str]
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        if not keys:
            return []
        rows = await self._thread_fetch("get", (thread_id, kind, list(keys)))
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
        name = "scan_desc" if newest_first else "scan"
        rows = await self._thread_fetch(name, (thread_id, kind, low, high, limit))
        return [ThreadRow(k, key, bytes(body)) for k, key, body in rows]

    async def list_threads(self) -> list[ThreadInfo]:
        """See ThreadStore."""
        rows = await self._thread_fetch("list", ())
        return [ThreadInfo(tid, float(at), int(count)) for tid, at, count in rows]

    async def delete_threads(self, thread_ids: Sequence[str]) -> int:
        """See ThreadStore."""
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return 0

        async def delete(cursor: Any) -> int:
            async with cursor.connection.transaction():
                conn = cursor.connection
                await cursor.execute(self._thread_query("delete_rows", conn), (ids,))
                await cursor.execute(self._thread_query("delete_threads", conn), (ids,))
                return int(cursor.rowcount)

        count: int = await self._with_connection(delete, idempotent=True)
        return count

    async def copy_thread(self, source_id: str, target_id: str, now: float) -> bool:
        """See ThreadStore."""

        async def copy(cursor: Any) -> bool:
            async with cursor.connection.transaction():
                conn = cursor.connection
                await cursor.execute(self._thread_query("copy", conn), (target_id, source_id))
                copied = int(cursor.rowcount) > 0
                if copied:
                    await cursor.execute(self._thread_query("touch", conn), (target_id, now))
                return copied

        result: bool = await self._with_connection(copy, idempotent=True)
        return result
