"""Step blocks: packing records, reading them back, checking a block at once, merging
blocks with loose records, and history entries from blocks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nestegg.checkpoint.codec import seal, seal_json
from nestegg.checkpoint.loader import _history_entries
from nestegg.checkpoint.records import StepBlock, StepRecord
from nestegg.checkpoint.step_blocks import (
    block_where,
    body_intact,
    merged,
    pack_block,
    read_head,
    step_records,
    unpack_block,
)
from nestegg.checkpoint.views import StoredHistory
from nestegg.errors import CheckpointCorruptedError
from tests.checkpoint.test_loader import MIXED, step_record


def records_of(items: list[tuple[int, str, Any]]) -> list[StepRecord]:
    return [step_record(seq, agent, data) for seq, agent, data in items]


def block_of(records: list[StepRecord]) -> StepBlock:
    block = pack_block(records)
    assert block is not None
    return block


def flipped(raw: bytes, at: int) -> bytes:
    return raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :]


LONG = [(seq, f"agent-{seq % 3}", {"seq": seq} if seq % 4 else None) for seq in range(1, 41)]


def test_a_block_gives_back_its_records_byte_for_byte() -> None:
    records = records_of(LONG)
    block = block_of(records)
    assert (block.run_id, block.first_seq, block.last_seq) == ("r", 1, 40)
    assert block.body == b"".join(record.body for record in records)
    head = read_head(block)
    assert head.agents == [agent for _, agent, _ in LONG]
    assert body_intact(block, head)
    assert unpack_block(block) == records == step_records([block])


def test_records_must_be_consecutive() -> None:
    records = records_of(LONG[:3])
    with pytest.raises(ValueError, match="consecutive"):
        pack_block([records[0], records[2]])


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(lambda body: flipped(body, 30), id="damaged"),
        pytest.param(lambda body: b"plain bytes", id="not-sealed"),
        pytest.param(lambda body: seal_json({"data": 1, "agent": "a"}), id="another-layout"),
    ],
)
def test_a_damaged_or_unusual_record_is_not_packed(odd: Any) -> None:
    records = records_of(LONG)
    records[17] = records[17]._replace(body=odd(records[17].body))
    assert pack_block(records) is None


def test_a_damaged_head_is_corrupted_naming_the_block() -> None:
    block = block_of(records_of(LONG))
    for at in range(0, len(block.head), 7):
        damaged = block._replace(head=flipped(block.head, at))
        with pytest.raises(CheckpointCorruptedError, match="the block of steps 1 to 40 of run 'r'"):
            read_head(damaged)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"first_seq": 2, "last_seq": 41}, id="another-block's-head"),
        pytest.param({"last_seq": 39}, id="fewer-steps"),
        pytest.param({"body": b"x"}, id="shorter-body"),
    ],
)
def test_a_head_that_does_not_fit_its_block_is_corrupted(change: dict[str, Any]) -> None:
    block = block_of(records_of(LONG))._replace(**change)
    with pytest.raises(CheckpointCorruptedError, match="does not describe its records"):
        read_head(block)


@pytest.mark.parametrize(
    "head",
    [
        {"seq": 1, "agents": ["a"], "ends": [5], "data": [-1]},
        {"seq": 1, "agents": [1], "ends": [5], "data": [-1], "crc": "0"},
        {"seq": 1, "agents": ["a"], "ends": ["5"], "data": [-1], "crc": "0"},
        {"seq": 1, "agents": ["a"], "ends": [5], "data": [None], "crc": "0"},
        {"seq": 1, "agents": ["a", "b"], "ends": [3, 2], "data": [-1, -1], "crc": "0"},
        [1, 2],
    ],
)
def test_a_sealed_head_of_the_wrong_shape_is_corrupted(head: Any) -> None:
    ends = head["ends"] if isinstance(head, dict) else [5]
    size = ends[-1] if isinstance(ends[-1], int) else 5
    block = StepBlock("r", 1, len(ends), seal_json(head), b"x" * size)
    with pytest.raises(CheckpointCorruptedError, match="does not describe its records"):
        read_head(block)


def _with_data_keys(block: StepBlock, change: Any) -> StepBlock:
    head = read_head(block)
    fields = {"seq": block.first_seq, "agents": head.agents, "ends": head.ends}
    data = change(list(head.data_keys))
    return block._replace(head=seal_json({**fields, "data": data, "crc": head.checksum}))


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda keys: [-5] * len(keys), id="negative"),
        pytest.param(lambda keys: [0] * len(keys), id="in-the-seal"),
        pytest.param(lambda keys: [10**9] * len(keys), id="past-the-end"),
        pytest.param(lambda keys: [*keys[1:], keys[0]], id="another-record's"),
        pytest.param(lambda keys: [7 if k == -1 else k for k in keys], id="where-there-is-none"),
    ],
)
def test_data_offsets_outside_their_records_body_are_corrupted(change: Any) -> None:
    block = block_of(records_of(LONG))
    assert read_head(_with_data_keys(block, lambda keys: keys)) == read_head(block)
    with pytest.raises(CheckpointCorruptedError, match="does not describe its records"):
        read_head(_with_data_keys(block, change))


def test_a_data_offset_off_within_its_record_fails_when_the_history_is_decoded() -> None:
    records = records_of(LONG)
    block = _with_data_keys(block_of(records), lambda keys: [keys[0] + 1, *keys[1:]])
    entries = _history_entries([block], "r")
    history = StoredHistory("r", {"source": "input", "data": 0}, entries)
    with pytest.raises(CheckpointCorruptedError, match="data of step 1 of run 'r'"):
        history.decode()


def test_any_flipped_byte_of_the_body_fails_the_blocks_checksum() -> None:
    block = block_of(records_of(LONG))
    head = read_head(block)
    for at in range(0, len(block.body), 13):
        assert not body_intact(block._replace(body=flipped(block.body, at)), head)


# ----------------------------------------------------------------- history entries


def test_history_entries_from_a_block_are_those_of_its_records() -> None:
    records = records_of(LONG)
    from_records = _history_entries(records, "r")
    from_block = _history_entries([block_of(records)], "r")
    first = {"source": "input", "data": 0}
    assert [e[:2] for e in from_block] == [e[:2] for e in from_records]
    assert (
        StoredHistory("r", first, from_block).decode()
        == StoredHistory("r", first, from_records).decode()
    )


@given(st.lists(st.sampled_from(["loose", "block"]), max_size=6))
def test_history_entries_from_blocks_and_loose_records_in_any_mix(kinds: list[str]) -> None:
    pieces: list[StepRecord | StepBlock] = []
    records: list[StepRecord] = []
    seq = 1
    for kind in kinds:
        part = records_of([(s, "a", s if s % 2 else None) for s in range(seq, seq + 4)])
        pieces += [block_of(part)] if kind == "block" else part
        records += part
        seq += 4
    from_pieces, from_records = _history_entries(pieces, "r"), _history_entries(records, "r")
    assert [e[:2] for e in from_pieces] == [e[:2] for e in from_records]
    first = {"source": "input", "data": 0}
    assert (
        StoredHistory("r", first, from_pieces).decode()
        == StoredHistory("r", first, from_records).decode()
    )


def test_a_damaged_record_in_a_block_is_named() -> None:
    records = records_of(MIXED)
    block = block_of(records)
    at = len(records[0].body) + len(records[1].body) + 40  # inside step 3's body
    damaged = block._replace(body=flipped(block.body, at))
    with pytest.raises(CheckpointCorruptedError, match="step 3 of run 'r' failed its checksum"):
        _history_entries([damaged], "r")


def test_a_block_whose_records_pass_but_whose_checksum_fails_is_named() -> None:
    block = block_of(records_of(MIXED))
    head = seal_json({**_head_json(block), "crc": "00000000"})
    with pytest.raises(CheckpointCorruptedError, match=f"{block_where(block)} failed"):
        _history_entries([block._replace(head=head)], "r")


def _head_json(block: StepBlock) -> dict[str, Any]:
    head = read_head(block)
    return {
        "seq": block.first_seq,
        "agents": head.agents,
        "ends": head.ends,
        "data": head.data_keys,
    }


# ----------------------------------------------------------------------- merging


def test_merged_gives_blocks_whole_and_loose_records_around_them() -> None:
    records = records_of([(s, "a", s) for s in range(1, 13)])
    first, second = block_of(records[0:4]), block_of(records[4:8])
    loose = records[8:]
    assert merged([first, second], loose, 0, 12) == [first, second, *loose]
    assert step_records(merged([first, second], loose, 0, 12)) == records


@pytest.mark.parametrize(("after", "upto"), [(0, 6), (2, 12), (3, 5), (4, 8), (5, 5), (0, 0)])
def test_merged_unpacks_a_block_cut_by_the_range(after: int, upto: int) -> None:
    records = records_of([(s, "a", s) for s in range(1, 13)])
    blocks = [block_of(records[0:4]), block_of(records[4:8])]
    loose = [r for r in records[8:] if after < r.seq <= upto]
    assert step_records(merged(blocks, loose, after, upto)) == records[after:upto]


def test_a_loose_record_replaces_the_blocks_record_of_its_seq() -> None:
    records = records_of([(s, "a", s) for s in range(1, 9)])
    block = block_of(records[0:4])
    newer = step_record(3, "newer", "again")
    pieces = merged([block], [newer, *records[4:]], 0, 8)
    assert step_records(pieces) == [*records[:2], newer, *records[3:]]
    assert StepBlock not in {type(piece) for piece in pieces}


def test_unsealed_bodies_are_a_plain_record_list() -> None:
    plain = StepRecord("r", 1, "a", seal(b"{}"))
    assert step_records([plain]) == [plain]
