"""LangGraph threads in a store: an optional capability beside the run contract.

A thread is an ordered key/value space of its own, apart from nestegg's runs: rows of three
kinds (``checkpoint``, ``blob``, ``write``), each with a text key and an opaque body. A
store keeps them in records of their own (a table, a key prefix, a directory) and applies
literal changes; what the keys and bodies mean (ordering, deltas, retention) is decided by
:mod:`nestegg.langgraph` above this seam. A store that has the capability passes
``isinstance(store, ThreadStore)``.

Keys compare as strings of code points (byte order of their UTF-8), so a scan from ``low``
(inclusive) to ``high`` (exclusive) gives the rows in key order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from nestegg.errors import InvalidIdentifierError
from nestegg.identifiers import unstorable_character

CHECKPOINT = "checkpoint"
BLOB = "blob"
WRITE = "write"
ROW_KINDS = (CHECKPOINT, BLOB, WRITE)
KEY_END = "\U0010ffff"
"""Above every key a thread uses: ``prefix + KEY_END`` ends a scan of ``prefix``."""


def check_thread_id(thread_id: str, where: str) -> str:
    """``thread_id`` if every store can keep a thread of that id: a non-empty string with
    no NUL and no lone surrogate (:func:`unstorable_character`).

    Args:
        thread_id: the id as given.
        where: what gave it (a config key, an argument), named in the error.

    Returns:
        ``thread_id``.

    Raises:
        InvalidIdentifierError: an empty id, or one holding a character no store keeps.

    Example:
        >>> check_thread_id("chat-1", "thread_id")
        'chat-1'
    """
    if not thread_id:
        raise InvalidIdentifierError(
            f"{where} is empty: a LangGraph thread needs a non-empty thread id"
        )
    wrong = unstorable_character(thread_id)
    if wrong is not None:
        raise InvalidIdentifierError(
            f"{where} {thread_id!r} holds {wrong}: no store can keep that thread id"
        )
    return thread_id


@dataclass(frozen=True, slots=True)
class ThreadRow:
    """One stored row of a thread."""

    kind: str
    key: str
    body: bytes


@dataclass(frozen=True, slots=True)
class ThreadChange:
    """A change to one thread, applied at once where the store can (all of it or nothing).

    Order: ``delete`` first, then ``put_new`` (a row whose key exists is kept), then ``put``
    (a row whose key exists is replaced).
    """

    put: Sequence[ThreadRow] = ()
    put_new: Sequence[ThreadRow] = ()
    delete: Sequence[tuple[str, str, str]] = ()
    """(kind, low, high): the rows of ``kind`` with ``low <= key < high``."""

    @property
    def writes(self) -> bool:
        """Whether the change puts rows (``put`` or ``put_new``): only then is it a write of
        the thread, which moves its ``updated_at``; one that only deletes rows (a prune,
        the collection of unneeded values) is not."""
        return bool(self.put or self.put_new)


@dataclass(frozen=True, slots=True)
class ThreadInfo:
    """A thread as listed: its id, when rows were last put in it (epoch seconds), its rows."""

    thread_id: str
    updated_at: float
    rows: int = field(default=0)


@runtime_checkable
class ThreadStore(Protocol):
    """Rows of LangGraph threads, kept apart from runs.

    Missing threads read as empty; deleting or copying one that is absent does nothing.
    """

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        """Apply ``change`` to the thread; when it :attr:`~ThreadChange.writes`, set the
        thread's ``updated_at`` to ``now`` (a store may leave it alone when it is less than
        a second older). A change that only deletes leaves it: the saver's ``ttl`` and
        ``nestegg threads prune --older-than`` read it as the thread's last write, which a
        prune is not. One that leaves the thread without rows takes its entry (its time,
        its place in the listing's table) too: the listing shows no empty thread, so
        nothing that goes by it (the ``ttl``, ``threads prune``) would ever take the entry."""

    async def get_thread_rows(
        self, thread_id: str, kind: str, keys: Sequence[str]
    ) -> list[ThreadRow]:
        """The rows of ``kind`` with those keys that exist, in key order."""

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
        """Rows of ``kind`` with ``low <= key < high``, in key order (or reversed)."""

    async def list_threads(self) -> list[ThreadInfo]:
        """Every thread with rows, most recently written first."""

    async def delete_threads(self, thread_ids: Sequence[str]) -> int:
        """Delete those threads with all their rows; how many existed."""

    async def copy_thread(self, source_id: str, target_id: str, now: float) -> bool:
        """Copy every row of ``source_id`` into ``target_id`` (replacing rows with the same
        key); False if the source has no rows."""
