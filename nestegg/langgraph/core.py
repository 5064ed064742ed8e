"""What a LangGraph checkpoint means in thread rows: reads, writes and retention.

Runs on the saver's loop (:mod:`nestegg.langgraph.loop`); talks to the store only through
:class:`~nestegg.checkpoint.stores.threads.ThreadStore`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from nestegg.checkpoint.stores.threads import (
    BLOB,
    CHECKPOINT,
    WRITE,
    ThreadChange,
    ThreadRow,
    ThreadStore,
    check_thread_id,
)
from nestegg.errors import CheckpointCorruptedError
from nestegg.identifiers import unstorable_character
from nestegg.langgraph import limits
from nestegg.langgraph.damage import naming
from nestegg.langgraph.deferred import DeferredWrites
from nestegg.langgraph.ids import (
    BEFORE_ID_KEY,
    NAMESPACE_KEY,
    THREAD_ID_KEY,
    check_versions,
    check_writes,
    checkpoint_id_of,
    named_thread,
    namespace_of,
    thread_of,
    thread_to_read,
    written_checkpoint_id,
)
from nestegg.langgraph.linear import (
    Latest,
    LatestValues,
    decode_full,
    empty_blob,
    encode_value,
    rebuild,
)
from nestegg.langgraph.retention import Retention
from nestegg.langgraph.rows import (
    DELTA,
    EMPTY,
    PACK,
    SEP,
    BlobBody,
    CheckpointBody,
    WriteBody,
    blob_key,
    check_checkpoint_id,
    check_namespace,
    checkpoint_key,
    prefix_range,
    split_key,
    write_key,
    writes_prefix,
)
from nestegg.langgraph.serialized import dumps, unserializable


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def _matches(metadata: Mapping[str, Any], wanted: Mapping[str, Any] | None) -> bool:
    return not wanted or all(metadata.get(k) == v for k, v in wanted.items())


class ThreadCheckpoints:
    """LangGraph's saver operations over a ThreadStore."""

    def __init__(
        self,
        store: ThreadStore,
        serde: SerializerProtocol,
        retention: Retention,
        pack_every: int,
        clock: Callable[[], float],
        flush_due: Callable[[], None],
        defer_writes: bool = True,
    ) -> None:
        self.store = store
        self.serde = serde
        self.retention = retention
        self.pack_every = pack_every
        self.clock = clock
        self.latest = LatestValues()
        self.defer_writes = defer_writes
        # Added from callers' threads; flush_due runs self.flush_due() on the saver's loop.
        self.deferred = DeferredWrites(flush_due)

    # -- writes ---------------------------------------------------------------------------

    async def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns = thread_of(config), namespace_of(config)
        parent_id = checkpoint_id_of(config)
        check_checkpoint_id(checkpoint["id"], "checkpoint['id']")
        check_versions(new_versions, "new_versions")
        check_versions(checkpoint["channel_versions"], "checkpoint['channel_versions']")
        c: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = c.pop("channel_values")

        def what() -> str:
            return f"checkpoint {checkpoint['id']!r} of thread {thread_id!r}"

        rows: list[ThreadRow] = []
        latests: dict[str, Latest] = {}  # remembered once stored
        for ch, ver in new_versions.items():
            blobs, latest = self._blob_rows(thread_id, ns, ch, ver, values, what)
            rows.extend(blobs)
            if latest is not None:
                latests[ch] = latest
        meta = get_checkpoint_metadata(config, metadata)
        body = CheckpointBody(
            checkpoint=self.serde.dumps_typed(c),
            metadata=dumps(self.serde, meta, "the checkpoint's metadata"),
            parent_id=parent_id,
            run_id=str(meta["run_id"]) if meta.get("run_id") is not None else None,
            versions={ch: str(v) for ch, v in checkpoint["channel_versions"].items()},
        )
        row = ThreadRow(CHECKPOINT, checkpoint_key(ns, checkpoint["id"]), body.pack())
        rows.append(limits.check_row(row, what, checkpoint))
        limits.check_commit(lambda: f"the commit of {what()}", rows)
        drop = await self.retention.dropped_on_put(self.store, thread_id, ns, checkpoint["id"])
        gone = tuple(writes_prefix(ns, cid) for cid in drop)
        async with self._taking(thread_id) as pending:
            writes = [r for r in pending if not r.key.startswith(gone)]
            change = ThreadChange(put=rows, delete=_checkpoint_rows(ns, drop))
            await self._apply(thread_id, change, writes)
        for ch, latest in latests.items():
            self.latest.set(thread_id, ns, ch, latest)
        await self.retention.after_put(self, thread_id)
        return _config(thread_id, ns, checkpoint["id"])

    def _blob_rows(
        self,
        thread_id: str,
        ns: str,
        channel: str,
        version: Any,
        values: Mapping[str, Any],
        what: Callable[[], str],
    ) -> tuple[list[ThreadRow], Latest | None]:
        """The rows of a channel's value, and the channel's latest entry once stored."""
        if channel not in values:
            return [ThreadRow(BLOB, blob_key(ns, channel, version), empty_blob().pack())], None
        latest = self.latest.get(thread_id, ns, channel)
        value = values[channel]
        try:
            bodies, new_latest = encode_value(
                self.serde, latest, str(version), value, self.pack_every
            )
        except (TypeError, ValueError) as exc:
            raise unserializable(self.serde, value, f"channel {channel!r}", exc) from exc

        def where() -> str:
            return f"channel {channel!r} of {what()}"

        return [
            limits.check_row(ThreadRow(BLOB, blob_key(ns, channel, v), body.pack()), where, value)
            for v, body in bodies
        ], new_latest

    def defer(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> bool:
        """Keep a task's writes for the next checkpoint's commit (or the timer's, once they
        waited DEFERRED_WRITES_DELAY) when they may wait (from any thread, no store call);
        False if they are to be committed now."""
        if not self.defer_writes or any(channel in WRITES_IDX_MAP for channel, _ in writes):
            return False
        thread_id, keep, _ = self._write_rows(config, writes, task_id, path)
        self.deferred.add(thread_id, keep)
        return True

    def _write_rows(
        self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str, path: str
    ) -> tuple[str, list[ThreadRow], list[ThreadRow]]:
        """The thread, and the rows to keep if present and to replace, of a task's writes."""
        thread_id, ns = thread_of(config), namespace_of(config)
        checkpoint_id = written_checkpoint_id(config)
        check_writes(writes, task_id, path)
        keep: list[ThreadRow] = []
        replace: list[ThreadRow] = []
        for idx, (channel, value) in enumerate(writes):
            i = WRITES_IDX_MAP.get(channel, idx)
            value_body = dumps(self.serde, value, f"channel {channel!r}")
            body = WriteBody(task_id, i, channel, value_body, path)
            row = ThreadRow(WRITE, write_key(ns, checkpoint_id, task_id, i), body.pack())
            limits.check_write(row, channel, value, task_id, thread_id)
            (replace if i < 0 else keep).append(row)
        limits.check_writes(task_id, thread_id, keep, replace)
        return thread_id, keep, replace

    @asynccontextmanager
    async def _taking(self, thread_id: str) -> AsyncIterator[list[ThreadRow]]:
        """The writes kept for ``thread_id``, to commit in the block (they are put back
        if it fails); one such block at a time per thread, so a thread's commits keep
        their order."""
        async with self.deferred.commit_lock(thread_id):
            rows = self.deferred.take(thread_id)
            try:
                yield rows
            except BaseException:
                self.deferred.put_back(thread_id, rows)
                raise

    async def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        if self.defer(config, writes, task_id, task_path):
            return
        thread_id, keep, replace = self._write_rows(config, writes, task_id, task_path)
        async with self._taking(thread_id) as pending:
            await self._apply(thread_id, ThreadChange(put=replace, put_new=keep), pending)

    async def _apply(self, thread_id: str, change: ThreadChange, pending: list[ThreadRow]) -> None:
        """Apply ``change`` with the ``pending`` writes before its own in one commit, or, when
        that is larger than a store takes, commit them first in commits of their own."""
        if not limits.fits(pending, change.put, change.put_new):
            await self._put_new(thread_id, pending)
            pending = []
        change = ThreadChange(change.put, [*pending, *change.put_new], change.delete)
        await self.store.apply_thread_change(thread_id, change, self.clock())

    async def _put_new(self, thread_id: str, writes: list[ThreadRow]) -> None:
        """Commit ``writes`` on their own, in commits a store takes."""
        for batch in limits.batches(writes):
            await self.store.apply_thread_change(
                thread_id, ThreadChange(put_new=batch), self.clock()
            )

    async def flush(self, thread_id: str | None = None) -> None:
        """Commit the writes kept for the next checkpoint (of one thread, or of all)."""
        thread_ids = self.deferred.thread_ids() if thread_id is None else [thread_id]
        for tid in thread_ids:
            await self._flush_thread(tid)

    async def flush_due(self) -> None:
        """Commit the writes that waited DEFERRED_WRITES_DELAY for their checkpoint."""
        for thread_id in self.deferred.due():
            await self._flush_thread(thread_id)

    async def _flush_thread(self, thread_id: str) -> None:
        async with self._taking(thread_id) as rows:
            await self._put_new(thread_id, rows)

    # -- reads ----------------------------------------------------------------------------

    async def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id = await thread_to_read(self.store, named_thread(config), THREAD_ID_KEY)
        ns, checkpoint_id = namespace_of(config), checkpoint_id_of(config)
        await self.flush(thread_id)
        if checkpoint_id:
            keys = [checkpoint_key(ns, checkpoint_id)]
            rows = await self.store.get_thread_rows(thread_id, CHECKPOINT, keys)
        else:
            low, high = prefix_range(ns + SEP)
            rows = await self.store.scan_thread_rows(
                thread_id, CHECKPOINT, low, high, newest_first=True, limit=1
            )
        return await self._tuple(thread_id, rows[0]) if rows else None

    async def list_checkpoints(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> list[CheckpointTuple]:
        conf = config["configurable"] if config else {}
        ns: str | None = conf.get("checkpoint_ns")
        if ns is not None:
            check_namespace(ns, NAMESPACE_KEY)
        wanted_id = checkpoint_id_of(config) if config else None
        before_id = checkpoint_id_of(before, BEFORE_ID_KEY) if before else None
        if config and conf.get("thread_id") is not None:
            thread_ids = [await thread_to_read(self.store, named_thread(config), THREAD_ID_KEY)]
            await self.flush(thread_ids[0])
        else:
            await self.flush()
            thread_ids = [info.thread_id for info in await self.store.list_threads()]
        found: list[CheckpointTuple] = []
        for thread_id in thread_ids:
            rows = await self._checkpoint_rows(thread_id, ns, before_id, limit, bool(filter))
            for row in rows:
                cid = split_key(row.key)[-1]
                if wanted_id and cid != wanted_id:
                    continue
                with naming(thread_id, *split_key(row.key)):
                    body = CheckpointBody.unpack(row.body)
                if not _matches(self.serde.loads_typed(body.metadata), filter):
                    continue
                if limit is not None and len(found) >= limit:
                    return found
                found.append(await self._tuple(thread_id, row, body))
        return found

    async def _checkpoint_rows(
        self,
        thread_id: str,
        ns: str | None,
        before_id: str | None,
        limit: int | None,
        filtered: bool,
    ) -> list[ThreadRow]:
        low, high = prefix_range("" if ns is None else ns + SEP)
        if ns is not None and before_id:
            high = checkpoint_key(ns, before_id)
        pushed = limit if ns is not None and not filtered else None
        rows = await self.store.scan_thread_rows(
            thread_id, CHECKPOINT, low, high, newest_first=True, limit=pushed
        )
        if ns is None:
            rows.sort(key=lambda row: split_key(row.key)[-1], reverse=True)
            if before_id:
                rows = [row for row in rows if split_key(row.key)[-1] < before_id]
        return rows

    async def _tuple(
        self, thread_id: str, row: ThreadRow, body: CheckpointBody | None = None
    ) -> CheckpointTuple:
        ns, checkpoint_id = split_key(row.key)
        with naming(thread_id, ns, checkpoint_id):
            body = body or CheckpointBody.unpack(row.body)
        checkpoint: dict[str, Any] = self.serde.loads_typed(body.checkpoint)
        checkpoint["channel_values"] = await self._values(thread_id, ns, checkpoint_id, body)
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=self.serde.loads_typed(body.metadata),
            parent_config=_config(thread_id, ns, body.parent_id) if body.parent_id else None,
            pending_writes=await self._writes(thread_id, ns, checkpoint_id),
        )

    async def _values(
        self, thread_id: str, ns: str, checkpoint_id: str, body: CheckpointBody
    ) -> dict[str, Any]:
        versions = body.versions
        values: dict[str, Any] = {}
        wanted: dict[str, str] = {}
        for channel, version in versions.items():
            cached = self.latest.get(thread_id, ns, channel)
            if cached is not None and cached.version == version:
                values[channel] = _copy(cached.value)
            else:
                wanted[blob_key(ns, channel, version)] = channel
        if not wanted:
            return values
        for row in await self.store.get_thread_rows(thread_id, BLOB, list(wanted)):
            channel = wanted[row.key]
            with naming(thread_id, ns, checkpoint_id, f"channel {channel!r}"):
                value = await self._value(thread_id, ns, channel, versions[channel], row)
            if value is not None:
                values[channel] = value[0]
        return values

    async def _value(
        self, thread_id: str, ns: str, channel: str, version: str, row: ThreadRow
    ) -> tuple[Any] | None:
        blob = BlobBody.unpack(row.body)
        if blob.kind == EMPTY:
            return None
        latest: Latest
        if blob.kind == DELTA:
            chain = [row]
            if blob.depth:
                low = blob_key(ns, channel, blob.anchor or "")
                chain = await self.store.scan_thread_rows(thread_id, BLOB, low, row.key + "\x01")
            low, high = prefix_range(blob_key(ns, channel, PACK))
            chain += await self.store.scan_thread_rows(thread_id, BLOB, low, high)
            value, latest = rebuild(self.serde, blob, version, chain)
        else:
            value, latest = decode_full(self.serde, blob, version)
        current = self.latest.get(thread_id, ns, channel)
        if current is None or current.version <= version:
            self.latest.set(thread_id, ns, channel, latest)
        return (value,)

    async def _writes(self, thread_id: str, ns: str, checkpoint_id: str) -> list[Any]:
        low, high = prefix_range(writes_prefix(ns, checkpoint_id))
        rows = await self.store.scan_thread_rows(thread_id, WRITE, low, high)
        bodies = []
        for row in rows:
            task_id, _, idx = row.key[len(low) :].rpartition(SEP)
            with naming(thread_id, ns, checkpoint_id, f"the write {idx} of task {task_id!r}"):
                bodies.append(WriteBody.unpack(row.body))
        bodies.sort(key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx))
        return [(w.task_id, w.channel, self.serde.loads_typed(w.value)) for w in bodies]

    # -- maintenance ----------------------------------------------------------------------

    async def delete_thread(self, thread_id: Any) -> None:
        thread_id = str(thread_id)  # any id: a thread an older version wrote goes too
        self.forget(thread_id)
        async with self.deferred.commit_lock(thread_id):
            self.deferred.take(thread_id)
            stored = await self.stored_ids([thread_id])
            if stored:
                await self.store.delete_threads(stored)

    async def stored_ids(self, thread_ids: Sequence[str]) -> list[str]:
        """Those thread ids, less each holding a character some store cannot take (a NUL, a
        lone surrogate) that this store does not hold: only an older version wrote such a
        thread, and asking a store that cannot hold one for it fails."""
        if all(unstorable_character(thread_id) is None for thread_id in thread_ids):
            return list(thread_ids)
        held = {info.thread_id for info in await self.store.list_threads()}
        return [t for t in thread_ids if t in held or unstorable_character(t) is None]

    async def copy_thread(self, source_id: Any, target_id: Any) -> None:
        source_id = await thread_to_read(
            self.store, str(source_id), "copy_thread's source_thread_id"
        )
        target_id = check_thread_id(str(target_id), "copy_thread's target_thread_id")
        await self.flush()
        self.forget(target_id)
        await self.store.copy_thread(source_id, target_id, self.clock())

    async def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = set(run_ids)
        if not wanted:
            return
        await self.flush()
        for info in await self.store.list_threads():
            low, high = prefix_range("")
            rows = await self.store.scan_thread_rows(info.thread_id, CHECKPOINT, low, high)
            doomed = [r.key for r in rows if _run_of(r) in wanted]
            if doomed:
                await self.drop_checkpoints(info.thread_id, doomed)

    async def drop_checkpoints(self, thread_id: str, keys: Sequence[str]) -> None:
        """Delete those checkpoints (by row key) with their writes, then the channel values
        no remaining checkpoint needs."""
        by_ns: dict[str, list[str]] = {}
        for key in keys:
            ns, cid = split_key(key)
            by_ns.setdefault(ns, []).append(cid)
        delete: list[tuple[str, str, str]] = []
        for ns, ids in by_ns.items():
            delete.extend(_checkpoint_rows(ns, ids))
        await self.store.apply_thread_change(thread_id, ThreadChange(delete=delete), self.clock())
        self.forget(thread_id)
        await self.retention.collect(self, thread_id)

    def forget(self, thread_id: str) -> None:
        self.latest.forget(thread_id)
        self.retention.forget(thread_id)


def _run_of(row: ThreadRow) -> str | None:
    """The run of a checkpoint row; None for a damaged one (whose run cannot be told: it
    stays)."""
    try:
        return CheckpointBody.unpack(row.body).run_id
    except CheckpointCorruptedError:
        return None


def _checkpoint_rows(ns: str, checkpoint_ids: Sequence[str]) -> list[tuple[str, str, str]]:
    """(kind, low, high) ranges covering those checkpoints and their writes."""
    ranges: list[tuple[str, str, str]] = []
    for cid in checkpoint_ids:
        key = checkpoint_key(ns, cid)
        ranges.append((CHECKPOINT, key, key + "\x01"))
        ranges.append((WRITE, *prefix_range(writes_prefix(ns, cid))))
    return ranges


def _copy(value: Any) -> Any:
    return list(value) if type(value) is list else value
