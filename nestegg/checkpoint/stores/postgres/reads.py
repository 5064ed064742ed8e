"""The PostgreSQL store's reads: runs and forks listed, and a run's steps, checkpoints, events,
journal and signals read (a signal's put beside its reads).

Each is one query on a connection from the pool, outside group commit; a read is retried
after a connection failure, a signal's put only when it replaces (one that keeps the
stored signal could otherwise report a put it made as refused).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nestegg.checkpoint.records import (
    CheckpointRecord,
    EventRecord,
    JournalRecord,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.common import run_not_found
from nestegg.checkpoint.stores.postgres.connection import Cursor
from nestegg.checkpoint.stores.postgres.schema import checkpoint_from_row, run_from_row


class PostgresReads:
    """Runs listed and a run's rows read (and its signals put) in PostgreSQL."""

    _queries: dict[str, bytes]
    _with_connection: Callable[..., Awaitable[Any]]
    _fetchone: Callable[..., Awaitable[Any]]
    _fetchall: Callable[..., Awaitable[list[Any]]]

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

    async def list_forks(self, run_id: str, limit: int | None = None) -> list[RunRecord]:
        return [run_from_row(row) for row in await self._fetchall("list_forks", [run_id, limit])]

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        params = {"run_id": run_id, "after": after, "upto": upto}
        rows = await self._fetchall("load_steps", params)
        return [StepRecord(run_id, seq, agent, bytes(body)) for seq, agent, body in rows]

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        return [checkpoint_from_row(r) for r in await self._fetchall("list_checkpoints", [run_id])]

    async def list_checkpoints_of(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[CheckpointRecord]]:
        listed: dict[str, list[CheckpointRecord]] = {}
        for row in await self._fetchall("list_checkpoints_of", [list(run_ids)]):
            checkpoint = checkpoint_from_row(row)
            listed.setdefault(checkpoint.run_id, []).append(checkpoint)
        return listed

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
