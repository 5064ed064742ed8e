"""What the ``nestegg`` command shows of LangGraph threads: summaries and checkpoints,
read from a store without a graph (metadata decoded with LangGraph's default serializer)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from nestegg.checkpoint.stores.threads import CHECKPOINT, ThreadStore
from nestegg.errors import CheckpointCorruptedError
from nestegg.langgraph.damage import damaged_checkpoints
from nestegg.langgraph.retention import superseded_keys
from nestegg.langgraph.rows import CheckpointBody, prefix_range, split_key


def _time(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


async def thread_summaries(store: ThreadStore) -> list[dict[str, Any]]:
    """Every thread, most recently written first: id, checkpoints, namespaces, last write,
    and how many of its checkpoints a prune to the latest of each namespace drops
    (``superseded``)."""
    summaries = []
    for info in await store.list_threads():
        rows = await store.scan_thread_rows(info.thread_id, CHECKPOINT, *prefix_range(""))
        namespaces = sorted({split_key(row.key)[0] for row in rows})
        latest = max((split_key(row.key)[1] for row in rows), default=None)
        summaries.append(
            {
                "thread_id": info.thread_id,
                "checkpoints": len(rows),
                "namespaces": namespaces,
                "latest_checkpoint": latest,
                "updated_at": _time(info.updated_at),
                "superseded": len(superseded_keys(rows)),
            }
        )
    return summaries


def _metadata(serde: JsonPlusSerializer, body: CheckpointBody) -> dict[str, Any] | None:
    """The checkpoint's metadata; None when a serializer of the graph's own wrote it (an
    ``EncryptedSerializer``, say), which LangGraph's default one cannot read."""
    try:
        metadata: dict[str, Any] = serde.loads_typed(body.metadata)
    except NotImplementedError:  # JsonPlusSerializer's word for a type it does not know
        return None
    return metadata


async def thread_checkpoints(store: ThreadStore, thread_id: str) -> list[dict[str, Any]]:
    """A thread's checkpoints, newest first, with their metadata (None where it is in a
    format only the graph's own serializer reads: ``metadata_type`` names it); ``valid``
    False and ``damage`` saying why for one whose row, or a row a read of it decodes, is
    damaged."""
    serde = JsonPlusSerializer()
    rows = await store.scan_thread_rows(thread_id, CHECKPOINT, *prefix_range(""))
    damaged = await damaged_checkpoints(store, thread_id, rows)
    found: list[dict[str, Any]] = []
    for row in rows:
        ns, checkpoint_id = split_key(row.key)
        try:
            body = CheckpointBody.unpack(row.body)
        except CheckpointCorruptedError:  # damaged_checkpoints says why
            found.append(_damaged(ns, checkpoint_id, damaged[row.key]))
            continue
        metadata = _metadata(serde, body)
        found.append(
            {
                "checkpoint_id": checkpoint_id,
                "checkpoint_ns": ns,
                "parent_id": body.parent_id,
                "step": None if metadata is None else metadata.get("step"),
                "source": None if metadata is None else metadata.get("source"),
                "run_id": body.run_id,
                "channels": sorted(body.versions),
                "metadata": metadata,
                "metadata_type": body.metadata[0],
                "valid": row.key not in damaged,
                "damage": damaged.get(row.key),
            }
        )
    found.sort(key=lambda c: c["checkpoint_id"], reverse=True)
    return found


def _damaged(ns: str, checkpoint_id: str, why: str) -> dict[str, Any]:
    """A checkpoint whose own row is damaged: its id and namespace, nothing else known."""
    return {
        "checkpoint_id": checkpoint_id,
        "checkpoint_ns": ns,
        "parent_id": None,
        "step": None,
        "source": None,
        "run_id": None,
        "channels": [],
        "metadata": None,
        "metadata_type": None,
        "valid": False,
        "damage": why,
    }
