"""The Redis store's indexes of runs: listing runs, a page at a time or all of them, and
the runs forked from a run.

Runs are indexed in sorted sets by creation time: ``runs`` (every run),
``pipeline:<name>`` (a pipeline's runs) and ``forks:<run id>`` (the runs forked from that
run; layout version 1). Index entries of runs whose keys Redis expired are dropped lazily
when read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.redis.layout import LAYOUT_KEY, LAYOUT_VERSION, run_from_hash

SCAN_BATCH = 500


class RedisRunIndex:
    """Listing the runs of a :class:`~nestegg.checkpoint.stores.redis.RedisCheckpointStorage`."""

    prefix: str
    read_only: bool
    _client: Any
    _call: Callable[..., Awaitable[Any]]
    _script: Callable[..., Awaitable[Any]]
    _runs_of_status: Any
    _list_forks: Any
    _index_forks: Any
    _key: Callable[..., str]

    def _pipeline_key(self, pipeline: str) -> str:
        return self._key("pipeline:", pipeline)

    async def _iter_runs(
        self,
        pipeline: str | None,
        newest_first: bool,
        statuses: Sequence[str] | None,
        want: Callable[[RunRecord], bool] | None = None,
    ) -> AsyncIterator[RunRecord]:
        index = self._key("runs") if pipeline is None else self._pipeline_key(pipeline)
        read = self._client.zrevrange if newest_first else self._client.zrange
        ids: list[bytes] = await self._call(lambda: read(index, 0, -1), idempotent=True)
        for start in range(0, len(ids), SCAN_BATCH):
            batch = ids[start : start + SCAN_BATCH]
            hashes = await self._hashes_of(batch, statuses)
            gone = [run_id for run_id, raw in zip(batch, hashes, strict=True) if raw is None]
            if gone:  # runs whose keys Redis expired: drop their index entries
                await self._call(partial(self._client.zrem, index, *gone), idempotent=True)
            for raw in hashes:
                if not raw:  # gone, or of another status
                    continue
                run = run_from_hash(raw)
                if want is None or want(run):
                    yield run

    async def _hashes_of(
        self, run_ids: list[bytes], statuses: Sequence[str] | None
    ) -> list[dict[bytes, bytes] | None]:
        """The hash of each run (None: gone); with ``statuses``, read by the RUNS_OF_STATUS
        script, an empty one for a run of another status."""
        if statuses is None:
            hashes = await self._call(partial(self._fetch_runs, run_ids), idempotent=True)
            return [raw or None for raw in hashes]
        if not run_ids:
            return []
        keys = [self._key("run:", run_id.decode()) for run_id in run_ids]
        replies = await self._script(self._runs_of_status, keys, list(statuses))
        return [_hash_of_reply(reply) for reply in replies]

    async def _fetch_runs(self, run_ids: list[bytes]) -> list[dict[bytes, bytes]]:
        async with self._client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hgetall(self._key("run:", run_id.decode()))
            hashes: list[dict[bytes, bytes]] = await pipe.execute()
        return hashes

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        runs: list[RunRecord] = []
        if limit is not None and limit <= 0:
            return runs
        if before is None and limit is None:
            found = self._iter_runs(pipeline, True, statuses)
        else:  # a page: read the index a batch at a time, not all of it
            # Without a status filter, a page needs only ``limit`` runs from the index.
            batch = SCAN_BATCH if statuses is not None or limit is None else limit
            found = self._iter_older(pipeline, before, statuses, min(batch, SCAN_BATCH))
        async for run in found:
            runs.append(run)
            if limit is not None and len(runs) >= limit:
                break
        return runs

    async def _iter_older(
        self,
        pipeline: str | None,
        before: tuple[float, str] | None,
        statuses: Sequence[str] | None,
        batch_size: int,
    ) -> AsyncIterator[RunRecord]:
        """Runs after ``before`` (None: all) newest first, read from the index
        ``batch_size`` at a time."""
        index = self._key("runs") if pipeline is None else self._pipeline_key(pipeline)
        at, last_id = before if before is not None else (float("inf"), "")
        offset = 0
        while True:
            batch: list[tuple[bytes, float]] = await self._call(
                partial(
                    self._client.zrevrangebyscore,
                    index, "+inf" if before is None else repr(at), "-inf",
                    start=offset, num=batch_size, withscores=True,
                ),
                idempotent=True,
            )  # fmt: skip
            offset += len(batch)
            ids = [m for m, score in batch if score < at or m.decode() < last_id]
            for raw in await self._hashes_of(ids, statuses):
                if raw:  # None: expired meanwhile; empty: of another status
                    yield run_from_hash(raw)
            if len(batch) < batch_size:
                return

    async def list_forks(self, run_id: str, limit: int | None = None) -> list[RunRecord]:
        """The runs forked from ``run_id``, newest first, from its forks index, read
        SCAN_BATCH at a time; from every run of a store of layout version 0, whose index a
        writer's setup() has not built yet (a reader's)."""
        forks: list[RunRecord] = []
        if limit is not None and limit <= 0:
            return forks
        keys = [self._key(LAYOUT_KEY), self._key("forks:", run_id)]
        stale: list[bytes] = []
        offset = 0
        while limit is None or len(forks) < limit:
            size = SCAN_BATCH if limit is None else min(SCAN_BATCH, limit - len(forks))
            ids = await self._script(self._list_forks, keys, [offset, offset + size - 1])
            if ids is None:  # layout version 0
                return await self._scan_forks(run_id, limit)
            offset += len(ids)
            for member, raw in zip(ids, await self._hashes_of(ids, None), strict=True):
                run = run_from_hash(raw) if raw else None
                if run is None or run.parent_run != run_id:  # expired by Redis (and anew)
                    stale.append(member)
                else:
                    forks.append(run)
            if len(ids) < size:
                break
        if stale and not self.read_only:
            await self._call(partial(self._client.zrem, keys[1], *stale), idempotent=True)
        return forks

    async def _scan_forks(self, run_id: str, limit: int | None) -> list[RunRecord]:
        """The runs forked from ``run_id`` found among every run, newest first."""
        forks: list[RunRecord] = []
        async for run in self._iter_runs(None, True, None, lambda r: r.parent_run == run_id):
            forks.append(run)
            if limit is not None and len(forks) >= limit:
                break
        return forks

    async def _build_forks_index(self) -> None:
        """Bring a store of layout version 0 to version 1: every run that is a fork into its
        parent's forks index (idempotent; a fork created meanwhile indexes itself)."""
        layout = self._key(LAYOUT_KEY)
        if int(await self._client.get(layout) or 0) >= LAYOUT_VERSION:
            return
        ids: list[bytes] = await self._client.zrange(self._key("runs"), 0, -1)
        for start in range(0, len(ids), SCAN_BATCH):
            keys = [
                self._key("run:", run_id.decode()) for run_id in ids[start : start + SCAN_BATCH]
            ]
            await self._index_forks(keys, [self.prefix])  # setup() retries the whole
        await self._client.set(layout, LAYOUT_VERSION)


def _hash_of_reply(reply: Any) -> dict[bytes, bytes] | None:
    """A run's hash from its RUNS_OF_STATUS reply: None when gone, empty when of another
    status."""
    if reply == 0:
        return None
    if reply == 1:
        return {}
    return dict(zip(reply[::2], reply[1::2], strict=True))
