"""A group commit of many runs written in a few statements: each table's rows of all the
commits in one multi-row statement (and the runs started at once created so:
:func:`create_together`).

A batch of a group commit runs on the store's worker thread while the event loop goes on
with the other runs. Every statement there lets go of the GIL while SQLite works and then
waits to take it back from the busy loop (up to the interpreter's switch interval): a
batch written statement by statement, five or more per commit, waits that long hundreds
of times; written table by table it waits a handful of times. Fewer statements also cost
less on any thread (bench/concurrent_runs.py, docs/benchmarks.md).

Each run's fence is checked by the update of its row (matching its id and fence): if one
run's row does not match, :func:`write_together` raises :class:`Unmatched` and the caller
undoes the statements and writes the commits one by one, which tells each run its error.
Only commits that truncate nothing and complete no block of steps, of runs with one commit
in the batch, are written this way (:func:`writable_together`); the others, rare, commit
by commit.

The step records and event batches go to tables of their own (schema version 6), in the
order written: the commits of many runs fill a few shared pages, where the keyed tables
would have each run's row land on a page of its own, written to the WAL whole (a fifth
of the WAL bytes per step at 1,000 runs). Their keys leave the keyed tables (by a trigger, see
``GROUP_STEPS``); the run keys are taken from the runs table in the statements themselves.
"""

from __future__ import annotations

import functools
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from nestegg.checkpoint.stores.common import ChangeSet
from nestegg.checkpoint.stores.sqlite.blocks import blocks_completed
from nestegg.checkpoint.stores.sqlite.events import pack_events
from nestegg.checkpoint.stores.sqlite.schema import (
    CHECKPOINTS,
    GROUP_EVENT_BATCHES,
    GROUP_STEPS,
    JOURNAL,
    MAX_SEQ,
    RUN_COLUMNS,
    RUNS,
    SEQ_SPAN,
    ids_per_query,
    marks,
    write_transaction,
)

ROWS_PER_STATEMENT = (8, 32, 128, 512)
"""The rows of one multi-row statement: its rows padded to one of these many (with rows of
NULLs, which every statement here skips), so that few statement texts recur and the
connection's cache of compiled statements keeps them (fewer where SQLite allows fewer
parameters)."""

_PLAIN = " SELECT * FROM (VALUES {rows}) WHERE column1 IS NOT NULL"
"""Rows as they are, the padding left out."""
_KEYED = (
    "SELECT r.run_key * {span} + v.column2{columns} FROM (VALUES {rows}) AS v "
    f"JOIN {RUNS} AS r ON r.run_id = v.column1"
)
"""Rows ``(run_id, seq, ...)`` turned into ``(run_key * SEQ_SPAN + seq, ...)``."""

_DELETE_CHECKPOINTS = (
    f"DELETE FROM {CHECKPOINTS} WHERE checkpoint_id IN (SELECT c.checkpoint_id FROM (VALUES "
)
_DELETE_CHECKPOINTS_TAIL = (
    f") AS v JOIN {CHECKPOINTS} AS c ON c.checkpoint_id = v.column1 AND c.run_id = v.column2)"
)
"""Rows ``(checkpoint_id, run_id)`` deleted, each found by its key (a plain ``(checkpoint_id,
run_id) IN (VALUES ...)`` scans every checkpoint of every run)."""


class Unmatched(Exception):
    """A run's row did not match its commit's run id and fence (gone, or fenced off)."""


def writable_together(changes: Sequence[ChangeSet]) -> list[int]:
    """The indexes of those of ``changes`` that :func:`write_together` may write: of a
    run with one change among them, truncating nothing, completing no block of steps,
    every sequence number in range."""
    runs = Counter(change.run_id for change in changes)
    return [
        index
        for index, change in enumerate(changes)
        if runs[change.run_id] == 1 and _writable(change)
    ]


def _writable(change: ChangeSet) -> bool:
    if change.truncate_after is not None or blocks_completed(change.steps):
        return False
    seqs = [step.seq for step in change.steps] + [event.seq for event in change.events]
    return not seqs or (0 < min(seqs) and max(seqs) <= MAX_SEQ)


def write_together(conn: sqlite3.Connection, changes: Sequence[ChangeSet]) -> None:
    """Write ``changes`` inside the caller's transaction.

    Raises:
        Unmatched: a run's row did not match; the caller undoes what was written.
    """
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    _update_runs(conn, changes, limit)
    steps = [(c.run_id, s.seq, s.agent, s.body) for c in changes for s in c.steps]
    _write_keyed(conn, limit, (GROUP_STEPS, "step_key", "agent, body"), steps)
    events = [
        (c.run_id, max(e.seq for e in c.events), pack_events(c.events)) for c in changes if c.events
    ]
    _write_keyed(conn, limit, (GROUP_EVENT_BATCHES, "batch_key", "body"), events)
    journal = [(c.run_id, j.step, j.position, j.body) for c in changes for j in c.journal]
    insert_journal = f"INSERT OR REPLACE INTO {JOURNAL} (run_id, step, position, body)"
    _write_rows(conn, limit, _plain(insert_journal, 4), journal)
    checkpoints = [
        (c.run_id, k.checkpoint_id, k.seq, k.created_at, k.reason, k.body)
        for c in changes
        for k in c.checkpoints
    ]
    insert_checkpoints = (
        f"INSERT OR REPLACE INTO {CHECKPOINTS} "
        "(run_id, checkpoint_id, seq, created_at, reason, body)"
    )
    _write_rows(conn, limit, _plain(insert_checkpoints, 6), checkpoints)
    pruned = [(checkpoint_id, c.run_id) for c in changes for checkpoint_id in c.prune]
    _write_rows(conn, limit, (_DELETE_CHECKPOINTS, _DELETE_CHECKPOINTS_TAIL, 2), pruned)


def create_together(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> list[bool]:
    """Create the runs of ``rows`` (``run_to_row``'s, run id first) in one transaction, in a
    few statements; whether each was created (False: its id was stored already, or came
    earlier in ``rows``)."""
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    ids = list(dict.fromkeys(row[0] for row in rows))
    with write_transaction(conn):
        stored: set[str] = set()
        for chunk in _chunks(ids, ids_per_query(conn)):
            query = f"SELECT run_id FROM {RUNS} WHERE run_id IN ({marks(len(chunk))})"
            stored.update(run_id for (run_id,) in conn.execute(query, chunk))
        new: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            if row[0] not in stored:
                new.setdefault(row[0], row)
        if new:
            width = len(rows[0])
            insert = _plain(f"INSERT INTO {RUNS} ({RUN_COLUMNS})", width)
            _write_rows(conn, limit, insert, list(new.values()))
    return [new.get(row[0]) is row for row in rows]


def _write_keyed(
    conn: sqlite3.Connection, limit: int, table: tuple[str, str, str], rows: list[Any]
) -> None:
    """Rows ``(run_id, seq, *values)`` into a group table (whose trigger takes their keys
    out of the keyed table). ``table``: its name, the key column, the others."""
    group, key, columns = table
    width = 3 + columns.count(",")
    head, tail = _keyed_select("".join(f", v.column{n}" for n in range(3, width + 1)))
    insert = f"INSERT OR REPLACE INTO {group} ({key}, {columns}) {head}"
    _write_rows(conn, limit, (insert, tail, width), rows)


def _plain(insert: str, width: int) -> tuple[str, str, int]:
    head, tail = _PLAIN.format(rows="\0").split("\0")
    return insert + head, tail, width


def _keyed_select(columns: str) -> tuple[str, str]:
    """``_KEYED`` with ``columns``, cut around the place of the ``VALUES`` rows."""
    head, tail = _KEYED.format(span=SEQ_SPAN, columns=columns, rows="\0").split("\0")
    return head, tail


def _write_rows(
    conn: sqlite3.Connection, limit: int, statement: tuple[str, str, int], rows: list[Any]
) -> int:
    """Run ``head VALUES-rows tail`` over ``rows``, in padded chunks; the rows it changed."""
    head, tail, width = statement
    most = max(1, limit // width)
    sizes = [size for size in ROWS_PER_STATEMENT if size <= most] or [most]
    changed = 0
    for chunk in _chunks(rows, sizes[-1]):
        size = next(size for size in sizes if size >= len(chunk))
        params = [value for row in chunk for value in row]
        params += [None] * (width * (size - len(chunk)))
        changed += conn.execute(_statement(head, tail, width, size), params).rowcount
    return changed


@functools.lru_cache(maxsize=64)
def _statement(head: str, tail: str, width: int, rows: int) -> str:
    """``head``, ``rows`` rows of ``width`` parameters, ``tail``."""
    return head + ",".join(["(" + ",".join("?" * width) + ")"] * rows) + tail


def _update_runs(conn: sqlite3.Connection, changes: Sequence[ChangeSet], limit: int) -> None:
    """Set the run fields of every change on its run's row, matched by id and fence."""
    groups: dict[tuple[str, ...], list[ChangeSet]] = {}
    for change in changes:
        groups.setdefault(tuple(change.run_fields), []).append(change)
    for columns, group in groups.items():
        width = len(columns) + 2
        sets = ", ".join(f"{column} = v.column{n}" for n, column in enumerate(columns, 3))
        head = f"UPDATE {RUNS} SET {sets or 'fence = fence'} FROM (VALUES "
        tail = f") AS v WHERE {RUNS}.run_id = v.column1 AND {RUNS}.fence = v.column2"
        rows = [(c.run_id, c.fence, *c.run_fields.values()) for c in group]
        if _write_rows(conn, limit, (head, tail, width), rows) != len(rows):
            raise Unmatched


def _chunks(rows: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


__all__ = [
    "ROWS_PER_STATEMENT",
    "Unmatched",
    "create_together",
    "writable_together",
    "write_together",
]
