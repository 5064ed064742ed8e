"""Damaged LangGraph rows: where one was read (the thread, namespace, checkpoint and
channel a CheckpointCorruptedError from a row's decoding names), which checkpoints of a
thread rest on one, and how many a thread holds."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from nestegg.checkpoint.stores.threads import BLOB, CHECKPOINT, WRITE, ThreadRow, ThreadStore
from nestegg.errors import CheckpointCorruptedError
from nestegg.langgraph.rows import (
    DELTA,
    BlobBody,
    CheckpointBody,
    WriteBody,
    blob_key,
    chain_keys,
    checkpoint_key,
    prefix_range,
    split_key,
)


def place(thread_id: str, ns: str, checkpoint_id: str, part: str = "") -> str:
    """``LangGraph thread 't1', namespace 'sub', checkpoint '1f0...', channel 'items'``."""
    where = f"LangGraph thread {thread_id!r}"
    where += f", namespace {ns!r}" if ns else ""
    where += f", checkpoint {checkpoint_id!r}"
    return where + (f", {part}" if part else "")


@contextmanager
def naming(thread_id: str, ns: str, checkpoint_id: str, part: str = "") -> Iterator[None]:
    """Raise a CheckpointCorruptedError of the block again with :func:`place` before its
    message."""
    try:
        yield
    except CheckpointCorruptedError as exc:
        where = place(thread_id, ns, checkpoint_id, part)
        raise CheckpointCorruptedError(f"{where}: {exc}") from exc


async def damaged_rows(store: ThreadStore, thread_id: str) -> int:
    """How many rows of the thread (checkpoints, channel values, pending writes) cannot be
    read."""
    unpacks = {CHECKPOINT: CheckpointBody.unpack, BLOB: BlobBody.unpack, WRITE: WriteBody.unpack}
    count = 0
    for kind, unpack in unpacks.items():
        for row in await store.scan_thread_rows(thread_id, kind, *prefix_range("")):
            try:
                unpack(row.body)
            except CheckpointCorruptedError:
                count += 1
    return count


def decode_values(rows: Sequence[ThreadRow]) -> tuple[dict[str, BlobBody], dict[str, str]]:
    """The channel value ``rows`` decoded, by key, and those that cannot be, by key, with
    why."""
    blobs: dict[str, BlobBody] = {}
    bad: dict[str, str] = {}
    for row in rows:
        try:
            blobs[row.key] = BlobBody.unpack(row.body)
        except CheckpointCorruptedError as exc:
            bad[row.key] = str(exc)
    return blobs, bad


async def damaged_checkpoints(
    store: ThreadStore, thread_id: str, checkpoints: Sequence[ThreadRow]
) -> dict[str, str]:
    """Checkpoint row key -> why it cannot be read, for each of ``checkpoints`` (rows of
    the thread) whose row, a channel value row a read of it decodes, or a pending write's
    row is damaged; each row of the thread is decoded once, without the graph's serializer.
    """
    blobs, bad = decode_values(await store.scan_thread_rows(thread_id, BLOB, *prefix_range("")))
    bad_writes: dict[str, str] = {}
    for row in await store.scan_thread_rows(thread_id, WRITE, *prefix_range("")):
        try:
            WriteBody.unpack(row.body)
        except CheckpointCorruptedError as exc:
            ns, checkpoint_id, *_ = split_key(row.key)
            bad_writes.setdefault(checkpoint_key(ns, checkpoint_id), f"a pending write: {exc}")
    damaged: dict[str, str] = {}
    for row in checkpoints:
        ns, checkpoint_id = split_key(row.key)
        try:
            body = CheckpointBody.unpack(row.body)
        except CheckpointCorruptedError as exc:
            damaged[row.key] = f"{place(thread_id, ns, checkpoint_id)}: {exc}"
            continue
        why = _channel_damage(ns, body, blobs, bad) or bad_writes.get(row.key)
        if why is not None:
            damaged[row.key] = place(thread_id, ns, checkpoint_id) + f", {why}"
    return damaged


def _channel_damage(
    ns: str, body: CheckpointBody, blobs: dict[str, BlobBody], bad: dict[str, str]
) -> str | None:
    """Why a channel value of ``body`` cannot be read: a damaged row on the chain its read
    decodes (its own; for a delta, its deltas back to its pack and the packs before that
    one), followed as :func:`nestegg.langgraph.linear.rebuild` follows it; a damaged row of
    another branch, or a later pack, is no reason."""
    if not bad:
        return None
    for channel, version in body.versions.items():
        key = blob_key(ns, channel, version)
        blob = blobs.get(key)
        read = chain_keys(blobs, key) if blob is not None and blob.kind == DELTA else [key]
        if (damaged := next((k for k in read if k in bad), None)) is not None:
            return f"channel {channel!r}: {bad[damaged]}"
    return None
