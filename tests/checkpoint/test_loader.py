"""Reading step records on resume: the data found without decoding, other shapes parsed."""

from __future__ import annotations

import orjson
import pytest

from nestegg.checkpoint.codec import decode_value, encode_value, seal
from nestegg.checkpoint.loader import _history_entries
from nestegg.checkpoint.records import StepRecord
from nestegg.checkpoint.step_formats import step_data
from nestegg.checkpoint.views import StoredHistory
from nestegg.errors import CheckpointCorruptedError

DATA = {"turn": 3, "items": [1, 2], "note": 'a ,"data": inside'}


def test_the_checkpointers_layout_gives_the_data_json_as_stored() -> None:
    value = encode_value(DATA)
    raw = b'{"agent":"a","outcome":"ok","target":null,"started":1.0,"duration":0.5,"data":'
    assert step_data(raw + value + b"}", "step 1") == value


def test_a_step_without_data_gives_none() -> None:
    raw = b'{"agent":"a","outcome":"handover","target":"b","started":1.0,"duration":0.5}'
    assert step_data(raw, "step 1") is None


def test_another_key_order_is_parsed_in_full() -> None:
    raw = orjson.dumps({"data": DATA, "agent": "a", "outcome": "ok"})
    found = step_data(raw, "step 1")
    assert found is not None and decode_value(found) == DATA


@pytest.mark.parametrize("raw", [b"[1, 2]", b"not json"])
def test_a_body_that_is_not_a_step_is_corrupted(raw: bytes) -> None:
    with pytest.raises(CheckpointCorruptedError, match="step 7"):
        step_data(raw, "step 7")


def step_record(seq: int, agent: str, data: object | None, *, canonical: bool = True) -> StepRecord:
    """A sealed step record as the checkpointer writes it (or, not canonical, in another
    key order)."""
    head = {"agent": agent, "outcome": "completed", "target": None}
    if data is None:
        return StepRecord("r", seq, agent, seal(orjson.dumps(head)))
    if canonical:
        return StepRecord(
            "r", seq, agent, seal(orjson.dumps(head)[:-1] + b',"data":%s}' % encode_value(data))
        )
    return StepRecord(
        "r", seq, agent, seal(orjson.dumps({"data": orjson.loads(encode_value(data)), **head}))
    )


MIXED = [(1, "a", DATA), (2, "sel", None), (3, "b", {"n": [1, 2]}), (4, "c", "text")]


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "another-key-order"])
def test_history_entries_skip_steps_without_data_in_either_layout(canonical: bool) -> None:
    records = [step_record(seq, agent, data, canonical=canonical) for seq, agent, data in MIXED]
    entries = _history_entries(records, "r")
    assert [(seq, agent) for seq, agent, *_ in entries] == [(1, "a"), (3, "b"), (4, "c")]
    history = StoredHistory("r", {"source": "input", "data": 0}, entries)
    assert history.decode()[1:] == [
        {"source": agent, "data": data} for _, agent, data in MIXED if data is not None
    ]


def test_a_damaged_record_among_intact_ones_is_named() -> None:
    records = [step_record(seq, agent, data) for seq, agent, data in MIXED]
    body = records[2].body
    records[2] = records[2]._replace(body=body[:40] + bytes([body[40] ^ 1]) + body[41:])
    with pytest.raises(CheckpointCorruptedError, match="step 3 of run 'r' failed its checksum"):
        _history_entries(records, "r")
