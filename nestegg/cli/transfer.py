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
checksum first and writes nothing if one fails.
"""

from __future__ import annotations

import base64
from typing import Any

from nestegg.agents import check_name
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
from nestegg.constants import EXPORT_FORMAT, EXPORT_VERSION, LATEST_TIME, STATUSES
from nestegg.errors import CheckpointExistsError, RunExistsError

Blob = str | dict[str, str]


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
        return base64.b64decode(value["base64"])
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


async def export_run(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    """The run and everything of it as one JSON-ready document.

    Raises:
        RunNotFoundError: no such run.
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
            for e in await store.read_events(run.run_id)
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


def _whole(value: Any, where: str) -> int:
    """``value`` if it is an int (not a bool, a string or a float)."""
    if type(value) is not int:
        raise ExportFormatError(f"{where} must be a whole number, got {value!r}")
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


def _run_record(raw: dict[str, Any]) -> RunRecord:
    run_id = str(raw["run_id"])
    return RunRecord(
        run_id=run_id,
        pipeline=str(raw["pipeline"]),
        status=str(raw["status"]),
        input=unpack(raw["input"], "run.input"),
        created_at=_time(raw["created_at"], "run.created_at"),
        updated_at=_time(raw["updated_at"], "run.updated_at"),
        fence=_whole(raw["fence"], "run.fence"),
        owner=Owner.from_json(raw.get("owner")),
        lease_until=_optional_time(raw.get("lease_until"), "run.lease_until"),
        result=_optional(raw.get("result"), "run.result"),
        error=_optional(raw.get("error"), "run.error"),
        step_seq=_whole(raw["step_seq"], "run.step_seq"),
        event_seq=_whole(raw["event_seq"], "run.event_seq"),
        parent_run=raw.get("parent_run"),
        parent_checkpoint=raw.get("parent_checkpoint"),
    )


def read_signals(document: dict[str, Any], run_id: str) -> list[SignalRecord]:
    """The signals of an export (none when it has none).

    Raises:
        ExportFormatError: a signal lacks or garbles a field.
    """
    try:
        return [
            SignalRecord(
                run_id, str(g["name"]), _time(g["at"], "signals[].at"), unpack(g["body"], "signal")
            )
            for g in document.get("signals") or []
        ]
    except (KeyError, TypeError, ValueError) as error:
        raise ExportFormatError(f"the export lacks or garbles a signal: {error!r}") from None


def read_document(document: Any) -> tuple[RunRecord, Commit]:
    """The run row and the commit that restores everything else of it.

    Raises:
        ExportFormatError: not an export of this format and version, or a field is missing.
    """
    if not isinstance(document, dict) or document.get("format") != EXPORT_FORMAT:
        raise ExportFormatError(f"not a {EXPORT_FORMAT} export (no 'format': {EXPORT_FORMAT!r})")
    if document.get("version") != EXPORT_VERSION:
        raise ExportFormatError(
            f"export version {document.get('version')!r} is not supported "
            f"(this nestegg reads version {EXPORT_VERSION})"
        )
    try:
        run = _run_record(document["run"])
        rid = run.run_id
        commit = Commit(
            run_id=rid,
            fence=run.fence,
            steps=[
                StepRecord(
                    rid, _whole(s["seq"], "steps[].seq"), str(s["agent"]), unpack(s["body"], "step")
                )
                for s in document["steps"]
            ],
            events=[
                EventRecord(
                    rid,
                    _whole(e["seq"], "events[].seq"),
                    _time(e["at"], "events[].at"),
                    str(e["kind"]),
                    unpack(e["body"], "event"),
                )
                for e in document["events"]
            ],
            journal=[
                JournalRecord(
                    rid,
                    _whole(j["step"], "journal[].step"),
                    _whole(j["position"], "journal[].position"),
                    unpack(j["body"], "journal"),
                )
                for j in document["journal"]
            ],
            checkpoints=[
                CheckpointRecord(
                    str(c["checkpoint_id"]),
                    rid,
                    _whole(c["seq"], "checkpoints[].seq"),
                    _time(c["created_at"], "checkpoints[].created_at"),
                    str(c["reason"]),
                    unpack(c["body"], "checkpoint"),
                )
                for c in document["checkpoints"]
            ],
            updated_at=run.updated_at,
        )
    except (KeyError, TypeError, ValueError) as error:
        if isinstance(error, ExportFormatError):
            raise
        raise ExportFormatError(f"the export lacks or garbles a field: {error!r}") from None
    return run, commit


def _check_ids(run: RunRecord, commit: Commit) -> None:
    """The ids and names as ``run()`` and the stores check them."""
    check_name(run.run_id, "run id")
    if run.parent_run is not None:
        check_name(str(run.parent_run), "parent run id")
    if run.parent_checkpoint is not None:
        check_name(str(run.parent_checkpoint), "parent checkpoint id")
    for step in commit.steps:
        check_name(step.agent, f"agent name of step {step.seq}")
    for checkpoint in commit.checkpoints:
        check_name(checkpoint.checkpoint_id, "checkpoint id")


def _check_fields(run: RunRecord, commit: Commit) -> None:
    """Statuses, counters and sequence numbers that a run can hold."""
    if run.status not in STATUSES:
        raise ExportFormatError(f"run.status {run.status!r} is not one of {', '.join(STATUSES)}")
    if not run.pipeline:
        raise ExportFormatError("run.pipeline is empty")
    if run.fence < 1 or run.step_seq < 0 or run.event_seq < 0:
        raise ExportFormatError("run.fence must be at least 1, step_seq and event_seq at least 0")
    where = {
        "steps": ([s.seq for s in commit.steps], run.step_seq),
        "events": ([e.seq for e in commit.events], run.event_seq),
        "checkpoints": ([c.seq + 1 for c in commit.checkpoints], run.step_seq + 1),
    }
    for name, (seqs, top) in where.items():
        wrong = [seq for seq in seqs if not 1 <= seq <= top]
        if wrong:
            raise ExportFormatError(f"{name}: sequence number {wrong[0]} is outside 1..{top}")
    if len({s.seq for s in commit.steps}) != len(commit.steps):
        raise ExportFormatError("steps: a sequence number appears twice")
    if len({c.checkpoint_id for c in commit.checkpoints}) != len(commit.checkpoints):
        raise ExportFormatError("checkpoints: a checkpoint id appears twice")
    wrong_steps = [j.step for j in commit.journal if j.step < 1 or j.position < 0]
    if wrong_steps:
        raise ExportFormatError(f"journal: step {wrong_steps[0]} or its position is out of range")


def verify(run: RunRecord, commit: Commit) -> None:
    """Check every id and field as ``run()`` does, and every record's checksum.

    Raises:
        InvalidIdentifierError: an id or agent name that ``run()`` would refuse.
        ExportFormatError: a status, counter or sequence number no run can have.
        CheckpointCorruptedError: naming the first damaged record.
    """
    _check_ids(run, commit)
    _check_fields(run, commit)
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
        ExportFormatError: the document is not an export, or holds what no run can.
        InvalidIdentifierError: an id that ``run()`` would refuse.
        CheckpointCorruptedError: a record in it fails its checksum.
    """
    run, commit = read_document(document)
    signals = read_signals(document, run.run_id)
    verify(run, commit)
    for signal in signals:
        check_name(signal.name, "signal name")
        unseal(signal.body, f"signal {signal.name!r} of run {run.run_id!r}")
    return run, commit, signals


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
