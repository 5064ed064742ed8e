"""The SQLite store's reads: runs and forks listed, and a run's steps, checkpoints, events, journal
and signals read (a signal's put beside its reads).

Each is one query on the store's connection (:mod:`~nestegg.checkpoint.stores.sqlite.connection`
decides the thread); none goes through group commit, so none waits behind a batch.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from nestegg.checkpoint.records import (
    CheckpointRecord,
    EventRecord,
    JournalRecord,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.step_blocks import StepPiece, step_records
from nestegg.checkpoint.stores.common import run_not_found
from nestegg.checkpoint.stores.sqlite.blocks import read_history
from nestegg.checkpoint.stores.sqlite.connection import SQLiteConnection
from nestegg.checkpoint.stores.sqlite.events import events_after
from nestegg.checkpoint.stores.sqlite.schema import (
    BODY,
    CHECKPOINT_COLUMNS,
    CHECKPOINTS,
    JOURNAL,
    KEY_OF,
    MAX_SEQ,
    SELECT_EVENT_BATCHES,
    SELECT_FORKS,
    SELECT_RUN,
    SIGNALS,
    checkpoint_from_row,
    marks,
    run_from_row,
    write_transaction,
)


class SQLiteReads:
    """Runs listed and a run's rows read (and its signals put) in SQLite."""

    _connection: SQLiteConnection

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        where, params = run_filter(pipeline, statuses)
        if before is not None:
            where += " AND (created_at, run_id) < (?, ?)"
            params.extend(before)
        query = f"{SELECT_RUN}{where} ORDER BY created_at DESC, run_id DESC LIMIT ?"
        params.append(-1 if limit is None else limit)
        rows = await self._connection.call(_fetch_all, query, params)
        return [run_from_row(row) for row in rows]

    async def list_forks(self, run_id: str, limit: int | None = None) -> list[RunRecord]:
        params = (run_id, -1 if limit is None else limit)
        rows = await self._connection.call(_fetch_all, SELECT_FORKS, params)
        return [run_from_row(row) for row in rows]

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        params = (run_id, after, MAX_SEQ if upto is None else min(upto, MAX_SEQ))
        return await self._connection.call(_load_steps, params)

    async def load_history(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepPiece]:
        params = (run_id, after, MAX_SEQ if upto is None else min(upto, MAX_SEQ))
        return await self._connection.call(read_history, params)

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        query = (
            f"SELECT {CHECKPOINT_COLUMNS} FROM {CHECKPOINTS} WHERE run_id = ? "
            "ORDER BY seq, checkpoint_id"
        )
        rows = await self._connection.call(_fetch_all, query, (run_id,))
        return [checkpoint_from_row(row) for row in rows]

    async def list_checkpoints_of(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[CheckpointRecord]]:
        query = (
            f"SELECT {CHECKPOINT_COLUMNS} FROM {CHECKPOINTS} WHERE run_id IN "
            f"({marks(len(run_ids))}) ORDER BY run_id, seq, checkpoint_id"
        )
        rows = await self._connection.call(_fetch_all, query, tuple(run_ids)) if run_ids else []
        listed: dict[str, list[CheckpointRecord]] = {}
        for row in rows:
            checkpoint = checkpoint_from_row(row)
            listed.setdefault(checkpoint.run_id, []).append(checkpoint)
        return listed

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        query = f"SELECT {CHECKPOINT_COLUMNS} FROM {CHECKPOINTS} WHERE checkpoint_id = ?"
        rows = await self._connection.call(_fetch_all, query, (checkpoint_id,))
        return checkpoint_from_row(rows[0]) if rows else None

    async def read_events(
        self, run_id: str, since_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        return await self._connection.call(_read_events, run_id, since_seq, limit)

    async def read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        query = f"SELECT position, {BODY} FROM {JOURNAL} WHERE run_id = ? AND step = ? ORDER BY 1"
        rows = await self._connection.call(_fetch_all, query, (run_id, step))
        return [JournalRecord(run_id, step, position, body) for position, body in rows]

    async def put_signal(self, signal: SignalRecord, replace: bool = False) -> bool:
        return await self._connection.write(
            _put_signal, signal, replace, size=len(signal.body), small=False
        )

    async def read_signals(self, run_id: str) -> list[SignalRecord]:
        query = f"SELECT name, at, {BODY} FROM {SIGNALS} WHERE run_id = ? ORDER BY name"
        rows = await self._connection.call(_fetch_all, query, (run_id,))
        return [SignalRecord(run_id, name, at, body) for name, at, body in rows]


def run_filter(pipeline: str | None, statuses: Sequence[str] | None) -> tuple[str, list[Any]]:
    """The WHERE clause, and its parameters, of the runs of ``pipeline`` in ``statuses``
    (either None: any); the store's run expiry filters with it too."""
    clauses = ["1"]
    params: list[Any] = []
    if pipeline is not None:
        clauses.append("pipeline = ?")
        params.append(pipeline)
    if statuses is not None:
        clauses.append(f"status IN ({marks(len(statuses))})")
        params.extend(statuses)
    return " WHERE " + " AND ".join(clauses), params


# -- work done on the worker thread (or on the loop thread, for a write that can) ------------


def _fetch_all(conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> list[Any]:
    return conn.execute(query, params).fetchall()


def _load_steps(conn: sqlite3.Connection, params: tuple[str, int, int]) -> list[StepRecord]:
    return step_records(read_history(conn, params))


def _read_events(
    conn: sqlite3.Connection, run_id: str, since_seq: int, limit: int | None
) -> list[EventRecord]:
    params = (run_id, max(since_seq, 0), MAX_SEQ)
    batches = (bytes(row[0]) for row in conn.execute(SELECT_EVENT_BATCHES, params))
    return events_after(run_id, batches, since_seq, limit)


def _put_signal(conn: sqlite3.Connection, signal: SignalRecord, replace: bool) -> bool:
    with write_transaction(conn):
        if conn.execute(KEY_OF, (signal.run_id,)).fetchone() is None:
            raise run_not_found(signal.run_id)
        verb = "INSERT OR REPLACE" if replace else "INSERT OR IGNORE"
        cursor = conn.execute(
            f"{verb} INTO {SIGNALS} (run_id, name, at, body) VALUES (?,?,?,?)",
            (signal.run_id, signal.name, signal.at, signal.body),
        )
        return cursor.rowcount > 0
