"""The PostgreSQL store's grouped operations: many runs' commits, reads, creations and
claims that arrive together, sent in one round trip.

The store's :class:`~nestegg.checkpoint.stores.group.GroupCommitter` and
:class:`~nestegg.checkpoint.stores.group.GroupCalls` hand each batch to a ``…_many``
method here and a lone call to its ``…_one`` twin. A batch of commits is one call of the
group's commit function (``commit_many``), or of the commit function per commit
(``commit_each``) when a run has more than one commit in the batch; creations and claims
are one pipeline of statements in one transaction; reads one query. A statement's error
(not the connection's) has each call of the batch tried alone, so that it fails alone.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nestegg.checkpoint.records import Commit, RunRecord
from nestegg.checkpoint.stores.common import (
    change_set,
    claim_refusal,
    commit_outcome,
    run_claimed,
    run_not_found,
)
from nestegg.checkpoint.stores.group import Outcome, outcome_of, runs_read
from nestegg.checkpoint.stores.postgres.connection import Cursor
from nestegg.checkpoint.stores.postgres.schema import commit_params, run_from_row
from nestegg.errors import StorageError, StorageUnavailableError


def claimed_id(params: list[Any]) -> str:
    """The run id of a claim's parameters."""
    return str(params[-3])


def _create_params(run: RunRecord) -> list[Any]:
    owner = run.owner
    return [
        run.run_id,
        run.pipeline,
        run.status,
        run.input,
        run.created_at,
        run.updated_at,
        run.fence,
        owner.host if owner else None,
        owner.pid if owner else None,
        owner.started if owner else None,
        run.lease_until,
        run.result,
        run.error,
        run.step_seq,
        run.event_seq,
        run.parent_run,
        run.parent_checkpoint,
    ]


class PostgresBatches:
    """Commits, run reads, creations and claims of the PostgreSQL store, alone and in
    batches."""

    _queries: dict[str, bytes]
    _with_connection: Callable[..., Awaitable[Any]]
    _fetchone: Callable[..., Awaitable[Any]]
    _fetchall: Callable[..., Awaitable[list[Any]]]

    async def _create_one(self, run: RunRecord) -> bool:
        async def insert(cursor: Cursor) -> Any:
            await cursor.execute(self._queries["create_run"], _create_params(run))
            return await cursor.fetchone()

        return await self._with_connection(insert, idempotent=False) is not None

    async def _create_many(self, runs: Sequence[RunRecord]) -> list[bool | BaseException]:
        """Many runs created in one round trip (one pipeline of inserts)."""
        params = [_create_params(run) for run in runs]
        try:
            rows = await self._many_returning("create_run", params, idempotent=False)
        except StorageUnavailableError:
            raise
        except StorageError:  # one bad run: each alone, so that it fails alone
            return [await outcome_of(self._create_one, run) for run in runs]
        return [row is not None for row in rows]

    async def _many_returning(
        self, query: str, params: list[list[Any]], *, idempotent: bool
    ) -> list[Any]:
        """``query`` run once per parameter list, in one pipeline and one transaction (an
        error undoes all of them, so that each can be tried alone); each one's first row."""

        async def run(cursor: Cursor) -> list[Any]:
            async with cursor.connection.transaction():
                await cursor.executemany(self._queries[query], params, returning=True)
            rows = [await cursor.fetchone()]
            while cursor.nextset():
                rows.append(await cursor.fetchone())
            return rows

        rows: list[Any] = await self._with_connection(run, idempotent=idempotent)
        return rows

    async def _get_one(self, run_id: str) -> RunRecord | None:
        row = await self._fetchone("get_run", [run_id])
        return run_from_row(row) if row else None

    async def _get_many(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        rows = await self._fetchall("get_runs", [list(run_ids)])
        return runs_read({run.run_id: run for run in map(run_from_row, rows)}, run_ids)

    async def _claim_one(self, params: list[Any]) -> RunRecord:
        async def claim(cursor: Cursor) -> Any:
            await cursor.execute(self._queries["claim_run"], params, binary=True)
            return await cursor.fetchone()

        return await self._claimed(params, await self._with_connection(claim, idempotent=False))

    async def _claim_many(self, claims: Sequence[list[Any]]) -> list[RunRecord | BaseException]:
        """Many runs claimed in one round trip (one pipeline of fenced updates)."""
        try:
            rows = await self._many_returning("claim_run", list(claims), idempotent=False)
        except StorageUnavailableError:
            raise
        except StorageError:  # one bad claim: each alone, so that it fails alone
            return [await outcome_of(self._claim_one, params) for params in claims]
        return [
            await outcome_of(functools.partial(self._claimed, params), row)
            for params, row in zip(claims, rows, strict=True)
        ]

    async def _claimed(self, params: list[Any], row: Any) -> RunRecord:
        """The run a claim's ``row`` holds; without one, why the claim failed."""
        if row is not None:
            return run_from_row(row)
        run_id = claimed_id(params)
        stored = await self._fetchone("claim_state", [run_id])
        if stored is None:
            raise run_not_found(run_id)
        expected_fence, reopen = params[-2:]
        refusal = claim_refusal(run_id, stored[0], stored[1], expected_fence, reopen)
        raise refusal or run_claimed(run_id)

    async def _commit_one(self, commit: Commit) -> None:
        row = await self._fetchone("commit", commit_params(change_set(commit)))
        outcome = commit_outcome(commit, row[0] if row else None)
        if outcome is not None:
            raise outcome

    async def _commit_many(self, commits: Sequence[Commit]) -> list[Outcome]:
        """Many runs' commits in one statement, one round trip (group commit), each fenced
        on its own: one call of the group's commit function, or when a run has more than
        one commit in the group, one call of the commit function per commit, in order. An
        error of the statement (not of the connection) has every commit tried alone, so
        that it fails alone."""
        columns: list[list[Any]] = [[], [], [], []]
        for commit in commits:
            for column, value in zip(columns, commit_params(change_set(commit)), strict=True):
                column.append(value)
        try:
            if len(set(columns[0])) == len(commits):
                stored = (await self._fetchone("commit_many", columns))[0]
            else:
                stored = [row[0] for row in await self._fetchall("commit_each", columns)]
        except StorageUnavailableError:
            raise
        except StorageError:
            return [await outcome_of(self._commit_one, commit) for commit in commits]
        return [commit_outcome(c, fence) for c, fence in zip(commits, stored, strict=True)]
