"""The record formats: the one module that writes and reads the bodies of step records,
checkpoints, journal entries and events.

Every body is JSON, sealed by :func:`~nestegg.checkpoint.codec.seal` as
``{"crc":"<8 hex>","body":<json>}``. The layouts (stored data depends on them byte for
byte; tests/checkpoint/test_formats.py pins them):

- **step record**: ``{"agent":…,"outcome":"…","target":…,"started":…,"duration":…}``, with
  ``,"data":<json>`` last when the step produced data. Readers find the data by its key
  without parsing the record (:data:`DATA_KEY`); a body of another shape is parsed in full.
- **checkpoint**: ``{"seq","turn","data_seq","source","position","next","metadata"}``, with
  ``"data"`` last when the checkpoint holds the current data itself (a fork's replaced
  data that no step record holds).
- **journal entry**: ``{"function","args","started","duration","result"}`` or
  ``{"function","args","started","duration","error":{"type","message"}}``: when the call
  began (epoch seconds) and how long it took (seconds, retries included). Entries written
  before those two were recorded lack them; :func:`parse_journal` reads them as None.
- **event**: the event's payload, a JSON object. A step's facts are stored once, in its
  step record: ``step_completed`` carries only ``{"seq"}`` and readers take the step's
  ``agent``, ``outcome`` and ``duration`` from its record (:func:`completed_event`; events
  written before hold them themselves and are read as they are). ``step_started``
  (``{"seq","agent"}``) and ``step_failed`` (:func:`failure_detail`) carry what no step
  record holds: the step in flight, or the attempt that failed, has none.
- **signal**: the signal's value, JSON (stored like step data).
- **step block head**: ``{"seq","agents","ends","data","crc"}``: the first step's seq, each
  record's agent, where it ends in the block's body and where its :data:`DATA_KEY` is (-1:
  no data), and the body's CRC-32 (8 hex digits).
- **failure** (a failed run's error): ``{"type","message","agent"}``, then for a failed step
  ``"seq","started","duration"`` and ``"traceback"`` (the step's ``step_failed`` event
  carries the same fields but the traceback).

The fast paths (byte offsets of the data in a sealed step record) live here too, and
nowhere else.
"""

from __future__ import annotations

import traceback
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import add, ge, le, lt, methodcaller, sub
from typing import Any, NamedTuple

import orjson

from nestegg.checkpoint.codec import SEALED_BODY_AT, seal, unseal, unseal_json, unseal_value
from nestegg.checkpoint.records import Commit, EventRecord, RunRecord
from nestegg.constants import FAILED, RUN_FAILED, RUN_STARTED, TRACE_KEY
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
    head = b'{"agent":%s,"outcome":"%s","target":%s,"started":%r,"duration":%r' % (
        orjson.dumps(agent),
        outcome.encode(),
        orjson.dumps(target),
        started,
        duration,
    )
    return seal(head + (b',"data":%s}' % data if data is not None else b"}"))


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


# ------------------------------------------------------------------ checkpoints

NO_METADATA = b"{}"
"""The metadata JSON of a state with none."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Where the run stands after its last recorded step (what a checkpoint stores)."""

    seq: int
    turn: int
    data_seq: int
    source: str
    position: dict[str, Any] | None
    metadata: bytes
    inline_data: bytes | None = None
    """The current data, when no step record holds it (a fork with replaced data)."""


def checkpoint_body(state: Snapshot, next_agent: str | None) -> bytes:
    """The JSON body of a checkpoint of ``state`` (unsealed)."""
    body = (
        b'{"seq":%d,"turn":%d,"data_seq":%d,"source":%s,"position":%s,"next":%s,"metadata":%s'
        % (
            state.seq,
            state.turn,
            state.data_seq,
            orjson.dumps(state.source),
            orjson.dumps(state.position),
            orjson.dumps(next_agent),
            state.metadata,
        )
    )
    if state.inline_data is not None:
        return body + b',"data":%s}' % state.inline_data
    return body + b"}"


def parse_checkpoint(sealed: bytes, where: str) -> dict[str, Any]:
    """A sealed checkpoint body's fields (see the module docstring).

    Raises:
        CheckpointCorruptedError: damaged, or not a checkpoint body.
    """
    body = unseal_json(sealed, where)
    if not isinstance(body, dict):
        raise CheckpointCorruptedError(f"{where} lacks its fields")
    return body


# -------------------------------------------------------------- journal entries


def journal_result_body(
    function: str, digest: str, value: bytes, started: float, duration: float
) -> bytes:
    """The sealed journal entry of a call that began at ``started`` (epoch seconds), took
    ``duration`` seconds and returned ``value`` (JSON)."""
    body = b'{"function":%s,"args":"%s","started":%s,"duration":%s,"result":%s}' % (
        orjson.dumps(function),
        digest.encode(),
        orjson.dumps(started),  # a third of what %r costs
        orjson.dumps(duration),
        value,
    )
    return seal(body)


def journal_error_body(
    function: str, digest: str, error: BaseException, started: float, duration: float
) -> bytes:
    """The sealed journal entry of a call that began at ``started``, took ``duration``
    seconds and failed for good (its error's type and message)."""
    failure = {"type": type(error).__qualname__, "message": str(error)}
    entry = {"function": function, "args": digest, "started": started, "duration": duration}
    return seal(orjson.dumps({**entry, "error": failure}))


JOURNAL_TIMES = ("started", "duration")
"""The fields of a journal entry that older entries lack (None when read)."""


def parse_journal(sealed: bytes, where: str, *, values: bool = False) -> dict[str, Any]:
    """A sealed journal entry's fields (``function``, ``args``, ``started``, ``duration``,
    ``result`` or ``error``): as plain JSON, or with ``values`` the result rebuilt as the
    value returned (models, bytes, dates: what a replay returns). ``started`` and
    ``duration`` are None in an entry written before they were recorded.

    Raises:
        CheckpointCorruptedError: damaged, or not a journal entry.
    """
    entry = unseal_value(sealed, where) if values else unseal_json(sealed, where)
    if not isinstance(entry, dict) or not isinstance(entry.get("function"), str):
        raise CheckpointCorruptedError(f"{where} is not a journal entry")
    for name in JOURNAL_TIMES:
        if type(entry.get(name)) not in (int, float):
            entry[name] = None
    return entry


# ----------------------------------------------------------------------- events


def event_body(payload: dict[str, Any]) -> bytes:
    """The sealed body of an event with ``payload``."""
    return seal(orjson.dumps(payload))


def opening_payload(trace: dict[str, str] | None = None) -> dict[str, Any]:
    """The payload of a run's ``run_started`` event: the trace context (W3C headers) of
    the attempt that started it, when it traces (telemetry reads it from there)."""
    return {TRACE_KEY: dict(trace)} if trace else {}


def ended_payload(steps: int) -> dict[str, Any]:
    """The payload of the event that ends a run (``run_completed``, ``run_failed``,
    ``run_cancelled``, ``run_waiting`` has more): the steps it had committed."""
    return {"steps": steps}


def failure_commit(
    run: RunRecord,
    at: float,
    error: bytes,
    opening: dict[str, Any] | None = None,
) -> Commit:
    """The commit that stores ``run`` (a RunRecord as read) failed with the sealed
    ``error`` (:func:`failure_body`): status failed and, after its stored events, its
    ``run_started`` event with ``opening`` (:func:`opening_payload`; None: its log has it
    already), then ``run_failed``. What a worker that cannot continue a run writes; the
    checkpointer writes the same events through its own commits."""
    kinds = [(RUN_STARTED, opening)] if opening is not None else []
    kinds.append((RUN_FAILED, ended_payload(run.step_seq)))
    return ending_commit(run, at, FAILED, kinds, error=error)


def ending_commit(
    run: RunRecord, at: float, status: str, events: Sequence[tuple[str, Any]], **fields: Any
) -> Commit:
    """The commit that stores ``run`` (a RunRecord as read) with ``status`` at ``at`` and,
    after its stored events, ``events`` (kind and payload each); ``fields``: the commit's
    others (its error, its lease)."""
    commit = Commit(run.run_id, run.fence, status=status, updated_at=at, **fields)
    for seq, (kind, payload) in enumerate(events, run.event_seq + 1):
        commit.events.append(EventRecord(run.run_id, seq, at, kind, event_body(payload)))
        commit.event_seq = seq
    return commit


def step_started_body(seq: int, agent: str) -> bytes:
    """The sealed body of a ``step_started`` event (the step has no record yet)."""
    return seal(b'{"seq":%d,"agent":%s}' % (seq, orjson.dumps(agent)))


def checkpoint_saved_body(checkpoint_id: str, seq: int, reason: str) -> bytes:
    """The sealed body of a ``checkpoint_saved`` event: what :func:`event_body` writes of
    ``{"checkpoint_id", "seq", "reason"}``, without building the dict."""
    return seal(
        b'{"checkpoint_id":%s,"seq":%d,"reason":%s}'
        % (orjson.dumps(checkpoint_id), seq, orjson.dumps(reason))
    )


def checkpoint_pruned_body(checkpoint_ids: list[str]) -> bytes:
    """The sealed body of a ``checkpoint_pruned`` event (``{"checkpoint_ids"}``)."""
    return seal(b'{"checkpoint_ids":%s}' % orjson.dumps(checkpoint_ids))


def step_completed_body(seq: int) -> bytes:
    """The sealed body of a ``step_completed`` event: the step's seq alone (the rest is its
    record's, see :func:`completed_event`)."""
    return seal(b'{"seq":%d}' % seq)


def parse_event(sealed: bytes, where: str) -> dict[str, Any]:
    """A sealed event body's payload as stored (a value that is no object comes as
    ``{"value": …}``).

    Raises:
        CheckpointCorruptedError: damaged.
    """
    data = unseal_json(sealed, where)
    return data if isinstance(data, dict) else {"value": data}


COMPLETED_FROM_STEP = ("agent", "outcome", "duration")
"""What a ``step_completed`` event shows of its step record, after its ``seq``."""


def completed_step(payload: dict[str, Any]) -> int | None:
    """The seq of the step record whose facts complete a ``step_completed`` event's payload;
    None when the payload holds them itself (written before events carried only the seq)."""
    seq = payload.get("seq")
    return seq if type(seq) is int and "agent" not in payload else None


def completed_event(payload: dict[str, Any], step: dict[str, Any] | None) -> dict[str, Any]:
    """A ``step_completed`` event's payload as readers see it: ``seq``, ``agent``,
    ``outcome``, ``duration``, the last three from ``step``, its step record's fields
    (:func:`step_facts`). With no record (``step`` None: deleted, or replaced by a later
    attempt of the step) or a payload that holds them already, the payload as stored; a
    damaged record gives ``unreadable``."""
    if step is None or completed_step(payload) is None:
        return payload
    if "unreadable" in step:
        return {**payload, "unreadable": step["unreadable"]}
    return {"seq": payload["seq"], **{key: step.get(key) for key in COMPLETED_FROM_STEP}}


# --------------------------------------------------------------------- failures

TRACEBACK_CHARS = 8000
"""The end of a failed step's traceback kept in the run's error."""


def failure_detail(
    error: BaseException,
    agent: str | None,
    seq: int | None = None,
    started: float = 0.0,
    ended: float = 0.0,
    *,
    hook: str | None = None,
) -> dict[str, Any]:
    """The facts of a run's failure: the error's type and message and the agent (or the
    ``hook`` that raised it), and for a failed step (``seq`` given) its seq, start and
    duration (``ended - started``)."""
    detail: dict[str, Any] = {"type": type(error).__qualname__, "message": str(error)}
    detail["agent"] = agent
    if hook is not None:
        detail["hook"] = hook
    if seq is not None:
        detail.update(seq=seq, started=started, duration=ended - started)
    return detail


def refusal_body(error: BaseException) -> bytes:
    """The sealed error of a run its ``on_request`` hook refused with ``error``."""
    return failure_body(failure_detail(error, None, hook="on_request"), error)


def failure_body(detail: dict[str, Any], error: BaseException | None = None) -> bytes:
    """The sealed error of a failed run: ``detail`` (:func:`failure_detail`), with the end of
    ``error``'s traceback when given."""
    if error is not None:
        text = "".join(traceback.format_exception(error))[-TRACEBACK_CHARS:]
        detail = {**detail, "traceback": text}
    return seal(orjson.dumps(detail))


def parse_failure(sealed: bytes, where: str) -> dict[str, Any]:
    """A failed run's stored error (a value that is no object comes as ``{"value": …}``).

    Raises:
        CheckpointCorruptedError: damaged.
    """
    data = unseal_json(sealed, where)
    return data if isinstance(data, dict) else {"value": data}


# ---------------------------------------------------------------------- signals


def signal_body(value: bytes) -> bytes:
    """The sealed body of a signal whose value is ``value`` (JSON)."""
    return seal(value)


def parse_signal(sealed: bytes, where: str) -> Any:
    """A sealed signal's value, rebuilt as it was sent (as a journaled result is).

    Raises:
        CheckpointCorruptedError: damaged.
    """
    return unseal_value(sealed, where)


def _json_object(raw: bytes, where: str, what: str) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise CheckpointCorruptedError(f"{where} holds invalid JSON") from None
    if not isinstance(value, dict):
        raise CheckpointCorruptedError(f"{where} is not {what}")
    return value
