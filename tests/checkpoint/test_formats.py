"""The record formats (nestegg/checkpoint/formats.py) write exactly the bytes stored data
has always had: a change here would make stored runs unreadable by other versions."""

from __future__ import annotations

import pytest

from nestegg.checkpoint.codec import encode_value, unseal
from nestegg.checkpoint.formats import (
    Snapshot,
    checkpoint_body,
    event_body,
    failure_body,
    failure_detail,
    journal_error_body,
    journal_result_body,
    parse_checkpoint,
    parse_event,
    parse_failure,
    parse_journal,
    parse_step,
    step_body,
    step_data,
    step_with_data,
)
from nestegg.errors import CheckpointCorruptedError

STEP = (
    b'{"crc":"6d33497d","body":{"agent":"enrich","outcome":"completed","target":null,'
    b'"started":1764000000.123456,"duration":0.000123,"data":{"x":[1,"\xc3\xa9"]}}}'
)
HANDOVER = (
    b'{"crc":"644095f9","body":{"agent":"route","outcome":"handover","target":"other",'
    b'"started":1.5,"duration":0.25}}'
)


def test_a_step_record_is_byte_for_byte_as_stored() -> None:
    data = b'{"x":[1,"\xc3\xa9"]}'
    assert step_body("enrich", "completed", None, 1764000000.123456, 0.000123, data) == STEP
    assert step_body("route", "handover", "other", 1.5, 0.25, None) == HANDOVER


def test_a_step_record_reads_back() -> None:
    assert parse_step(STEP, "step 1")["data"] == {"x": [1, "é"]}
    assert step_data(unseal(STEP, "step 1"), "step 1") == b'{"x":[1,"\xc3\xa9"]}'
    assert step_data(unseal(HANDOVER, "step 2"), "step 2") is None
    assert parse_step(HANDOVER, "step 2")["target"] == "other"


def test_a_forked_step_record_holds_the_replaced_data_last() -> None:
    replaced = step_with_data(STEP, b'["y"]', "step 1")
    assert replaced == (
        b'{"crc":"' + replaced[8:16] + b'","body":{"agent":"enrich","outcome":"completed",'
        b'"target":null,"started":1764000000.123456,"duration":0.000123,"data":["y"]}}'
    )
    assert parse_step(replaced, "step 1")["data"] == ["y"]


def test_a_checkpoint_body_is_byte_for_byte_as_stored() -> None:
    state = Snapshot(3, 2, 2, "b", {"index": 2}, b'{"k":1}')
    assert checkpoint_body(state, "c") == (
        b'{"seq":3,"turn":2,"data_seq":2,"source":"b","position":{"index":2},"next":"c",'
        b'"metadata":{"k":1}}'
    )
    inline = Snapshot(3, 2, 2, "b", None, b"{}", b"[1,2]")
    assert checkpoint_body(inline, None) == (
        b'{"seq":3,"turn":2,"data_seq":2,"source":"b","position":null,"next":null,'
        b'"metadata":{},"data":[1,2]}'
    )


def test_journal_entries_are_byte_for_byte_as_stored() -> None:
    result = journal_result_body("mod.fn", "abc123", encode_value({"n": 1}, "result"))
    assert result == (
        b'{"crc":"43835d76","body":{"function":"mod.fn","args":"abc123","result":{"n":1}}}'
    )
    error = journal_error_body("mod.fn", "abc123", ValueError("bad"))
    assert error == (
        b'{"crc":"a8c52630","body":{"function":"mod.fn","args":"abc123",'
        b'"error":{"type":"ValueError","message":"bad"}}}'
    )
    assert parse_journal(result, "entry")["result"] == {"n": 1}
    assert parse_journal(error, "entry", values=True)["error"]["type"] == "ValueError"


def test_events_are_byte_for_byte_as_stored() -> None:
    payload = {"seq": 1, "agent": "a", "outcome": "completed", "duration": 0.5}
    sealed = event_body(payload)
    assert sealed == (
        b'{"crc":"db99c9a3","body":{"seq":1,"agent":"a","outcome":"completed","duration":0.5}}'
    )
    assert parse_event(sealed, "event 1") == payload


def test_a_failure_is_byte_for_byte_as_stored() -> None:
    unfit = failure_body(failure_detail(ValueError("bad"), None))
    assert (
        unfit == b'{"crc":"' + unfit[8:16] + b'","body":{"type":"ValueError","message":"bad",'
        b'"agent":null}}'
    )
    assert parse_failure(unfit, "error") == {"type": "ValueError", "message": "bad", "agent": None}
    detail = failure_detail(KeyError("k"), "fetch", 3, 10.0, 10.5)
    assert detail == {
        "type": "KeyError",
        "message": "'k'",
        "agent": "fetch",
        "seq": 3,
        "started": 10.0,
        "duration": 0.5,
    }
    try:
        raise KeyError("k")
    except KeyError as error:
        raised = error
    stored = parse_failure(failure_body(detail, raised), "error")
    assert list(stored) == [*detail, "traceback"]
    assert "raise KeyError" in stored["traceback"] and "traceback" not in detail


def test_damaged_or_foreign_bodies_raise_checkpoint_corrupted_naming_where() -> None:
    with pytest.raises(CheckpointCorruptedError, match="step 4"):
        parse_step(STEP.replace(b"enrich", b"enrick"), "step 4")
    with pytest.raises(CheckpointCorruptedError, match="step 5 is not a step record"):
        step_data(b"[1]", "step 5")
    with pytest.raises(CheckpointCorruptedError, match="checkpoint c lacks its fields"):
        parse_checkpoint(event_body([1]), "checkpoint c")  # type: ignore[arg-type]
