"""Linear storage of channel values: a list that grows is stored as the items it gained.

When a channel's new value is a list whose first items are (the same objects as, or equal
to) the whole previous value of that channel, only the new items are stored, with a
pointer to the previous version; every ``full_every`` versions (and whenever the value is
anything else) a full copy starts a new chain. A read fetches the chain (one range scan,
from its full copy to the version read) and rebuilds the list, so a read needs a bounded
number of pieces.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from nestegg.checkpoint.stores.threads import ThreadRow
from nestegg.errors import CheckpointCorruptedError
from nestegg.langgraph.rows import DELTA, EMPTY, FULL, BlobBody, split_key

DEFAULT_FULL_EVERY = 64
"""Versions of a channel between two full copies."""
CACHED_THREADS = 1024
"""Threads whose latest channel values a saver remembers (the oldest forgotten first)."""


@dataclass(slots=True)
class Latest:
    """The newest stored version of one channel of one thread namespace."""

    version: str
    value: Any
    anchor: str
    depth: int


def extends(previous: Any, value: Any) -> bool:
    """True if ``value`` is a list whose first items are those of the list ``previous``."""
    if type(previous) is not list or type(value) is not list or len(value) < len(previous):
        return False
    head = value[: len(previous)]
    if all(map(operator.is_, head, previous)):
        return True
    return all(a is b or a == b for a, b in zip(head, previous, strict=True))


class LatestValues:
    """Remembers, per (thread, namespace, channel), the newest version this saver wrote or
    read, so the next version can be stored as a delta without a read."""

    def __init__(self, threads: int = CACHED_THREADS) -> None:
        self._threads: OrderedDict[str, dict[tuple[str, str], Latest]] = OrderedDict()
        self._limit = threads

    def get(self, thread_id: str, ns: str, channel: str) -> Latest | None:
        entries = self._threads.get(thread_id)
        return None if entries is None else entries.get((ns, channel))

    def set(self, thread_id: str, ns: str, channel: str, latest: Latest) -> None:
        entries = self._threads.get(thread_id)
        if entries is None:
            entries = self._threads[thread_id] = {}
            if len(self._threads) > self._limit:
                self._threads.popitem(last=False)
        else:
            self._threads.move_to_end(thread_id)
        entries[(ns, channel)] = latest

    def forget(self, thread_id: str) -> None:
        self._threads.pop(thread_id, None)


def encode_value(
    serde: SerializerProtocol,
    latest: Latest | None,
    version: str,
    value: Any,
    full_every: int,
) -> tuple[BlobBody, Latest]:
    """The blob to store for ``value`` at ``version`` and the new latest entry."""
    items = len(value) if type(value) is list else 0
    if latest is not None and latest.depth + 1 < full_every and extends(latest.value, value):
        new_items = value[len(latest.value) :]
        body = BlobBody(
            DELTA,
            serde.dumps_typed(new_items),
            base=latest.version,
            anchor=latest.anchor,
            depth=latest.depth + 1,
            items=items,
        )
        return body, Latest(version, list(value), latest.anchor, latest.depth + 1)
    body = BlobBody(FULL, serde.dumps_typed(value), anchor=version, items=items)
    return body, Latest(version, list(value) if items else value, version, 0)


def empty_blob() -> BlobBody:
    return BlobBody(EMPTY, ("empty", b""))


def rebuild(
    serde: SerializerProtocol, target: BlobBody, version: str, chain_rows: Sequence[ThreadRow]
) -> tuple[Any, Latest]:
    """The value of a delta ``target`` from the rows of its channel between its anchor and
    it (``chain_rows``, which may hold other branches too)."""
    by_version = {split_key(row.key)[-1]: BlobBody.unpack(row.body) for row in chain_rows}
    pieces: list[BlobBody] = [target]
    current = target
    while current.kind == DELTA:
        base = by_version.get(current.base or "")
        if base is None:
            raise CheckpointCorruptedError(
                f"the channel value at version {version} misses its earlier piece "
                f"{current.base}: it was deleted while a later checkpoint needed it"
            )
        pieces.append(base)
        current = base
    value = list(serde.loads_typed(current.value))
    for piece in reversed(pieces[:-1]):
        value.extend(serde.loads_typed(piece.value))
    return value, Latest(version, list(value), target.anchor or version, target.depth)


def decode_full(serde: SerializerProtocol, body: BlobBody, version: str) -> tuple[Any, Latest]:
    value = serde.loads_typed(body.value)
    return value, Latest(version, list(value) if type(value) is list else value, version, 0)
