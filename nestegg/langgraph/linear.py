"""Linear storage of channel values: a list that grows is stored as the items it gained.

When a channel's new value is a list whose first items are (the same objects as, or equal
to) the whole previous value of that channel, only the new items are stored (a *delta*,
pointing at the previous version). Every ``pack_every`` versions the items of the deltas
since the last *pack* are written once more, together, as a new pack pointing at the
previous one, and the version's own row is an empty delta on that pack. A list that does
not extend the previous value starts a new chain with a pack holding all of it. Each item
is so stored about twice whatever the length of the thread (linear storage), and a value
is rebuilt from at most ``pack_every`` deltas plus the packs of its chain, read in two
range scans. Any other value is stored whole.

Pack rows sit beside the versions of their channel, under the version ``PACK`` + the
version that wrote them (so the packs of a channel are one key range).
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
from nestegg.langgraph.rows import DELTA, EMPTY, FULL, PACK, BlobBody, split_key

DEFAULT_PACK_EVERY = 64
"""Versions of a channel between two packs (the most deltas a read combines)."""
CACHED_THREADS = 1024
"""Threads whose latest channel values a saver remembers (the oldest forgotten first)."""


@dataclass(slots=True)
class Latest:
    """The newest stored version of one channel of one thread namespace.

    ``anchor``: the version the chain of deltas starts at (a pack was written with it);
    ``depth``: deltas since then; ``pack``: the newest pack's row version (None for a
    value stored whole); ``packed``: how many items the packs hold.
    """

    version: str
    value: Any
    anchor: str
    depth: int
    pack: str | None = None
    packed: int = 0


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
    serde: SerializerProtocol, latest: Latest | None, version: str, value: Any, pack_every: int
) -> tuple[list[tuple[str, BlobBody]], Latest]:
    """The rows (row version, body) to store for ``value`` at ``version``, and the new
    latest entry."""
    if type(value) is not list:
        return [(version, BlobBody(FULL, serde.dumps_typed(value)))], Latest(
            version, value, version, 0
        )
    items = len(value)
    if latest is not None and latest.pack is not None and extends(latest.value, value):
        new_items = value[len(latest.value) :]
        if latest.depth + 1 < pack_every:
            body = BlobBody(
                DELTA,
                serde.dumps_typed(new_items),
                latest.version,
                latest.anchor,
                latest.depth + 1,
                items,
            )
            new = Latest(
                version, list(value), latest.anchor, latest.depth + 1, latest.pack, latest.packed
            )
            return [(version, body)], new
        tail = value[latest.packed :]
        return _packed(serde, version, value, tail, latest.pack)
    return _packed(serde, version, value, value, None)


def _packed(
    serde: SerializerProtocol, version: str, value: list[Any], tail: list[Any], previous: str | None
) -> tuple[list[tuple[str, BlobBody]], Latest]:
    pack = PACK + version
    items = len(value)
    pack_body = BlobBody(PACK, serde.dumps_typed(tail), previous, None, 0, items)
    ref = BlobBody(DELTA, serde.dumps_typed([]), pack, version, 0, items)
    return [(pack, pack_body), (version, ref)], Latest(
        version, list(value), version, 0, pack, items
    )


def empty_blob() -> BlobBody:
    return BlobBody(EMPTY, ("empty", b""))


def rebuild(
    serde: SerializerProtocol,
    target: BlobBody,
    version: str,
    rows: Sequence[ThreadRow],
) -> tuple[Any, Latest]:
    """The value of a delta ``target`` from ``rows`` of its channel, which hold its chain
    (its deltas back to its pack, and the packs before that one) among others.

    Only the rows of the chain are decoded (and so checked), each once: ``rows`` also holds
    other branches' deltas and later packs, and a damaged one of those must not refuse a
    checkpoint that does not rest on it.
    """
    bodies = {split_key(row.key)[-1]: row.body for row in rows}
    pieces: list[BlobBody] = [target]
    current, pack, packed = target, None, 0
    while current.base is not None:
        body = bodies.get(current.base)
        if body is None:
            raise CheckpointCorruptedError(
                f"the channel value at version {version} misses its earlier piece "
                f"{current.base}: it was deleted while a later checkpoint needed it"
            )
        base = BlobBody.unpack(body)
        if pack is None and base.kind == PACK:
            pack, packed = current.base, base.items
        pieces.append(base)
        current = base
    value: list[Any] = []
    for piece in reversed(pieces):
        value.extend(serde.loads_typed(piece.value))
    latest = Latest(version, list(value), target.anchor or version, target.depth, pack, packed)
    return value, latest


def decode_full(serde: SerializerProtocol, body: BlobBody, version: str) -> tuple[Any, Latest]:
    value = serde.loads_typed(body.value)
    return value, Latest(version, value, version, 0)
