"""The stores' size limits, applied to a LangGraph thread's rows before any is sent.

A store takes one value of at most ``RECORD_MAX_BYTES`` and a commit of at most
``COMMIT_MAX_BYTES`` (:mod:`nestegg.constants`). The saver refuses a channel value, a
write, a checkpoint or a task's writes over them with RecordTooLargeError in the call that
gave it, nothing sent; writes kept for the next checkpoint are committed apart from it, in
commits a store takes, when they would make its commit too large.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nestegg.checkpoint.stores.threads import ThreadRow
from nestegg.constants import COMMIT_MAX_BYTES, RECORD_MAX_BYTES
from nestegg.errors import RecordTooLargeError
from nestegg.langgraph.rows import SEP


def size_of(*groups: Sequence[ThreadRow]) -> int:
    """Bytes of the rows' bodies."""
    return sum(len(row.body) for rows in groups for row in rows)


def check_row(row: ThreadRow, what: Callable[[], str], value: Any) -> ThreadRow:
    """``row`` if its body is at most RECORD_MAX_BYTES, else RecordTooLargeError naming
    ``what()`` and the type of ``value``, the value it holds."""
    if len(row.body) > RECORD_MAX_BYTES:
        raise RecordTooLargeError(what(), type(value).__qualname__, len(row.body), RECORD_MAX_BYTES)
    return row


def check_commit(what: Callable[[], str], *groups: Sequence[ThreadRow]) -> None:
    """Refuse the rows of ``groups`` if they add up past COMMIT_MAX_BYTES:
    RecordTooLargeError naming ``what()``."""
    size = size_of(*groups)
    if size > COMMIT_MAX_BYTES:
        raise RecordTooLargeError(what(), "ThreadChange", size, COMMIT_MAX_BYTES)


def check_write(row: ThreadRow, channel: str, value: Any, task_id: str, thread_id: str) -> None:
    """:func:`check_row` for the write ``row`` of ``value`` to ``channel`` by a task."""
    check_row(
        row, lambda: f"the write to channel {channel!r} of {_task(task_id, thread_id)}", value
    )


def check_writes(task_id: str, thread_id: str, *groups: Sequence[ThreadRow]) -> None:
    """:func:`check_commit` for the writes of a task."""
    check_commit(lambda: f"the writes of {_task(task_id, thread_id)}", *groups)


def _task(task_id: str, thread_id: str) -> str:
    return f"task {task_id!r} of thread {thread_id!r}"


def fits(*groups: Sequence[ThreadRow]) -> bool:
    """True if one commit takes the rows of ``groups``."""
    return size_of(*groups) <= COMMIT_MAX_BYTES


def batches(writes: Sequence[ThreadRow]) -> list[list[ThreadRow]]:
    """``writes`` cut into commits a store takes, in order, the writes of a task (those of
    one ``put_writes`` fit: :func:`check_commit`) in one commit."""
    tasks: list[list[ThreadRow]] = []
    for row in writes:
        task = row.key.rpartition(SEP)[0]  # the key less its index
        if tasks and tasks[-1][-1].key.rpartition(SEP)[0] == task and fits(tasks[-1], [row]):
            tasks[-1].append(row)
        else:
            tasks.append([row])
    cut: list[list[ThreadRow]] = []
    for task_rows in tasks:
        if cut and fits(cut[-1], task_rows):
            cut[-1].extend(task_rows)
        else:
            cut.append(list(task_rows))
    return cut
