"""The one owner of how LangGraph checkpoints are laid out in thread rows.

Keys (``SEP`` joins the parts; namespaces, checkpoint ids, channels and versions never
hold it, as reads split keys at it; a task id may, being followed by the index alone):

- checkpoint: ``ns SEP checkpoint_id`` (uuid6 ids sort by time)
- blob: ``ns SEP channel SEP version`` (one value of one channel at one version)
- write: ``ns SEP checkpoint_id SEP task_id SEP idx`` (a pending write)

Bodies are msgpack maps; the values in them (checkpoint, metadata, channel values,
writes) are serialized by the graph's serializer, as ``(type, bytes)``. A body is written
sealed: ``SEALED`` (0xC1, a byte msgpack never uses, so no map starts with it), the CRC-32
of the map (4 bytes, big-endian), the map; a read checks it, so an altered row is refused,
never read as data. A body without the mark (written before rows were sealed) is read as
it is.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import ormsgpack

from nestegg.checkpoint.stores.threads import KEY_END
from nestegg.errors import CheckpointCorruptedError, InvalidIdentifierError
from nestegg.identifiers import unstorable_character

SEP = "\x1f"
SEALED = b"\xc1"
"""The first byte of a sealed body (msgpack never uses it)."""
SEAL_BYTES = 5
"""The mark and the CRC-32 before a sealed body's map."""
Typed = tuple[str, bytes]

FULL = "full"
DELTA = "delta"
PACK = "pack"
EMPTY = "empty"


def check_key_part(text: str, where: str, what: str, *, separated: bool = True) -> str:
    """``text`` if a row key (or body) can hold it: no NUL or lone surrogate (no store
    keeps them) and, when ``separated`` (a part a read splits the key at), no ``SEP``;
    InvalidIdentifierError naming ``where``, ``text`` and the character otherwise."""
    wrong = unstorable_character(text)
    if wrong is None and separated and SEP in text:
        wrong = f"U+001F at index {text.index(SEP)}, the separator of the parts of a row key"
    if wrong is not None:
        raise InvalidIdentifierError(
            f"{where} {text!r} holds {wrong}: no store can keep that {what}"
        )
    return text


def check_checkpoint_id(checkpoint_id: str, where: str) -> str:
    """``checkpoint_id`` if a checkpoint (or its writes) can be stored under it: not empty
    (LangGraph's savers read an empty id as none, the thread's newest, so no read could
    name it) and :func:`check_key_part`."""
    if not checkpoint_id:
        raise InvalidIdentifierError(
            f"{where} is empty: a checkpoint needs a non-empty id (an empty one names none)"
        )
    return check_key_part(checkpoint_id, where, "checkpoint id")


def check_namespace(ns: str, where: str) -> str:
    """``ns`` if its rows can be stored (:func:`check_key_part`)."""
    return check_key_part(ns, where, "checkpoint namespace")


def checkpoint_key(ns: str, checkpoint_id: str) -> str:
    return f"{ns}{SEP}{checkpoint_id}"


def blob_key(ns: str, channel: str, version: str | int | float) -> str:
    return f"{ns}{SEP}{channel}{SEP}{version}"


def write_key(ns: str, checkpoint_id: str, task_id: str, idx: int) -> str:
    return f"{ns}{SEP}{checkpoint_id}{SEP}{task_id}{SEP}{idx}"


def writes_prefix(ns: str, checkpoint_id: str) -> str:
    return f"{ns}{SEP}{checkpoint_id}{SEP}"


def prefix_range(prefix: str) -> tuple[str, str]:
    """The (low, high) of a scan of every key starting with ``prefix``."""
    return prefix, prefix + KEY_END


def split_key(key: str) -> list[str]:
    return key.split(SEP)


def _pack(body: dict[str, Any]) -> bytes:
    packed = ormsgpack.packb(body)
    return SEALED + zlib.crc32(packed).to_bytes(4, "big") + packed


def _unsealed(body: bytes, what: str) -> bytes | memoryview:
    """The map of a sealed ``body`` once its CRC-32 matches (a body written before rows
    were sealed as it is); CheckpointCorruptedError naming ``what`` otherwise."""
    if body[:1] != SEALED:
        return body
    packed = memoryview(body)[SEAL_BYTES:]
    stored, computed = int.from_bytes(body[1:SEAL_BYTES], "big"), zlib.crc32(packed)
    if len(body) < SEAL_BYTES or stored != computed:
        raise CheckpointCorruptedError(
            f"the LangGraph {what} row fails its checksum (stored {stored:08x}, computed "
            f"{computed:08x}): it was altered or torn"
        )
    return packed


def _unpack(body: bytes, what: str) -> dict[str, Any]:
    try:
        value = ormsgpack.unpackb(_unsealed(body, what))
    except ormsgpack.MsgpackDecodeError as exc:
        raise CheckpointCorruptedError(f"the LangGraph {what} row cannot be read: {exc}") from exc
    if not isinstance(value, dict):
        raise CheckpointCorruptedError(f"the LangGraph {what} row is not a map")
    return value


@dataclass(frozen=True, slots=True)
class CheckpointBody:
    """A stored checkpoint: the checkpoint without its values, its metadata, its parent."""

    checkpoint: Typed
    metadata: Typed
    parent_id: str | None
    run_id: str | None
    versions: dict[str, str]
    """channel -> version (as stored in blob keys) of every value the checkpoint has."""

    def pack(self) -> bytes:
        return _pack(
            {
                "c": list(self.checkpoint),
                "m": list(self.metadata),
                "p": self.parent_id,
                "r": self.run_id,
                "v": self.versions,
            }
        )

    @classmethod
    def unpack(cls, body: bytes) -> CheckpointBody:
        m = _unpack(body, "checkpoint")
        return cls(
            checkpoint=(m["c"][0], m["c"][1]),
            metadata=(m["m"][0], m["m"][1]),
            parent_id=m.get("p"),
            run_id=m.get("r"),
            versions=dict(m.get("v") or {}),
        )


@dataclass(frozen=True, slots=True)
class BlobBody:
    """One channel value: stored whole (full), the items appended to the value at the row
    version ``base`` (a delta), the items of several deltas (a pack, see
    :mod:`nestegg.langgraph.linear`), or empty.

    ``anchor``: the version the delta chain starts at; ``depth``: how many deltas lie
    between it and this one; ``items``: the list's length at this version (or, for a
    pack, at its end).
    """

    kind: str
    value: Typed
    base: str | None = None
    anchor: str | None = None
    depth: int = 0
    items: int = 0

    def pack(self) -> bytes:
        return _pack(
            {
                "k": self.kind,
                "t": self.value[0],
                "d": self.value[1],
                "b": self.base,
                "a": self.anchor,
                "n": self.depth,
                "i": self.items,
            }
        )

    @classmethod
    def unpack(cls, body: bytes) -> BlobBody:
        m = _unpack(body, "channel value")
        return cls(m["k"], (m["t"], m["d"]), m.get("b"), m.get("a"), m.get("n", 0), m.get("i", 0))


@dataclass(frozen=True, slots=True)
class WriteBody:
    """One pending write of a task."""

    task_id: str
    idx: int
    channel: str
    value: Typed
    task_path: str

    def pack(self) -> bytes:
        return _pack(
            {
                "task": self.task_id,
                "i": self.idx,
                "ch": self.channel,
                "t": self.value[0],
                "d": self.value[1],
                "path": self.task_path,
            }
        )

    @classmethod
    def unpack(cls, body: bytes) -> WriteBody:
        m = _unpack(body, "write")
        return cls(m["task"], m["i"], m["ch"], (m["t"], m["d"]), m.get("path", ""))


def chain_keys(blobs: Mapping[str, BlobBody], key: str) -> Iterator[str]:
    """``key``, then the keys of the rows its value rests on, each piece's ``base`` in
    turn (a delta's back to its pack, then the packs before that one), as far as
    ``blobs``, rows decoded already, holds them: the chain
    :func:`nestegg.langgraph.linear.rebuild` reads."""
    ns, channel, _ = split_key(key)
    while True:
        yield key
        blob = blobs.get(key)
        if blob is None or blob.base is None:
            return
        key = blob_key(ns, channel, blob.base)
