"""Reading step records on resume: the data found without decoding, other shapes parsed."""

from __future__ import annotations

import orjson
import pytest

from nestegg.checkpoint.codec import decode_value, encode_value
from nestegg.checkpoint.loader import step_data
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
