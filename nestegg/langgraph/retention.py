"""Retention of LangGraph threads, applied on the write path: ``keep_latest`` checkpoints
per namespace and a ``ttl`` after a thread's last write; and the collection of channel
values that no remaining checkpoint needs (a delta's earlier pieces stay while a kept
checkpoint's value is built from them)."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from nestegg.checkpoint.stores.threads import (
    BLOB,
    CHECKPOINT,
    ThreadChange,
    ThreadRow,
    ThreadStore,
)
from nestegg.errors import CheckpointCorruptedError, ConfigurationError
from nestegg.langgraph.damage import decode_values
from nestegg.langgraph.rows import (
    SEP,
    BlobBody,
    CheckpointBody,
    blob_key,
    chain_keys,
    prefix_range,
    split_key,
)

if TYPE_CHECKING:
    from nestegg.langgraph.core import ThreadCheckpoints

PRUNE_STRATEGIES = ("keep_latest", "delete")
MIN_SWEEP_SECONDS = 1.0
MAX_SWEEP_SECONDS = 3600.0


class Retention:
    """The retention settings of a saver and what it remembers to apply them cheaply."""

    def __init__(
        self,
        keep_latest: int | None,
        ttl: timedelta | None,
        collect_every: int,
        clock: Callable[[], float],
    ) -> None:
        self.keep_latest = keep_latest
        self.ttl = ttl.total_seconds() if ttl is not None else None
        self.collect_every = collect_every
        self.clock = clock
        self._ids: dict[tuple[str, str], list[str]] = {}
        self._puts: dict[str, int] = {}
        self._next_sweep = 0.0

    def forget(self, thread_id: str) -> None:
        self._puts.pop(thread_id, None)
        for key in [k for k in self._ids if k[0] == thread_id]:
            del self._ids[key]

    async def dropped_on_put(
        self, store: ThreadStore, thread_id: str, ns: str, checkpoint_id: str
    ) -> list[str]:
        """The checkpoint ids of ``ns`` that go when ``checkpoint_id`` is added."""
        if self.keep_latest is None:
            return []
        ids = self._ids.get((thread_id, ns))
        if ids is None:
            low, high = prefix_range(ns + SEP)
            rows = await store.scan_thread_rows(thread_id, CHECKPOINT, low, high)
            ids = self._ids[(thread_id, ns)] = [split_key(row.key)[-1] for row in rows]
        position = bisect.bisect_left(ids, checkpoint_id)
        if position == len(ids) or ids[position] != checkpoint_id:
            ids.insert(position, checkpoint_id)
        dropped = ids[: -self.keep_latest]
        del ids[: -self.keep_latest]
        return dropped

    async def after_put(self, core: ThreadCheckpoints, thread_id: str) -> None:
        if self.keep_latest is not None:
            puts = self._puts.get(thread_id, 0) + 1
            self._puts[thread_id] = puts
            if puts >= self.collect_every:
                self._puts[thread_id] = 0
                await self.collect(core, thread_id)
        if self.ttl is not None and self.clock() >= self._next_sweep:
            await self.sweep(core)

    async def sweep(self, core: ThreadCheckpoints) -> list[str]:
        """Delete the threads not written for ``ttl``; their ids."""
        if self.ttl is None:
            return []
        await core.flush()
        now = self.clock()
        self._next_sweep = now + min(max(self.ttl / 10, MIN_SWEEP_SECONDS), MAX_SWEEP_SECONDS)
        expired = [
            i.thread_id for i in await core.store.list_threads() if i.updated_at < now - self.ttl
        ]
        if expired:
            await core.store.delete_threads(expired)
            for thread_id in expired:
                core.forget(thread_id)
        return expired

    async def collect(self, core: ThreadCheckpoints, thread_id: str) -> int:
        """Delete the channel values of the thread that no checkpoint needs; how many. A
        damaged row fails nothing and loses nothing that may be needed (:func:`_needed`)."""
        store = core.store
        low, high = prefix_range("")
        checkpoints = await store.scan_thread_rows(thread_id, CHECKPOINT, low, high)
        blobs, bad = decode_values(await store.scan_thread_rows(thread_id, BLOB, low, high))
        needed = _needed(checkpoints, blobs, bad)
        doomed = [key for key in [*blobs, *bad] if not needed(key)]
        if doomed:
            change = ThreadChange(delete=[(BLOB, key, key + "\x01") for key in doomed])
            await store.apply_thread_change(thread_id, change, self.clock())
        return len(doomed)


def _needed(
    checkpoints: Sequence[ThreadRow], blobs: dict[str, BlobBody], bad: Collection[str]
) -> Callable[[str], bool]:
    """Whether a channel value row (by key) may be read by a read of one of ``checkpoints``,
    given the values ``blobs`` decoded and the keys of those ``bad`` (damaged): the rows of
    each one's chain; and every value of the namespace of a damaged checkpoint (which it
    needs cannot be told) or of the channel of a damaged value a chain runs into (what
    pieces lie before it cannot be told)."""
    chains: set[str] = set()
    whole: set[tuple[str, ...]] = set()
    for row in checkpoints:
        ns = split_key(row.key)[0]
        try:
            versions = CheckpointBody.unpack(row.body).versions
        except CheckpointCorruptedError:
            whole.add((ns,))
            continue
        for channel, version in versions.items():
            if _mark_chain(blobs, blob_key(ns, channel, version), chains) in bad:
                whole.add((ns, channel))

    def needed(key: str) -> bool:
        ns, channel, _ = split_key(key)
        return key in chains or (ns,) in whole or (ns, channel) in whole

    return needed


def _mark_chain(blobs: dict[str, BlobBody], key: str, needed: set[str]) -> str | None:
    """Add the chain of ``key`` to ``needed``; the piece it stops at, not decoded (missing
    or damaged), if any."""
    for piece in chain_keys(blobs, key):
        if piece in needed:
            return None
        if piece not in blobs:
            return piece
        needed.add(piece)
    return None


async def prune(core: ThreadCheckpoints, thread_ids: Sequence[str], strategy: str) -> None:
    """LangGraph's ``prune``: ``keep_latest`` keeps the newest checkpoint of each namespace
    (and the values it needs), ``delete`` deletes the threads, whatever their ids."""
    if strategy not in PRUNE_STRATEGIES:
        raise ConfigurationError(
            f"unknown prune strategy {strategy!r}; use one of {', '.join(PRUNE_STRATEGIES)}"
        )
    # any id: a thread an older version wrote (an empty id, one holding a NUL) goes too
    thread_ids = await core.stored_ids([str(thread_id) for thread_id in thread_ids])
    await core.flush()
    if strategy == "delete":
        for thread_id in thread_ids:
            core.forget(thread_id)
        await core.store.delete_threads(list(thread_ids))
        return
    for thread_id in dict.fromkeys(thread_ids):
        doomed = await superseded(core.store, thread_id)
        if doomed:
            await core.drop_checkpoints(thread_id, doomed)


async def superseded(store: ThreadStore, thread_id: str) -> list[str]:
    """The checkpoint row keys of the thread that a newer checkpoint of their namespace
    supersedes (:func:`superseded_keys` of its checkpoint rows)."""
    rows = await store.scan_thread_rows(thread_id, CHECKPOINT, *prefix_range(""))
    return superseded_keys(rows)


def superseded_keys(rows: Sequence[ThreadRow]) -> list[str]:
    """The keys of those of a thread's checkpoint ``rows`` (in key order) that a newer
    checkpoint of their namespace supersedes: what ``prune`` with ``keep_latest`` drops
    (a thread without any has nothing to prune)."""
    newest: dict[str, str] = {}
    for row in rows:  # key order: the last one of a namespace is its newest
        newest[split_key(row.key)[0]] = row.key
    kept = set(newest.values())
    return [row.key for row in rows if row.key not in kept]
