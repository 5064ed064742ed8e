"""LangGraph thread rows of the memory store: dictionaries in the process."""

from __future__ import annotations

from collections.abc import Sequence

from nestegg.checkpoint.stores.threads import ThreadChange, ThreadInfo, ThreadRow

Rows = dict[tuple[str, str], bytes]
"""A thread's rows by (kind, key): the memory store's, and the file store's once read."""


def apply_change(rows: Rows, change: ThreadChange) -> None:
    """Apply ``change`` to ``rows`` (deletes, then new rows, then replacing ones)."""
    for kind, low, high in change.delete:
        for row in scan_rows(rows, kind, low, high):
            del rows[(kind, row.key)]
    for row in change.put_new:
        rows.setdefault((row.kind, row.key), bytes(row.body))
    for row in change.put:
        rows[(row.kind, row.key)] = bytes(row.body)


def rows_with_keys(rows: Rows, kind: str, keys: Sequence[str]) -> list[ThreadRow]:
    """The rows of ``kind`` with those keys, in key order."""
    found = sorted({key for key in keys if (kind, key) in rows})
    return [ThreadRow(kind, key, rows[(kind, key)]) for key in found]


def scan_rows(
    rows: Rows,
    kind: str,
    low: str,
    high: str,
    newest_first: bool = False,
    limit: int | None = None,
) -> list[ThreadRow]:
    """The rows of ``kind`` with ``low <= key < high``, in key order (or reversed)."""
    keys = sorted((key for k, key in rows if k == kind and low <= key < high), reverse=newest_first)
    keys = keys if limit is None else keys[:limit]
    return [ThreadRow(kind, key, rows[(kind, key)]) for key in keys]


class MemoryThreadRows:
    """The :class:`~nestegg.checkpoint.stores.threads.ThreadStore` capability in memory."""

    __thread_rows: dict[str, Rows]
    __thread_times: dict[str, float]

    def _threads(self) -> dict[str, Rows]:
        try:
            return self.__thread_rows
        except AttributeError:
            self.__thread_rows, self.__thread_times = {}, {}
            return self.__thread_rows

    def _drop_thread(self, thread_id: str) -> bool:
        """Forget the thread, its rows and its time; whether it had rows."""
        had_rows = bool(self._threads().pop(thread_id, None))
        self.__thread_times.pop(thread_id, None)
        return had_rows

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        """See ThreadStore."""
        rows = self._threads().setdefault(thread_id, {})
        apply_change(rows, change)
        if not rows:  # emptied by its deletes (or never filled): no entry left behind
            self._drop_thread(thread_id)
        elif change.writes:
            self.__thread_times[thread_id] = now

    async def get_thread_rows(
        self, thread_id: str, kind: str, keys: Sequence[str]
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        return rows_with_keys(self._threads().get(thread_id, {}), kind, keys)

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
        rows = self._threads().get(thread_id, {})
        return scan_rows(rows, kind, low, high, newest_first, limit)

    async def list_threads(self) -> list[ThreadInfo]:
        """See ThreadStore."""
        infos = [
            ThreadInfo(tid, self.__thread_times[tid], len(rows))
            for tid, rows in self._threads().items()
            if rows
        ]
        return sorted(infos, key=lambda info: (-info.updated_at, info.thread_id))

    async def delete_threads(self, thread_ids: Sequence[str]) -> int:
        """See ThreadStore."""
        return sum(self._drop_thread(tid) for tid in dict.fromkeys(thread_ids))

    async def copy_thread(self, source_id: str, target_id: str, now: float) -> bool:
        """See ThreadStore."""
        threads = self._threads()
        source = threads.get(source_id)
        if not source:
            return False
        threads.setdefault(target_id, {}).update(source)
        self.__thread_times[target_id] = now
        return True


__all__ = ["MemoryThreadRows"]
