"""The record formats (nestegg/checkpoint/formats.py) write exactly the bytes stored data
has always had: a change here would make stored runs unreadable by other versions."""

from __future__ import annotations

import math
import random
import struct

import pytest

from nestegg.checkpoint.codec import encode_value, seal, unseal
from nestegg.checkpoint.formats import (
    Snapshot,
    checkpoint_body,
    checkpoint_pruned_body,
    checkpoint_saved_body,
    completed_event,
    completed_step,
    event_body,
    failure_body,
    failure_detail,
    journal_error_body,
    journal_result_body,
    parse_checkpoint,
    parse_event,
    parse_failure,
    parse_journal,
    step_completed_body,
    step_started_body,
)
from nestegg.checkpoint.step_formats import (
    block_checksum,
    block_data_keys,
    block_entries,
    block_head_body,
    block_keys_fit,
    float_text,
    parse_block_head,
    parse_step,
    record_entries,
    step_body,
    step_data,
    step_facts,
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


def test_a_step_record_writes_its_times_as_repr_does() -> None:
    """Its times are written by orjson where that is faster: the bytes are still repr's, in
    every range (plain decimals, exponents both ways, zero, the ends of the range)."""
    rng = random.Random(19)
    values = [0.0, -0.0, 1e-4, 1e16, 5e-324, 1.7976931348623157e308, math.inf, math.nan, 2.5]
    for power in range(-8, 20):
        edge = 10.0**power
        values += [edge, math.nextafter(edge, 0.0), math.nextafter(edge, math.inf)]
    values += [10 ** rng.uniform(-8.0, 18.0) for _ in range(20_000)]
    values += [round(10 ** rng.uniform(-4.0, 16.0), rng.randint(0, 9)) for _ in range(20_000)]
    values += [struct.unpack("<d", rng.randbytes(8))[0] for _ in range(20_000)]
    for value in values + [-value for value in values]:
        assert float_text(value) == repr(value).encode(), value


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


def test_the_data_of_step_records_is_found_in_place() -> None:
    [entry] = record_entries([1, 2], ["enrich", "route"], [STEP, HANDOVER]) or []
    seq, agent, raw, start, stop = entry
    assert (seq, agent, raw[start:stop]) == (1, "enrich", b'{"x":[1,"\xc3\xa9"]}')
    assert record_entries([1], ["a"], [b'{"crc":"00000000","body":{"other":1}}']) is None


def test_a_block_finds_and_checks_where_its_records_data_lies() -> None:
    body, ends = STEP + HANDOVER, [len(STEP), len(STEP + HANDOVER)]
    keys = block_data_keys(body, ends)
    assert keys == [STEP.index(b',"data":'), -1]
    assert block_keys_fit(body, ends, keys)
    assert not block_keys_fit(body, ends, [keys[0], len(STEP) + 5])  # inside the seal
    assert not block_keys_fit(body, [ends[0], ends[1] - 1], keys)  # does not end the body
    assert not block_keys_fit(body, ends, [len(STEP) - 5, -1])  # no room for the data
    [(seq, agent, raw, start, stop)] = block_entries(7, ["enrich", "route"], body, ends, keys)
    assert (seq, agent, raw[start:stop]) == (7, "enrich", b'{"x":[1,"\xc3\xa9"]}')
    assert block_data_keys(body + b'{"crc":"00000000","body":[1]}', [*ends, len(body) + 30]) is None


def test_a_block_head_is_byte_for_byte_as_stored() -> None:
    body, ends = STEP + HANDOVER, [len(STEP), len(STEP + HANDOVER)]
    head = block_head_body(7, ["enrich", "route"], body, ends)
    assert head is not None
    key = STEP.index(b',"data":')
    assert (
        head == b'{"crc":"' + head[8:16] + b'","body":{"seq":7,"agents":["enrich","route"],'
        b'"ends":[%d,%d],"data":[%d,-1],"crc":"%s"}}' % (*ends, key, block_checksum(body).encode())
    )
    parsed = parse_block_head(head, "block", 7, 2, body)
    assert parsed == (["enrich", "route"], ends, [key, -1], block_checksum(body))
    with pytest.raises(CheckpointCorruptedError, match="block does not describe its records"):
        parse_block_head(head, "block", 8, 2, body)
    assert block_head_body(7, ["a"], b'{"crc":"00000000","body":[1]}', [29]) is None


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


class Refused(Exception):
    """An exception class of a module (not a builtin)."""


def test_journal_entries_are_byte_for_byte_as_stored() -> None:
    value = encode_value({"n": 1}, "result")
    result = journal_result_body("mod.fn", "abc123", value, 1700000000.25, 0.125)
    assert unseal(result, "entry") == (
        b'{"function":"mod.fn","args":"abc123","started":1700000000.25,"duration":0.125,'
        b'"result":{"n":1}}'
    )
    error = journal_error_body("mod.fn", "abc123", ValueError("bad"), 1700000000.5, 2.0)
    assert unseal(error, "entry") == (
        b'{"function":"mod.fn","args":"abc123","started":1700000000.5,"duration":2.0,'
        b'"error":{"type":"ValueError","module":"builtins","message":"bad"}}'
    )
    local = journal_error_body("mod.fn", "abc123", Refused("no"), 1700000000.5, 2.0)
    assert unseal(local, "entry").endswith(
        b'"error":{"type":"Refused","module":"tests.checkpoint.test_formats","message":"no"}}'
    )
    parsed = parse_journal(result, "entry")
    assert (parsed["result"], parsed["started"], parsed["duration"]) == (
        {"n": 1},
        1700000000.25,
        0.125,
    )
    failed = parse_journal(error, "entry", values=True)
    assert (failed["error"]["type"], failed["duration"]) == ("ValueError", 2.0)


def test_journal_entries_written_before_call_times_were_recorded_still_read() -> None:
    old = b'{"crc":"43835d76","body":{"function":"mod.fn","args":"abc123","result":{"n":1}}}'
    entry = parse_journal(old, "entry")
    assert entry == {"function": "mod.fn", "args": "abc123", "result": {"n": 1},
                     "started": None, "duration": None}  # fmt: skip
    assert parse_journal(old, "entry", values=True)["duration"] is None


def test_a_journal_entry_of_another_shape_is_refused_by_name() -> None:
    with pytest.raises(CheckpointCorruptedError, match="entry 3/1 is not a journal entry"):
        parse_journal(seal(b"[1,2]"), "entry 3/1")


def test_events_are_byte_for_byte_as_stored() -> None:
    payload = {"seq": 1, "agent": "a", "outcome": "completed", "duration": 0.5}
    sealed = event_body(payload)
    assert sealed == (
        b'{"crc":"db99c9a3","body":{"seq":1,"agent":"a","outcome":"completed","duration":0.5}}'
    )
    assert parse_event(sealed, "event 1") == payload


def test_step_events_carry_what_the_step_record_lacks() -> None:
    started = step_started_body(4, "enrich")
    assert started == b'{"crc":"' + started[8:16] + b'","body":{"seq":4,"agent":"enrich"}}'
    assert started == event_body({"seq": 4, "agent": "enrich"})
    done = step_completed_body(4)
    assert done == b'{"crc":"' + done[8:16] + b'","body":{"seq":4}}'
    assert parse_event(done, "event") == {"seq": 4}


def test_checkpoint_events_are_the_bytes_of_their_payloads() -> None:
    saved = checkpoint_saved_body("019a2b3c4d5e-0a1b2c3d4e000007", 12, "policy")
    assert saved == (
        b'{"crc":"' + saved[8:16] + b'","body":{"checkpoint_id":"019a2b3c4d5e-0a1b2c3d4e000007",'
        b'"seq":12,"reason":"policy"}}'
    )
    payload = {"checkpoint_id": "019a2b3c4d5e-0a1b2c3d4e000007", "seq": 12, "reason": "policy"}
    assert saved == event_body(payload)
    assert checkpoint_saved_body('odd "id" \u00e9', 0, "manual") == event_body(
        {"checkpoint_id": 'odd "id" \u00e9', "seq": 0, "reason": "manual"}
    )
    pruned = checkpoint_pruned_body(["a", "b"])
    assert pruned == event_body({"checkpoint_ids": ["a", "b"]})
    assert parse_event(pruned, "event") == {"checkpoint_ids": ["a", "b"]}


def test_a_step_completed_event_reads_with_its_records_facts() -> None:
    facts = step_facts(STEP, "step 4")
    assert facts == {
        "agent": "enrich",
        "outcome": "completed",
        "target": None,
        "started": 1764000000.123456,
        "duration": 0.000123,
    }
    assert step_facts(HANDOVER, "step 5")["target"] == "other"
    assert completed_step({"seq": 4}) == 4
    shown = completed_event({"seq": 4}, facts)
    assert shown == {"seq": 4, "agent": "enrich", "outcome": "completed", "duration": 0.000123}
    assert list(shown) == ["seq", "agent", "outcome", "duration"]
    assert completed_event({"seq": 4}, None) == {"seq": 4}  # its record is gone
    assert completed_event({"seq": 4}, {"unreadable": "bad"}) == {"seq": 4, "unreadable": "bad"}


def test_a_step_completed_event_written_before_reads_as_stored() -> None:
    old = {"seq": 1, "agent": "a", "outcome": "completed", "duration": 0.5}
    assert parse_event(event_body(old), "event 1") == old
    assert completed_step(old) is None
    assert completed_event(old, step_facts(STEP, "step 1")) == old


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
    with pytest.raises(CheckpointCorruptedError, match="step 6"):
        step_facts(HANDOVER.replace(b"route", b"roule"), "step 6")
    with pytest.raises(CheckpointCorruptedError, match="checkpoint c lacks its fields"):
        parse_checkpoint(event_body([1]), "checkpoint c")  # type: ignore[arg-type]
