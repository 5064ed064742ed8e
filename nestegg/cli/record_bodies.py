"""The sealed records of a run export, each named by its place in the export
(``run.input``, ``steps[0].body``), and the refusal of one whose JSON text has an object
with a key twice.

A record's checksum covers its bytes, a key given twice and all, and the JSON reader that
reads it back keeps the last of the two values and says nothing: a hand-edited record with
its checksum made again, or one a store held so, would be imported, and read back without
the first value. The rule is :func:`~nestegg.checkpoint.given.refuse_key_twice`'s, as for
the export's own text (``nestegg import``, ``nestegg signal``'s value, ``fork --data``).
"""

from __future__ import annotations

from collections.abc import Iterator

from nestegg.checkpoint.given import is_orjson_text, refuse_key_twice
from nestegg.checkpoint.records import Commit, RunRecord, SignalRecord
from nestegg.errors import ConfigurationError


def sealed_records(
    run: RunRecord, commit: Commit, signals: list[SignalRecord]
) -> Iterator[tuple[str, bytes]]:
    """Every sealed record of an export with its place in it, in the document's order."""
    yield "run.input", run.input
    for name, value in (("result", run.result), ("error", run.error)):
        if value is not None:
            yield f"run.{name}", value
    bodies = {
        "steps": [r.body for r in commit.steps],
        "checkpoints": [r.body for r in commit.checkpoints],
        "events": [r.body for r in commit.events],
        "journal": [r.body for r in commit.journal],
        "signals": [r.body for r in signals],
    }
    for key, sealed in bodies.items():
        for index, body in enumerate(sealed):
            yield f"{key}[{index}].body", body


def key_twice(run: RunRecord, commit: Commit, signals: list[SignalRecord]) -> str | None:
    """The refusal of the first record whose JSON has an object with a key twice, naming
    the record, the object's path in the record's JSON and the key (``steps[0].body holds a
    dict at body.data with one key twice ("name" is there twice): ...``); None when every
    object of every record has each key once."""
    for place, sealed in sealed_records(run, commit, signals):
        if is_orjson_text(sealed):  # as the codec writes a record: read once more, not twice
            continue
        try:
            refuse_key_twice(sealed, place, plain=True)
        except ConfigurationError as error:
            return str(error)
    return None
