"""The step record formats: the one module that writes and reads a step record's body and a
step block's head, and the fast paths that find a step's data in them by byte offset.

- **step record**: ``{"agent":…,"outcome":"…","target":…,"started":…,"duration":…}``, with
  ``,"data":<json>`` last when the step produced data, sealed by
  :func:`~nestegg.checkpoint.codec.seal`. Readers find the data by its key without parsing
  the record (:data:`DATA_KEY`); a body of another shape is parsed in full.
- **step block head**: ``{"seq","agents","ends","data","crc"}``: the first step's seq, each
  record's agent, where it ends in the block's body and where its :data:`DATA_KEY` is (-1:
  no data), and the body's CRC-32 (8 hex digits).

Stored data depends on these layouts byte for byte (tests/checkpoint/test_formats.py pins
them). The other records' bodies are :mod:`~nestegg.checkpoint.formats`'.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from itertools import compress, repeat
from operator import add, ge, le, lt, methodcaller, sub
from typing import Any, NamedTuple

import orjson

from nestegg.checkpoint.codec import SEALED_BODY_AT, seal, unseal, unseal_json
from nestegg.errors import CheckpointCorruptedError

STEP_BODY_HEAD = b'{"agent":'
DATA_KEY = b',"data":'
"""How a step record's body starts, and the key of its data, written last (``,"data":``
cannot occur inside the JSON strings before it, where a quote is escaped)."""
DATA_STOP = -2
"""A sealed step record ends with the data, the body's brace and the seal's."""

in_step_layout = methodcaller("startswith", STEP_BODY_HEAD, SEALED_BODY_AT)
"""Whether a sealed body is a step record in this module's layout (its data found by key)."""


# ----------------------------------------------------------------- step records


def step_body(
    agent: str,
    outcome: str,
    target: str | None,
    started: float,
    duration: float,
    data: bytes | None,
) -> bytes:
    """The sealed body of a step record; ``data`` is the step's output as JSON (None: the
    step produced none)."""
    head = b'{"agent":%s,"outcome":"%s","target":%s,"started":%s,"duration":%s' % (
        orjson.dumps(agent),
        outcome.encode(),
        orjson.dumps(target),
        float_text(started),
        float_text(duration),
    )
    return seal(head + (b',"data":%s}' % data if data is not None else b"}"))


def float_text(value: float) -> bytes:
    """``repr(value)`` as bytes, how a step record writes its times: orjson writes the same
    digits in a third of the time where both write a plain decimal (1e-4 <= |value| <
    1e16: a timestamp, a duration of 100 µs or more); repr elsewhere (exponents, zero, nan).
    """
    if 1e-4 <= abs(value) < 1e16:
        return orjson.dumps(value)
    return b"%r" % value


def step_data(raw: bytes, where: str) -> bytes | None:
    """The JSON of the data an unsealed step record holds, without decoding it; None if
    none. A body of another shape than :func:`step_body` writes is parsed in full.

    Raises:
        CheckpointCorruptedError: the body is not a step record.
    """
    if raw.startswith(STEP_BODY_HEAD):
        at = raw.find(DATA_KEY)
        return None if at < 0 else raw[at + len(DATA_KEY) : -1]
    step = _json_object(raw, where, "a step record")
    return orjson.dumps(step["data"]) if "data" in step else None


def parse_step(sealed: bytes, where: str) -> dict[str, Any]:
    """A sealed step record's fields (``agent``, ``outcome``, ``target``, ``started``,
    ``duration`` and ``data`` when it holds data).

    Raises:
        CheckpointCorruptedError: damaged, or not a step record.
    """
    return _json_object(unseal(sealed, where), where, "a step record")


def step_facts(sealed: bytes, where: str) -> dict[str, Any]:
    """A sealed step record's fields but its data (not parsed: cut off when the record is in
    this module's layout).

    Raises:
        CheckpointCorruptedError: damaged, or not a step record.
    """
    raw = unseal(sealed, where)
    at = raw.find(DATA_KEY) if raw.startswith(STEP_BODY_HEAD) else -1
    step = _json_object(raw[:at] + b"}" if at >= 0 else raw, where, "a step record")
    step.pop("data", None)
    return step


def step_with_data(sealed: bytes, data: bytes, where: str) -> bytes:
    """A sealed step record like ``sealed`` but holding ``data`` (JSON) as its data.

    Raises:
        CheckpointCorruptedError: damaged, or not a step record.
    """
    body = parse_step(sealed, where)
    body.pop("data", None)
    head = orjson.dumps(body)[:-1] + (b"," if body else b"")
    return seal(head + b'"data":%s}' % data)


def data_offsets(bodies: list[bytes]) -> list[int] | None:
    """Where :data:`DATA_KEY` is in each sealed step record (-1: no data), or None when a
    body is not in this module's layout (then read them one by one). Runs in C over all
    of them (``map``): the hot part of a resume."""
    if not all(map(in_step_layout, bodies)):
        return None
    return list(map(bytes.find, bodies, repeat(DATA_KEY), repeat(SEALED_BODY_AT)))


HistoryEntry = tuple[int, str, bytes, int, int | None]
"""``(seq, agent, raw, start, stop)`` of a stored step: its data as JSON is
``raw[start:stop]`` (``raw`` is the step's sealed record, or the data JSON itself)."""


def data_entries(
    seqs: Iterable[int],
    agents: Iterable[str],
    raws: Iterable[bytes],
    found: list[int],
    stops: Iterable[int],
) -> list[HistoryEntry]:
    """History entries ``(seq, agent, raw, start, stop)`` from where :data:`DATA_KEY` was
    found in each record (``raw[start:stop]`` is its data JSON); records without it
    (hand-overs, no data) are no history entries."""
    starts = map(add, found, repeat(len(DATA_KEY)))
    entries = zip(seqs, agents, raws, starts, stops, strict=False)  # some are repeat()s
    if -1 in found:
        return list(compress(entries, map(ge, found, repeat(0))))
    return list(entries)


def record_entries(
    seqs: Iterable[int], agents: Iterable[str], bodies: list[bytes]
) -> list[HistoryEntry] | None:
    """The history entries of intact sealed step records, their data found in place; None
    when a record is not in this module's layout (then read them one by one)."""
    found = data_offsets(bodies)
    if found is None:
        return None
    return data_entries(seqs, agents, bodies, found, repeat(DATA_STOP))


# ------------------------------------------------------------------ step blocks


class BlockHead(NamedTuple):
    """What a block's head says: for each record its agent, where it ends in the body and
    where its :data:`DATA_KEY` is (-1: no data), and the body's checksum (8 hex digits)."""

    agents: list[str]
    ends: list[int]
    data_keys: list[int]
    checksum: str


def block_checksum(body: bytes) -> str:
    """The checksum of a block's body, as its head keeps it."""
    return f"{zlib.crc32(body):08x}"


def block_head_body(
    first_seq: int, agents: list[str], body: bytes, ends: list[int]
) -> bytes | None:
    """The sealed head of a block of sealed step records laid end to end in ``body`` (ending
    at ``ends``), the first being step ``first_seq``; None when a record is not in this
    module's layout (a block never holds such a record)."""
    data_keys = block_data_keys(body, ends)
    if data_keys is None:
        return None
    head = {
        "seq": first_seq,
        "agents": agents,
        "ends": ends,
        "data": data_keys,
        "crc": block_checksum(body),
    }
    return seal(orjson.dumps(head))


def parse_block_head(
    sealed: bytes, where: str, first_seq: int, count: int, body: bytes
) -> BlockHead:
    """A sealed block head, checked against its block (``count`` records from ``first_seq``,
    laid in ``body``): the steps it names, the bounds of their records and where their data
    is (:func:`block_keys_fit`).

    Raises:
        CheckpointCorruptedError: the head is damaged or does not fit the block.
    """
    head = unseal_json(sealed, where)
    try:
        agents, ends, data_keys = head["agents"], head["ends"], head["data"]
        checksum = head["crc"]
        fits = (
            head["seq"] == first_seq
            and len(agents) == len(ends) == len(data_keys) == count
            and set(map(type, agents)) == {str}
            and set(map(type, ends)) == set(map(type, data_keys)) == {int}
            and type(checksum) is str
            and block_keys_fit(body, ends, data_keys)
        )
    except (KeyError, TypeError, IndexError):
        fits = False
    if not fits:
        raise CheckpointCorruptedError(f"{where} does not describe its records")
    return BlockHead(agents, ends, data_keys, checksum)


def block_data_keys(body: bytes, ends: list[int]) -> list[int] | None:
    """Where :data:`DATA_KEY` is in each sealed step record of ``body`` (records laid end to
    end, ending at ``ends``; -1: no data), or None when one is not in this module's layout
    (a block never holds such a record)."""
    bodies_at = [start + SEALED_BODY_AT for start in (0, *ends[:-1])]
    if not all(map(body.startswith, repeat(STEP_BODY_HEAD), bodies_at)):
        return None
    return list(map(body.find, repeat(DATA_KEY), bodies_at, ends))


def block_keys_fit(body: bytes, ends: list[int], data_keys: list[int]) -> bool:
    """Whether the records' ends rise to the body's end, and each data key is -1 (no data)
    or inside its own record's body with room for some data and the two closing braces."""
    starts = [0, *ends[:-1]]
    with_data = len(data_keys) - data_keys.count(-1)
    lowest = map(add, starts, repeat(SEALED_BODY_AT))
    highest = map(sub, ends, repeat(len(DATA_KEY) - DATA_STOP + 1))
    return (
        ends[-1] == len(body)
        and all(map(lt, starts, ends))
        and sum(map(le, lowest, data_keys)) == with_data  # never true for a -1
        and all(map(le, data_keys, highest))
    )


def block_entries(
    first_seq: int, agents: list[str], body: bytes, ends: list[int], data_keys: list[int]
) -> list[HistoryEntry]:
    """The history entries of a block's records (``body``, the records ending at ``ends``,
    their data keys at ``data_keys``: what :func:`block_data_keys` found)."""
    seqs = range(first_seq, first_seq + len(ends))
    stops = map(sub, ends, repeat(-DATA_STOP))
    return data_entries(seqs, agents, repeat(body), data_keys, stops)


def _json_object(raw: bytes, where: str, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CheckpointCorruptedError(f"{where} holds invalid JSON") from None
    if not isinstance(value, dict):
        raise CheckpointCorruptedError(f"{where} is not {what}")
    return value
