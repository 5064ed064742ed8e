"""The record formats: the one module that writes and reads the bodies of checkpoints,
journal entries, events, failures and signals (a step record's body and a step block's
head are :mod:`~nestegg.checkpoint.step_formats`').

Every body is JSON, sealed by :func:`~nestegg.checkpoint.codec.seal` as
``{"crc":"<8 hex>","body":<json>}``. The layouts (stored data depends on them byte for
byte; tests/checkpoint/test_formats.py pins them):

- **checkpoint**: ``{"seq","turn","data_seq","source","position","next","metadata"}``, with
  ``"data"`` last when the checkpoint holds the current data itself (a fork's replaced
  data that no step record holds).
- **journal entry**: ``{"function","args","started","duration","result"}`` or
  ``{"function","args","started","duration","error":{"type","module","message"}}``: when
  the call began (epoch seconds) and how long it took (seconds, retries included); a
  failure's exception class by its qualified name and its module (named as
  :func:`~nestegg.module_names.stable_module_name` names it), and its message. Entries
  written before the times were recorded lack them; :func:`parse_journal` reads them as
  None. Failures written before the module was recorded lack it (their replay cannot
  find their class: see :mod:`nestegg.journal_failures`).
- **event**: the event's payload, a JSON object. A step's facts are stored once, in its
  step record: ``step_completed`` carries only ``{"seq"}`` and readers take the step's
  ``agent``, ``outcome`` and ``duration`` from its record (:func:`completed_event`; events
  written before hold them themselves and are read as they are). ``step_started``
  (``{"seq","agent"}``) and ``step_failed`` (:func:`failure_detail`) carry what no step
  record holds: the step in flight, or the attempt that failed, has none.
- **signal**: the signal's value, JSON (stored like step data).
- **failure** (a failed run's error): ``{"type","message","agent"}``, ``"hook"`` when no
  agent raised it (``"on_request"``; ``"on_checkpoint"``, for a checkpoint taken outside a
  step; ``"selector"`` with ``"agent": null``: the selector raised while it picked the
  step's agent), then for a failed step
  ``"seq","started","duration"`` and ``"traceback"`` (the step's ``step_failed`` event
  carries the same fields but the traceback).
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from nestegg.checkpoint.codec import seal, unseal_json, unseal_value
from nestegg.checkpoint.records import Commit, EventRecord, RunRecord
from nestegg.constants import FAILED, RUN_FAILED, RUN_STARTED, TRACE_KEY
from nestegg.errors import CheckpointCorruptedError
from nestegg.module_names import stable_module_name

# ------------------------------------------------------------------ checkpoints

NO_METADATA = b"{}"
"""The metadata JSON of a state with none."""


class Snapshot(NamedTuple):
    """Where the run stands after its last recorded step (what a checkpoint stores).

    A named tuple, like the records: a step makes one, at a third of a frozen dataclass's
    cost.
    """

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
    seconds and failed for good (its error's class, by qualified name and module, and its
    message)."""
    kind = type(error)
    module = stable_module_name(kind.__module__)
    failure = {"type": kind.__qualname__, "module": module, "message": str(error)}
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


def journaled_failure(sealed: bytes, where: str) -> bool:
    """Whether a sealed journal entry holds a call's final failure (not its result).

    Raises:
        CheckpointCorruptedError: damaged, or not a journal entry.
    """
    return "error" in parse_journal(sealed, where)


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
    (:func:`~nestegg.checkpoint.step_formats.step_facts`). With no record (``step`` None:
    deleted, or replaced by a later attempt of the step) or a payload that holds them
    already, the payload as stored; a damaged record gives ``unreadable``."""
    if step is None or completed_step(payload) is None:
        return payload
    if "unreadable" in step:
        return {**payload, "unreadable": step["unreadable"]}
    return {"seq": payload["seq"], **{key: step.get(key) for key in COMPLETED_FROM_STEP}}


# --------------------------------------------------------------------- failures

TRACEBACK_CHARS = 8000
"""The end of a failed step's traceback kept in the run's error."""
SELECTOR_HOOK = "selector"
"""The ``"hook"`` of a step's failure that the selector raised while it picked the agent."""
REQUEST_HOOK = "on_request"
"""The ``"hook"`` of a run's failure that its ``on_request`` hook raised."""
CHECKPOINT_HOOK = "on_checkpoint"
"""The ``"hook"`` of a run's failure that its ``on_checkpoint`` hook raised outside a step."""


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


def hook_failure_body(error: BaseException, hook: str) -> bytes:
    """The sealed error of a run that its ``hook`` (REQUEST_HOOK, CHECKPOINT_HOOK) failed
    with ``error``, outside a step."""
    return failure_body(failure_detail(error, None, hook=hook), error)


def refusal_body(error: BaseException) -> bytes:
    """The sealed error of a run its ``on_request`` hook refused with ``error``."""
    return hook_failure_body(error, REQUEST_HOOK)


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
