"""Export a run as one JSON document, and import it into a store exactly as it was.

The document::

    {"format": "nestegg-run", "version": 1,
     "run": {"run_id", "pipeline", "status", "created_at", "updated_at", "fence", "owner",
             "lease_until", "step_seq", "event_seq", "parent_run", "parent_checkpoint",
             "input", "result", "error"},
     "steps": [{"seq", "agent", "body"}],
     "checkpoints": [{"checkpoint_id", "seq", "created_at", "reason", "body"}],
     "events": [{"seq", "at", "kind", "body"}],
     "journal": [{"step", "position", "body"}],
     "signals": [{"name", "at", "body"}]}

``signals`` (the signals sent to the run) may be missing: an export without them imports
a run without signals.

Times are UNIX seconds (exact floats). Every stored payload (``input``, ``result``,
``error`` and each ``body``) is the sealed record exactly as stored, as a JSON string of
its UTF-8 text (itself readable JSON: ``{"crc": ..., "body": ...}``); a record that is not
UTF-8 (only a damaged one) is written as ``{"base64": "..."}``. Importing checks every
field of every record and every checksum first, that no object in a record's JSON has a key
twice (:mod:`~nestegg.cli.record_bodies`), and that a step's ``agent`` and a checkpoint's
``seq`` are what their bodies hold (:mod:`~nestegg.cli.record_copies`), and writes nothing
if one fails.
"""

from __future__ import annotations

import base64
import binascii
import shlex
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from nestegg.checkpoint.codec import unseal
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.cli.reading import get_run
from nestegg.cli.record_bodies import key_twice
from nestegg.cli.record_copies import copy_mismatch
from nestegg.constants import (
    EXPORT_FORMAT,
    EXPORT_VERSION,
    LARGEST_NUMBER,
    LATEST_TIME,
    STATUSES,
    CheckpointReason,
    EventKind,
)
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointExistsError,
    EventLogDamagedError,
    RunExistsError,
)
from nestegg.identifiers import check_name, unstorable_character

Blob = str | dict[str, str]
Fields = dict[str, Any]
Reader = Callable[[Any, str], Any]


class ExportFormatError(ValueError):
    """A document that is not a nestegg run export; the message says what is wrong."""


def pack(sealed: bytes) -> Blob:
    """Stored bytes as a JSON value (their text, or base64 when not UTF-8)."""
    try:
        return bytes(sealed).decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(sealed).decode("ascii")}


def unpack(value: Any, where: str) -> bytes:
    """The bytes :func:`pack` wrote."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict) and isinstance(value.get("base64"), str):
        try:
            return base64.b64decode(value["base64"], validate=True)
        except binascii.Error:
            raise ExportFormatError(f"{where}.base64 is not base64") from None
    raise ExportFormatError(f"{where} is neither a string nor {{'base64': ...}}")


async def _journal(store: CheckpointStorage, run: RunRecord) -> list[JournalRecord]:
    # Journal entries belong to executed steps and to the step in flight (step_seq + 1);
    # a resume from an older checkpoint may have left some further on: read until a gap.
    entries: list[JournalRecord] = []
    step = 1
    while True:
        found = await store.read_journal(run.run_id, step)
        if not found and step > run.step_seq + 1:
            return entries
        entries.extend(found)
        step += 1


async def _events(store: CheckpointStorage, run_id: str) -> list[EventRecord]:
    """The run's whole event log, for an export: a torn one refuses it."""
    try:
        return await store.read_events(run_id)
    except CheckpointCorruptedError as error:
        raise EventLogDamagedError(
            f"run {run_id!r} cannot be exported: {error}; nothing was written (an export "
            f"copies a run whole; nestegg events {shlex.quote(run_id)} lists the events "
            "before the damage)",
            run_id,
        ) from None


async def export_run(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    """The run and everything of it as one JSON-ready document.

    Raises:
        RunNotFoundError: no such run.
        EventLogDamagedError: its event log is torn (an export is whole or not at all).
    """
    run = await get_run(store, run_id)
    return {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "run": {
            "run_id": run.run_id,
            "pipeline": run.pipeline,
            "status": run.status,
            "created_at": run.created_at,
            "updated_at": run.updated_at,
            "fence": run.fence,
            "owner": run.owner.to_json() if run.owner else None,
            "lease_until": run.lease_until,
            "step_seq": run.step_seq,
            "event_seq": run.event_seq,
            "parent_run": run.parent_run,
            "parent_checkpoint": run.parent_checkpoint,
            "input": pack(run.input),
            "result": pack(run.result) if run.result is not None else None,
            "error": pack(run.error) if run.error is not None else None,
        },
        "steps": [
            {"seq": s.seq, "agent": s.agent, "body": pack(s.body)}
            for s in await store.load_steps(run.run_id)
        ],
        "checkpoints": [
            {
                "checkpoint_id": c.checkpoint_id,
                "seq": c.seq,
                "created_at": c.created_at,
                "reason": c.reason,
                "body": pack(c.body),
            }
            for c in await store.list_checkpoints(run.run_id)
        ],
        "events": [
            {"seq": e.seq, "at": e.at, "kind": e.kind, "body": pack(e.body)}
            for e in await _events(store, run.run_id)
        ],
        "journal": [
            {"step": j.step, "position": j.position, "body": pack(j.body)}
            for j in await _journal(store, run)
        ],
        "signals": [
            {"name": g.name, "at": g.at, "body": pack(g.body)}
            for g in await store.read_signals(run.run_id)
        ],
    }


def _field(record: Fields, where: str, name: str) -> Any:
    """The field ``name`` of the record at ``where`` ("": the document; absent:
    ExportFormatError)."""
    if name not in record:
        raise ExportFormatError(f"{where}.{name} is missing" if where else f"{name} is missing")
    return record[name]


def _object(value: Any, where: str) -> Fields:
    if not isinstance(value, dict):
        raise ExportFormatError(f"{where} must be a JSON object, got {value!r}")
    return value


def _records(document: Fields, key: str, optional: bool) -> list[tuple[str, Fields]]:
    """The records of the list ``key``, each with its place (``steps[0]``)."""
    if optional and document.get(key) is None:
        return []
    value = _field(document, "", key)
    if not isinstance(value, list):
        raise ExportFormatError(f"{key} must be a JSON list, got {value!r}")
    return [(f"{key}[{i}]", _object(item, f"{key}[{i}]")) for i, item in enumerate(value)]


def _whole(value: Any, where: str, low: int = 0, high: int = LARGEST_NUMBER) -> int:
    """``value`` if it is an int (not a bool, a string or a float) from ``low`` to ``high``."""
    if type(value) is not int:
        raise ExportFormatError(f"{where} must be a whole number, got {value!r}")
    if not low <= value <= high:
        raise ExportFormatError(f"{where} {value} is outside {low}..{high}")
    return value


def _time(value: Any, where: str) -> float:
    """``value`` as UNIX seconds, if it is a number from 0 to the end of the year 9999."""
    if type(value) not in (int, float) or not 0 <= value <= LATEST_TIME:  # NaN: False
        raise ExportFormatError(
            f"{where} must be UNIX seconds from 0 to the end of the year 9999, got {value!r}"
        )
    return float(value)


def _optional_time(value: Any, where: str) -> float | None:
    return None if value is None else _time(value, where)


def _optional(value: Any, where: str) -> bytes | None:
    return None if value is None else unpack(value, where)


def _optional_name(value: Any, where: str) -> str | None:
    return None if value is None else check_name(value, where)


def _text(value: Any, where: str) -> str:
    """``value`` if it is a non-empty string every store keeps (no NUL, no lone surrogate)."""
    if not isinstance(value, str) or not value:
        raise ExportFormatError(f"{where} must be a non-empty string, got {value!r}")
    if (problem := unstorable_character(value)) is not None:
        raise ExportFormatError(f"{where} {value!r} holds {problem}")
    return value


def _one_of(value: Any, where: str, choices: Iterable[str]) -> str:
    allowed = tuple(choices)
    if not isinstance(value, str) or value not in allowed:
        raise ExportFormatError(f"{where} {value!r} is not one of {', '.join(allowed)}")
    return value


def _owner(value: Any, where: str) -> Owner | None:
    if value is None:
        return None
    raw = _object(value, where)
    return Owner(
        host=_text(_field(raw, where, "host"), f"{where}.host"),
        pid=_whole(_field(raw, where, "pid"), f"{where}.pid"),
        started=_text(_field(raw, where, "started"), f"{where}.started"),
    )


def _run_record(value: Any) -> RunRecord:
    raw = _object(value, "run")

    def field(name: str) -> tuple[Any, str]:
        return _field(raw, "run", name), f"run.{name}"

    return RunRecord(
        run_id=check_name(*field("run_id")),
        pipeline=_text(*field("pipeline")),
        status=_one_of(*field("status"), STATUSES),
        input=unpack(*field("input")),
        created_at=_time(*field("created_at")),
        updated_at=_time(*field("updated_at")),
        fence=_whole(*field("fence"), low=1),
        owner=_owner(raw.get("owner"), "run.owner"),
        lease_until=_optional_time(raw.get("lease_until"), "run.lease_until"),
        result=_optional(raw.get("result"), "run.result"),
        error=_optional(raw.get("error"), "run.error"),
        step_seq=_whole(*field("step_seq")),
        event_seq=_whole(*field("event_seq")),
        parent_run=_optional_name(raw.get("parent_run"), "run.parent_run"),
        parent_checkpoint=_optional_name(raw.get("parent_checkpoint"), "run.parent_checkpoint"),
    )


def _rows(
    document: Fields,
    key: str,
    readers: dict[str, Reader],
    unique: tuple[str, ...],
    optional: bool = False,
) -> list[list[Any]]:
    """The fields of each record of the list ``key``, in the order of ``readers`` (each
    checks and converts its field), refusing a record whose ``unique`` fields an earlier
    one has (``optional``: the list may be missing, no records)."""
    places = _records(document, key, optional=optional)
    rows = [
        [read(_field(record, at, name), f"{at}.{name}") for name, read in readers.items()]
        for at, record in places
    ]
    names = list(readers)
    positions = [names.index(name) for name in unique]
    seen: set[Any] = set()
    for (at, _), row in zip(places, rows, strict=True):
        values = tuple(row[i] for i in positions)
        shown = values[0] if len(values) == 1 else values
        if values in seen:
            raise ExportFormatError(f"{at}: {' and '.join(unique)} {shown!r} appears twice")
        seen.add(values)
    return rows


def _records_of(document: Fields, run: RunRecord) -> Commit:
    """The commit of every step, event, journal entry and checkpoint of the export."""
    rid = run.run_id
    steps = _rows(
        document,
        "steps",
        {"seq": partial(_whole, low=1, high=run.step_seq), "agent": check_name, "body": unpack},
        ("seq",),
    )
    events = _rows(
        document,
        "events",
        {
            "seq": partial(_whole, low=1, high=run.event_seq),
            "at": _time,
            "kind": partial(_one_of, choices=EventKind),
            "body": unpack,
        },
        ("seq",),
    )
    journal = _rows(
        document,
        "journal",
        {"step": partial(_whole, low=1), "position": _whole, "body": unpack},
        ("step", "position"),
    )
    checkpoints = _rows(
        document,
        "checkpoints",
        {
            "checkpoint_id": check_name,
            "seq": partial(_whole, high=run.step_seq),
            "created_at": _time,
            "reason": partial(_one_of, choices=CheckpointReason),
            "body": unpack,
        },
        ("checkpoint_id",),
    )
    return Commit(
        run_id=rid,
        fence=run.fence,
        steps=[StepRecord(rid, *row) for row in steps],
        events=[EventRecord(rid, *row) for row in events],
        journal=[JournalRecord(rid, *row) for row in journal],
        checkpoints=[CheckpointRecord(c[0], rid, *c[1:]) for c in checkpoints],
        updated_at=run.updated_at,
    )


def read_signals(document: Fields, run_id: str) -> list[SignalRecord]:
    """The signals of an export (none when it has none).

    Raises:
        ExportFormatError: a signal lacks or garbles a field, or a name appears twice.
        InvalidIdentifierError: a signal name that ``signal()`` would refuse.
    """
    readers: dict[str, Reader] = {"name": check_name, "at": _time, "body": unpack}
    return [
        SignalRecord(run_id, *row)
        for row in _rows(document, "signals", readers, ("name",), optional=True)
    ]


def read_document(document: Any) -> tuple[RunRecord, Commit]:
    """The run row and the commit that restores everything else of it, every field of
    every record checked as ``run()`` and the stores take it.

    Raises:
        ExportFormatError: not an export of this format and version, or a field is missing
            or holds what no run can (naming the record and the field: ``events[3].kind``).
        InvalidIdentifierError: an id or name that ``run()`` would refuse.
    """
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ExportFormatError(f"not a {EXPORT_FORMAT} export (no 'format': {EXPORT_FORMAT!r})")
    if document.get("version") != EXPORT_VERSION:
        raise ExportFormatError(
            f"export version {document.get('version')!r} is not supported "
            f"(this nestegg reads version {EXPORT_VERSION})"
        )
    run = _run_record(_field(document, "", "run"))
    return run, _records_of(document, run)


def verify(run: RunRecord, commit: Commit) -> None:
    """Check every record's checksum (:func:`read_document` checked their fields).

    Raises:
        CheckpointCorruptedError: naming the first damaged record.
    """
    rid = run.run_id
    unseal(run.input, f"input of run {rid!r}")
    for name in ("result", "error"):
        value = getattr(run, name)
        if value is not None:
            unseal(value, f"{name} of run {rid!r}")
    for step in commit.steps:
        unseal(step.body, f"step {step.seq} of run {rid!r}")
    for event in commit.events:
        unseal(event.body, f"event {event.seq} of run {rid!r}")
    for entry in commit.journal:
        unseal(entry.body, f"journal entry {entry.step}/{entry.position} of run {rid!r}")
    for checkpoint in commit.checkpoints:
        unseal(checkpoint.body, f"checkpoint {checkpoint.checkpoint_id!r} of run {rid!r}")


def read_export(document: Any) -> tuple[RunRecord, Commit, list[SignalRecord]]:
    """The run, its records and its signals of an export, every one checked as
    :func:`import_run` needs them, before any store is opened.

    Raises:
        ExportFormatError: the document is not an export, or holds what no run can, or a
            record whose JSON has an object with a key twice, or a field that copies what a
            record's body holds (a step's agent, a checkpoint's seq) and is not what it holds.
        InvalidIdentifierError: an id that ``run()`` would refuse.
        CheckpointCorruptedError: a record in it fails its checksum.
    """
    run, commit = read_document(document)
    signals = read_signals(document, run.run_id)
    verify(run, commit)
    for signal in signals:
        unseal(signal.body, f"signal {signal.name!r} of run {run.run_id!r}")
    if (twice := key_twice(run, commit, signals)) is not None:  # before a body is read
        raise ExportFormatError(twice)
    if (mismatch := copy_mismatch(commit)) is not None:
        raise ExportFormatError(mismatch)
    return run, commit, signals


def missing_steps(run: RunRecord, commit: Commit) -> list[int]:
    """The steps the run counts (``step_seq``) whose records an export does not hold: its
    store had lost them, or it was edited. Imported as they are: ``show`` marks them
    missing, ``checkpoints`` the checkpoints a resume can no longer use."""
    held = {step.seq for step in commit.steps}
    return [seq for seq in range(1, run.step_seq + 1) if seq not in held]


async def _check_free(store: CheckpointStorage, run: RunRecord, commit: Commit) -> None:
    """Refuse ids the store has already: its run id, and its checkpoint ids, which are unique
    in a store (every store would give such a checkpoint to the imported run, or lose it)."""
    if await store.get_run(run.run_id) is not None:
        raise RunExistsError(
            f"run {run.run_id!r} already exists in the target store; delete it first",
            run.run_id,
        )
    for checkpoint in commit.checkpoints:
        held = await store.get_checkpoint(checkpoint.checkpoint_id)
        if held is not None:
            raise CheckpointExistsError(
                f"checkpoint {checkpoint.checkpoint_id!r} of run {held.run_id!r} already "
                f"exists in the target store; delete run {held.run_id!r} first",
                checkpoint.checkpoint_id,
                held.run_id,
            )


async def import_run(
    store: CheckpointStorage,
    document: Any,
    read: tuple[RunRecord, Commit, list[SignalRecord]] | None = None,
) -> RunRecord:
    """Re-create an exported run in ``store``, exactly as it was exported (``read``: what
    :func:`read_export` gave for ``document``, so as not to check it again).

    Raises:
        ExportFormatError: the document is not an export, or holds what no run can.
        InvalidIdentifierError: an id that ``run()`` would refuse (nothing is written).
        CheckpointCorruptedError: a record in it fails its checksum (nothing is written).
        RunExistsError: the store already has a run with that id (nothing is written).
        CheckpointExistsError: the store already has one of its checkpoint ids, of another
            run (nothing is written).
    """
    run, commit, signals = read if read is not None else read_export(document)
    await _check_free(store, run, commit)
    await store.create_run(run)
    try:
        await store.commit(commit)
        for signal in signals:
            await store.put_signal(signal)
    except BaseException:
        await store.delete_run(run.run_id)
        raise
    return run
