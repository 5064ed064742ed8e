"""How the file store lays records on disk: JSON lines, checkpoint files, run and commit
documents.

A record is one JSON object: its header fields, then ``"body"`` last. A sealed body is
JSON on one line and is embedded verbatim, so a log stays readable with ``jq``::

    {"seq":1,"agent":"fetch","body":{"crc":"1c291ca3","body":{"items":[1,2]}}}

Any other body (not JSON, or JSON spread over several lines) is written as base64 with
``"encoding":"base64"`` in the header. A reader splits a record at the first ``,"body":``
(which cannot occur inside the JSON-encoded header) and returns the bytes after it as
they are, so a damaged body is handed on for the checksum check above the store.

Logs are append-only JSON lines. A crash mid-append leaves a last line without its
newline: readers leave it out and the next append cuts it off first. A line in the
middle whose header cannot be read (not JSON) is skipped with a warning; there is no
sequence number to return it under.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

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
from nestegg.constants import (
    DAMAGED,
    FILE_INPUT,
    FILE_LOCK,
    FILE_NAME_MAX_BYTES,
    FILE_RUN,
    FILE_UNREADABLE_REASON,
)
from nestegg.errors import InvalidIdentifierError, StorageError
from nestegg.identifiers import check_name

log = logging.getLogger("nestegg")

BODY_KEY = b',"body":'
CHECKPOINT_SUFFIX = ".json"
BASE64 = "base64"
_RUN_FIELDS = (
    "run_id pipeline status created_at updated_at fence owner lease_until step_seq "
    "event_seq parent_run parent_checkpoint result error".split()
)


def _embeddable(body: bytes) -> bool:
    if b"\n" in body or b"\r" in body:
        return False
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return True


def encode_record(header: dict[str, Any], body: bytes) -> bytes:
    """One record: the header's fields, then the body (verbatim if it is one-line JSON)."""
    if not _embeddable(body):
        header = {**header, "encoding": BASE64}
        body = b'"%s"' % base64.b64encode(body)
    return b"%s%s%s}" % (orjson.dumps(header)[:-1], BODY_KEY, body)


def decode_record(data: bytes) -> tuple[dict[str, Any], bytes] | None:
    """The header and body bytes of one record; None if the header cannot be read.

    A body cut short (a torn file) is returned as far as it goes.
    """
    cut = data.find(BODY_KEY)
    if cut < 0:
        return None
    try:
        header = orjson.loads(data[:cut] + b"}")
    except orjson.JSONDecodeError:
        return None
    if not isinstance(header, dict):
        return None
    body = data[cut + len(BODY_KEY) :].rstrip(b" \t\r\n")
    body = body[:-1] if body.endswith(b"}") else body
    if header.get("encoding") == BASE64:
        try:
            body = base64.b64decode(body.strip(b'"'), validate=True)
        except (binascii.Error, ValueError):
            return None
    return header, body


def step_line(step: StepRecord) -> bytes:
    """A line of steps.log."""
    return encode_record({"seq": step.seq, "agent": step.agent}, step.body) + b"\n"


def event_line(event: EventRecord) -> bytes:
    """A line of events.log."""
    return encode_record({"seq": event.seq, "at": event.at, "kind": event.kind}, event.body) + b"\n"


def journal_line(entry: JournalRecord) -> bytes:
    """A line of journal.log."""
    return encode_record({"step": entry.step, "position": entry.position}, entry.body) + b"\n"


def signal_line(signal: SignalRecord) -> bytes:
    """A line of signals.log."""
    return encode_record({"name": signal.name, "at": signal.at}, signal.body) + b"\n"


def read_signals(path: Path, run_id: str) -> dict[str, SignalRecord]:
    """The signals in a signals.log: name -> the last signal of that name."""
    signals: dict[str, SignalRecord] = {}
    for header, body in read_log(path):
        name, at = header.get("name"), header.get("at")
        if isinstance(name, str) and isinstance(at, int | float):
            signals[name] = SignalRecord(run_id, name, float(at), body)
    return signals


def read_log(path: Path) -> Iterator[tuple[dict[str, Any], bytes]]:
    """The readable records of a JSON-lines log, in file order (none if it is missing)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: nothing, or a torn record
    skipped = 0
    for line in lines:
        record = decode_record(line)
        if record is None:
            skipped += 1
            continue
        yield record
    if skipped:
        log.warning("skipped %d unreadable line(s) of %s", skipped, path)


def read_log_lines(path: Path) -> Iterator[tuple[dict[str, Any], bytes]]:
    """Each complete line of a log with its header (None when unreadable); raw line bytes."""
    data = path.read_bytes()
    lines = data.split(b"\n")
    lines.pop()
    for line in lines:
        record = decode_record(line)
        yield (record[0] if record else {}), line


def _bytes_to_json(value: bytes | None) -> Any:
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return {BASE64: base64.b64encode(value).decode("ascii")}


def _bytes_from_json(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, dict):
        return base64.b64decode(value[BASE64])
    return str(value).encode("utf-8")


def encode_run(run: RunRecord) -> bytes:
    """run.json: every field of the run but its input (kept in its own file), indented."""
    doc: dict[str, Any] = {name: getattr(run, name) for name in _RUN_FIELDS}
    doc["owner"] = run.owner.to_json() if run.owner is not None else None
    doc["result"] = _bytes_to_json(run.result)
    doc["error"] = _bytes_to_json(run.error)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def decode_run(data: bytes, input_bytes: bytes, where: Path) -> RunRecord:
    """The run :func:`encode_run` wrote, with its input.

    Raises:
        StorageError: ``where`` (the run.json file) is not what encode_run writes.
    """
    try:
        doc = orjson.loads(data)
        fields = {name: doc[name] for name in _RUN_FIELDS}
        fields["owner"] = Owner.from_json(doc["owner"])
        fields["result"] = _bytes_from_json(doc["result"])
        fields["error"] = _bytes_from_json(doc["error"])
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError and base64 errors too
        raise StorageError(f"{where} is damaged: {exc}") from None
    return RunRecord(input=input_bytes, **fields)


def encode_checkpoint(checkpoint: CheckpointRecord) -> bytes:
    """A checkpoint file: the record's fields, then its body."""
    header = {
        "checkpoint_id": checkpoint.checkpoint_id,
        "run_id": checkpoint.run_id,
        "seq": checkpoint.seq,
        "created_at": checkpoint.created_at,
        "reason": checkpoint.reason,
    }
    return encode_record(header, checkpoint.body) + b"\n"


def checkpoint_file_name(seq: int, checkpoint_id: str) -> str:
    """``<seq>-<checkpoint_id>.json``: the name says which step the checkpoint covers, so
    ordering and truncation never depend on a file's (possibly damaged) contents."""
    return f"{seq:010d}-{checkpoint_id}{CHECKPOINT_SUFFIX}"


def parse_checkpoint_file_name(name: str) -> tuple[int, str] | None:
    """The seq and checkpoint id a checkpoint file's name holds; None for other names."""
    if name.startswith(".") or not name.endswith(CHECKPOINT_SUFFIX):
        return None
    seq, dash, checkpoint_id = name.removesuffix(CHECKPOINT_SUFFIX).partition("-")
    if not dash or not seq.isdigit() or not checkpoint_id:
        return None
    return int(seq), checkpoint_id


def read_checkpoint_file(path: Path, run_id: str) -> CheckpointRecord | None:
    """A checkpoint file (None if it is gone or not one).

    Id and seq come from the file's name. When its header cannot be read, the whole file
    is returned as the body (so the checksum check above fails on it) with the reason
    FILE_UNREADABLE_REASON.
    """
    parsed = parse_checkpoint_file_name(path.name)
    if parsed is None:
        return None
    seq, checkpoint_id = parsed
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    record = decode_record(data)
    if record is not None:
        header, body = record
        created_at, reason = header.get("created_at"), header.get("reason")
        if isinstance(created_at, int | float) and isinstance(reason, str):
            return CheckpointRecord(checkpoint_id, run_id, seq, float(created_at), reason, body)
    created_at = path.stat().st_mtime
    return CheckpointRecord(checkpoint_id, run_id, seq, created_at, FILE_UNREADABLE_REASON, data)


def checkpoint_files(folder: Path) -> dict[str, tuple[int, str]]:
    """The checkpoint files in ``folder``: name -> (seq, checkpoint id)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    parsed = {name: parse_checkpoint_file_name(name) for name in names}
    return {name: value for name, value in parsed.items() if value is not None}


def record_seq(header: dict[str, Any]) -> int:
    """A record's sequence number; -1 when the header lacks a usable one."""
    seq = header.get("seq")
    return seq if isinstance(seq, int) else -1


def _bytes_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return _bytes_to_json(value)
    if isinstance(value, StepRecord | EventRecord | CheckpointRecord):
        return value._asdict()
    raise TypeError(f"cannot encode {type(value).__name__}")


def encode_commit(commit: Commit) -> bytes:
    """A whole commit as one JSON document (bodies as text, or base64 when not UTF-8)."""
    return orjson.dumps(commit, default=_bytes_default)


def decode_commit(data: bytes, where: Path) -> Commit:
    """The commit :func:`encode_commit` wrote.

    Raises:
        StorageError: ``where`` is not what encode_commit writes.
    """
    try:
        doc = orjson.loads(data)
        for name in ("steps", "events", "journal", "checkpoints"):
            for record in doc[name]:
                record["body"] = _bytes_from_json(record["body"])
        for name in ("result", "error"):
            doc[name] = _bytes_from_json(doc[name])
        return Commit(
            **{
                **doc,
                "steps": [StepRecord(**s) for s in doc["steps"]],
                "events": [EventRecord(**e) for e in doc["events"]],
                "journal": [JournalRecord(**j) for j in doc["journal"]],
                "checkpoints": [CheckpointRecord(**c) for c in doc["checkpoints"]],
            }
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"{where} is damaged: {exc}") from None


def file_name_id(name: str, what: str) -> str:
    """``name`` if it is a safe identifier that fits in a file name (InvalidIdentifierError,
    as for any unsafe id, when its UTF-8 form is longer than the file system allows)."""
    size = len(check_name(name, what).encode("utf-8", "surrogatepass"))
    if size > FILE_NAME_MAX_BYTES:
        raise InvalidIdentifierError(
            f"{what} {name[:40]!r}... is {size} bytes long in UTF-8; the file store allows "
            f"at most {FILE_NAME_MAX_BYTES} (one file name)"
        )
    return name


def holds_a_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` is (or was) a run's: a file in its place, or a directory
    holding any file every run has (an empty directory is not a run)."""
    if not os.path.lexists(run_dir):
        return False
    if not run_dir.is_dir():
        return True
    return any((run_dir / name).exists() for name in (FILE_RUN, FILE_INPUT, FILE_LOCK))


def damaged_run(run_dir: Path, missing: str) -> RunRecord:
    """A stand-in for a run whose directory lacks a file every run has: listed with the
    status ``damaged`` (reading it raises the StorageError that says what is missing)."""
    try:
        when = run_dir.stat().st_mtime
    except FileNotFoundError:
        when = 0.0
    return RunRecord(run_dir.name, "?", DAMAGED, b"", when, when, error=missing.encode())
