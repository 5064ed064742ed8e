"""How the SQLite store keeps a run's event log: one row per commit, not per event.

A step's commit appends three or four events; writing them as one row (a *batch*) instead
of one row each takes a fifth off the cost of the commit. A batch is keyed by the run and
the sequence number of its last event, so the events after a given one are the batches
with a larger ``last_seq``.

A batch body is a format byte, then per event a fixed header (seq: int64, at: float64,
length of kind: uint16, length of body: uint32, little-endian), the kind in UTF-8 and the
event's sealed body, unchanged (it keeps its own checksum).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from nestegg.checkpoint.records import EventRecord
from nestegg.errors import CheckpointCorruptedError

BATCH_FORMAT = b"\x01"
_HEADER = struct.Struct("<qdHI")


def pack_events(events: Sequence[EventRecord]) -> bytes:
    """The batch body holding ``events``, in order."""
    parts = [BATCH_FORMAT]
    for event in events:
        kind = event.kind.encode()
        parts.append(_HEADER.pack(event.seq, event.at, len(kind), len(event.body)))
        parts.append(kind)
        parts.append(event.body)
    return b"".join(parts)


def unpack_events(run_id: str, batch: bytes) -> Iterator[EventRecord]:
    """The events of a batch body, in order.

    Raises:
        CheckpointCorruptedError: the batch is torn or not one this store wrote.
    """
    if batch[:1] != BATCH_FORMAT or len(batch) == 1:  # never written without events
        raise _damaged(run_id)
    at, end = 1, len(batch)
    while at < end:
        if end - at < _HEADER.size:
            raise _damaged(run_id)
        seq, when, kind_length, body_length = _HEADER.unpack_from(batch, at)
        at += _HEADER.size
        body_at = at + kind_length
        if body_at + body_length > end:
            raise _damaged(run_id)
        try:
            kind = batch[at:body_at].decode()
        except UnicodeDecodeError:
            raise _damaged(run_id) from None
        yield EventRecord(run_id, seq, when, kind, batch[body_at : body_at + body_length])
        at = body_at + body_length


def events_after(
    run_id: str, batches: Iterable[bytes], since_seq: int, limit: int | None
) -> list[EventRecord]:
    """The events after ``since_seq`` in batches read in order, at most ``limit`` of them."""
    found: list[EventRecord] = []
    if limit is not None and limit <= 0:
        return found
    for batch in batches:
        for event in unpack_events(run_id, batch):
            if event.seq > since_seq:
                found.append(event)
                if limit is not None and len(found) >= limit:
                    return found
    return found


def _damaged(run_id: str) -> CheckpointCorruptedError:
    return CheckpointCorruptedError(f"the event log of run {run_id!r} is damaged (a torn batch)")


__all__ = ["pack_events", "unpack_events", "events_after"]
