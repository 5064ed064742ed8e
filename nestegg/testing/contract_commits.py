"""The store contract, part two: fenced commits (append, truncate, prune, run fields),
many and long runs, big and odd bodies, concurrent writers.

Every test runs against every registered store (see :mod:`nestegg.testing`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from nestegg.checkpoint.codec import encode_value, seal, seal_json
from nestegg.checkpoint.records import JournalRecord, RunRecord, StepRecord
from nestegg.checkpoint.stores import common
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import COMPLETED, REASON_MANUAL
from nestegg.errors import RecordTooLargeError, RunNotFoundError, StaleOwnerError
from nestegg.testing.builders import (
    OWNER,
    T0,
    assert_bytes_fields,
    commit_steps,
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_journal,
    make_run,
    make_step,
    snapshot,
)
from nestegg.testing.fixtures import StoreFactory

MEGABYTE = 1 << 20


# --- commits ----------------------------------------------------------------------------


async def test_commit_appends_everything_and_reads_it_back(store: CheckpointStorage) -> None:
    run = await create(store)
    rid = run.run_id
    steps = [make_step(rid, seq, agent=f"agent-{seq % 2}") for seq in range(1, 6)]
    events = [make_event(rid, seq) for seq in range(1, 8)]
    journal = [make_journal(rid, 2, position) for position in (2, 0, 1)]
    checkpoints = [make_checkpoint(rid, seq) for seq in (1, 3, 5)]
    await store.commit(
        make_commit(run, steps=steps, events=events, journal=journal, checkpoints=checkpoints)
    )
    assert await store.load_steps(rid) == steps
    assert await store.load_steps(rid, after=2) == steps[2:]
    assert await store.load_steps(rid, upto=3) == steps[:3]
    assert await store.load_steps(rid, after=1, upto=4) == steps[1:4]
    assert await store.load_steps(rid, after=4, upto=2) == []
    assert await store.load_steps(rid, after=5) == []
    assert await store.read_events(rid) == events
    assert await store.read_events(rid, since_seq=3) == events[3:]
    assert await store.read_events(rid, limit=2) == events[:2]
    assert await store.read_events(rid, since_seq=2, limit=3) == events[2:5]
    assert await store.read_events(rid, since_seq=7) == []
    assert await store.read_journal(rid, 2) == sorted(journal, key=lambda e: e.position)
    assert await store.read_journal(rid, 3) == []
    assert await store.list_checkpoints(rid) == checkpoints
    for checkpoint in checkpoints:
        assert await store.get_checkpoint(checkpoint.checkpoint_id) == checkpoint
    assert await store.get_checkpoint("0000-nope") is None
    assert_bytes_fields(
        *await store.load_steps(rid),
        *await store.read_events(rid),
        *await store.read_journal(rid, 2),
        *await store.list_checkpoints(rid),
    )


async def test_commits_accumulate(store: CheckpointStorage) -> None:
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 6), checkpoints=True)
    assert await store.load_steps(run.run_id) == steps
    assert [e.seq for e in await store.read_events(run.run_id)] == [1, 2, 3, 4, 5]
    assert [c.seq for c in await store.list_checkpoints(run.run_id)] == [1, 2, 3, 4, 5]
    stored = await store.get_run(run.run_id)
    assert stored is not None
    assert (stored.step_seq, stored.event_seq, stored.updated_at) == (5, 5, T0 + 1005)


async def test_checkpoints_at_one_seq_list_oldest_id_first(store: CheckpointStorage) -> None:
    run = await create(store)
    first, second = make_checkpoint(run.run_id, 2), make_checkpoint(run.run_id, 2)
    assert first.checkpoint_id < second.checkpoint_id
    manual = make_checkpoint(run.run_id, 4, reason=REASON_MANUAL)
    await store.commit(make_commit(run, checkpoints=[manual, second, first]))
    assert await store.list_checkpoints(run.run_id) == [first, second, manual]


def _everything_commit(run: RunRecord, fence: int, prune: list[str]) -> Any:
    rid = run.run_id
    return make_commit(
        run,
        fence=fence,
        steps=[make_step(rid, 4), make_step(rid, 2, agent="again")],
        events=[make_event(rid, 4)],
        journal=[make_journal(rid, 4, 0), make_journal(rid, 1, 0)],
        checkpoints=[make_checkpoint(rid, 4)],
        prune=prune,
        truncate_after=1,
        status=COMPLETED,
        result=seal_json("done"),
        error=seal_json("err"),
        lease_until=T0 + 999,
        step_seq=4,
        event_seq=4,
        updated_at=T0 + 999,
    )


async def test_a_journal_entry_written_again_replaces_the_first(
    store: CheckpointStorage,
) -> None:
    """A call made again at its position (``replay="rerun"``, a failed run's resume) is
    journaled over its first outcome: the store keeps one entry per position, the last."""
    run = await create(store)
    rid = run.run_id
    first, other = make_journal(rid, 2, 0), make_journal(rid, 2, 1)
    await store.commit(make_commit(run, journal=[first, other]))
    again = JournalRecord(rid, 2, 0, seal_json({"function": "fetch", "again": True}))
    await store.commit(make_commit(run, journal=[again]))
    assert await store.read_journal(rid, 2) == [again, other]


@pytest.mark.parametrize("fence_delta", [-1, 1])
async def test_stale_fence_commit_changes_nothing(
    store: CheckpointStorage, fence_delta: int
) -> None:
    run = await create(store, fence=3)
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    await store.commit(make_commit(run, journal=[make_journal(run.run_id, 1, 0)]))
    before = await snapshot(store, run.run_id)
    prune = [c.checkpoint_id for c in before[3]]
    with pytest.raises(StaleOwnerError):
        await store.commit(_everything_commit(run, run.fence + fence_delta, prune))
    assert await snapshot(store, run.run_id) == before


async def test_commit_to_missing_run_raises_not_found(store: CheckpointStorage) -> None:
    ghost = make_run("run-ghost")
    with pytest.raises(RunNotFoundError):
        await store.commit(_everything_commit(ghost, ghost.fence, []))
    assert await snapshot(store, "run-ghost") == (None, [], [], [], [], [[]] * 10)
    assert await store.list_runs() == []


async def test_a_commit_past_the_size_limit_is_refused_naming_its_step_and_stores_nothing(
    store: CheckpointStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    before = await snapshot(store, run.run_id)
    journal = [make_journal(run.run_id, 3, position) for position in range(8)]
    size = sum(len(entry.body) for entry in journal)
    monkeypatch.setattr(common, "COMMIT_MAX_BYTES", size - 1)
    commit = make_commit(run, steps=[make_step(run.run_id, 3)], journal=journal, step_seq=3)
    with pytest.raises(RecordTooLargeError) as refused:
        await store.commit(commit)
    error = refused.value
    assert error.path == f"the commit of step 3 of run {run.run_id!r}"
    assert (error.size, error.limit) == (commit.size(), size - 1)
    assert error.path in str(error) and f"{size - 1:,} bytes" in str(error)
    assert await snapshot(store, run.run_id) == before
    await store.commit(make_commit(run, journal=journal[:-1]))  # under the limit: stored
    assert len(await store.read_journal(run.run_id, 3)) == 7


async def test_prune_deletes_the_named_checkpoints_only(store: CheckpointStorage) -> None:
    run, other = await create(store), await create(store)
    await commit_steps(store, run, range(1, 5), checkpoints=True)
    await commit_steps(store, other, range(1, 3), checkpoints=True)
    mine, theirs = (
        await store.list_checkpoints(run.run_id),
        await store.list_checkpoints(other.run_id),
    )
    prune = [mine[0].checkpoint_id, mine[2].checkpoint_id, "0000-unknown", theirs[0].checkpoint_id]
    await store.commit(make_commit(run, prune=prune))
    assert await store.list_checkpoints(run.run_id) == [mine[1], mine[3]]
    assert await store.get_checkpoint(mine[0].checkpoint_id) is None
    assert await store.get_checkpoint(mine[1].checkpoint_id) == mine[1]
    assert await store.list_checkpoints(other.run_id) == theirs
    assert await store.get_checkpoint(theirs[0].checkpoint_id) == theirs[0]
    assert len(await store.load_steps(run.run_id)) == 4


async def test_prune_applies_after_the_append(store: CheckpointStorage) -> None:
    run = await create(store)
    kept, pruned = make_checkpoint(run.run_id, 1), make_checkpoint(run.run_id, 1)
    await store.commit(make_commit(run, checkpoints=[kept, pruned], prune=[pruned.checkpoint_id]))
    assert await store.list_checkpoints(run.run_id) == [kept]
    assert await store.get_checkpoint(pruned.checkpoint_id) is None


async def test_truncate_after_drops_later_steps_and_checkpoints(store: CheckpointStorage) -> None:
    run = await create(store)
    rid = run.run_id
    steps = await commit_steps(store, run, range(1, 6), checkpoints=True)
    await store.commit(make_commit(run, journal=[make_journal(rid, 4, 0)]))
    old = await store.list_checkpoints(rid)
    redo_step, redo_checkpoint = make_step(rid, 4, agent="redo"), make_checkpoint(rid, 4)
    await store.commit(
        make_commit(
            run,
            truncate_after=3,
            steps=[redo_step],
            checkpoints=[redo_checkpoint],
            events=[make_event(rid, 6)],
        )
    )
    assert await store.load_steps(rid) == [*steps[:3], redo_step]
    assert await store.list_checkpoints(rid) == [*old[:3], redo_checkpoint]
    assert await store.get_checkpoint(old[4].checkpoint_id) is None
    assert [e.seq for e in await store.read_events(rid)] == [1, 2, 3, 4, 5, 6]
    assert await store.read_journal(rid, 4) == []


async def test_truncate_after_drops_the_journal_of_later_steps_only(
    store: CheckpointStorage,
) -> None:
    run, other = await create(store), await create(store)
    rid = run.run_id
    await commit_steps(store, run, range(1, 6))
    journal = {step: [make_journal(rid, step, p) for p in range(2)] for step in range(1, 7)}
    await store.commit(make_commit(run, journal=[e for step in journal for e in journal[step]]))
    others = [make_journal(other.run_id, step, 0) for step in range(1, 7)]
    await store.commit(make_commit(other, journal=others))
    kept = make_journal(rid, 5, 1)
    await store.commit(make_commit(run, truncate_after=3, journal=[kept]))

    assert [await store.read_journal(rid, step) for step in range(1, 4)] == [
        journal[step] for step in range(1, 4)
    ]
    assert await store.read_journal(rid, 4) == []
    assert await store.read_journal(rid, 5) == [kept]
    assert await store.read_journal(rid, 6) == []
    assert [await store.read_journal(other.run_id, step) for step in range(1, 7)] == [
        [entry] for entry in others
    ]
    await store.commit(make_commit(run, truncate_after=0))
    assert [await store.read_journal(rid, step) for step in range(1, 7)] == [[]] * 6


async def test_a_truncation_keeps_the_journal_through_journal_after(
    store: CheckpointStorage,
) -> None:
    run = await create(store)
    rid = run.run_id
    await commit_steps(store, run, range(1, 6))
    journal = [make_journal(rid, step, 0) for step in range(1, 7)]
    await store.commit(make_commit(run, journal=journal))
    await store.commit(make_commit(run, truncate_after=2, journal_after=4))

    assert [s.seq for s in await store.load_steps(rid)] == [1, 2]
    assert [await store.read_journal(rid, step) for step in range(1, 7)] == [
        [entry] for entry in journal[:4]
    ] + [[], []]


async def test_truncate_after_zero_drops_every_step(store: CheckpointStorage) -> None:
    run = await create(store)
    await commit_steps(store, run, range(1, 4), checkpoints=True)
    await store.commit(make_commit(run, truncate_after=0))
    assert await store.load_steps(run.run_id) == []
    assert await store.list_checkpoints(run.run_id) == []
    assert len(await store.read_events(run.run_id)) == 3


async def test_recommitting_a_step_after_truncation_replaces_it(store: CheckpointStorage) -> None:
    run = await create(store)
    rid = run.run_id
    steps = await commit_steps(store, run, range(1, 4))
    await store.commit(make_commit(run, truncate_after=1, step_seq=1))
    assert await store.load_steps(rid) == steps[:1]
    again = [make_step(rid, 2, agent="b", data="x" * 50), make_step(rid, 3, agent="c")]
    for step in again:
        await store.commit(make_commit(run, steps=[step], step_seq=step.seq))
    assert await store.load_steps(rid) == [steps[0], *again]
    assert await store.load_steps(rid, after=1, upto=2) == again[:1]


RUN_FIELD_VALUES: dict[str, Any] = {
    "status": COMPLETED,
    "result": seal_json({"result": [1, 2]}),
    "error": seal_json({"error": "x"}),
    "lease_until": T0 + 777.25,
    "step_seq": 17,
    "event_seq": 23,
    "updated_at": T0 + 555.5,
}


@pytest.mark.parametrize("field_name", sorted(RUN_FIELD_VALUES))
async def test_commit_updates_only_the_run_fields_it_sets(
    store: CheckpointStorage, field_name: str
) -> None:
    run = await create(
        store, owner=OWNER, lease_until=T0 + 1, fence=4, step_seq=2, event_seq=3, parent_run="p"
    )
    value = RUN_FIELD_VALUES[field_name]
    await store.commit(make_commit(run, **{field_name: value}))
    assert await store.get_run(run.run_id) == dataclasses.replace(run, **{field_name: value})


async def test_commit_with_no_fields_changes_no_run_field(store: CheckpointStorage) -> None:
    run = await create(store, result=seal_json(1), error=seal_json(2), lease_until=T0 + 3)
    await store.commit(make_commit(run))
    assert await store.get_run(run.run_id) == run


async def test_commit_sets_several_run_fields_at_once(store: CheckpointStorage) -> None:
    run = await create(store)
    await store.commit(make_commit(run, **RUN_FIELD_VALUES))
    assert await store.get_run(run.run_id) == dataclasses.replace(run, **RUN_FIELD_VALUES)


# --- many runs, long runs, big and odd bodies -------------------------------------------


async def test_interleaved_runs_stay_isolated(store: CheckpointStorage) -> None:
    runs = [await create(store, pipeline=f"p{i % 3}") for i in range(12)]
    for seq in range(1, 9):
        await asyncio.gather(*(commit_steps(store, run, [seq], checkpoints=True) for run in runs))
    for run in runs:
        steps = await store.load_steps(run.run_id)
        assert steps == [make_step(run.run_id, seq) for seq in range(1, 9)]
        assert [e.run_id for e in await store.read_events(run.run_id)] == [run.run_id] * 8
        checkpoints = await store.list_checkpoints(run.run_id)
        assert [(c.run_id, c.seq) for c in checkpoints] == [(run.run_id, s) for s in range(1, 9)]
    assert len(await store.list_runs(pipeline="p1")) == 4


async def test_a_thousand_steps_load_in_order(store: CheckpointStorage) -> None:
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 1001))
    assert await store.load_steps(run.run_id) == steps
    assert await store.load_steps(run.run_id, after=990) == steps[990:]
    assert await store.load_steps(run.run_id, after=99, upto=200) == steps[99:200]
    assert len(await store.read_events(run.run_id, since_seq=500, limit=100)) == 100
    stored = await store.get_run(run.run_id)
    assert stored is not None and stored.step_seq == 1000


async def _round_trip_everywhere(store: CheckpointStorage, body: bytes) -> None:
    run = make_run("run-body", result=body, error=body)
    run.input = body
    await store.create_run(run)
    step = StepRecord(run_id=run.run_id, seq=1, agent="big", body=body)
    event = make_event(run.run_id, 1)._replace(body=body)
    entry = JournalRecord(run_id=run.run_id, step=1, position=0, body=body)
    checkpoint = make_checkpoint(run.run_id, 1)._replace(body=body)
    await store.commit(
        make_commit(run, steps=[step], events=[event], journal=[entry], checkpoints=[checkpoint])
    )
    assert await store.get_run(run.run_id) == run
    assert await store.load_steps(run.run_id) == [step]
    assert await store.read_events(run.run_id) == [event]
    assert await store.read_journal(run.run_id, 1) == [entry]
    assert await store.list_checkpoints(run.run_id) == [checkpoint]
    assert await store.get_checkpoint(checkpoint.checkpoint_id) == checkpoint


async def test_megabyte_bodies_round_trip(store: CheckpointStorage) -> None:
    value = {"text": "0123456789abcdef" * (MEGABYTE // 16), "bytes": bytes(range(256)) * 64}
    body = seal(encode_value(value))
    assert len(body) > MEGABYTE
    await _round_trip_everywhere(store, body)


# One character per UTF-8 lead byte, plus every character below U+0800.
EVERY_UTF8_LEAD = (
    [chr(c) for c in range(0x800)]
    + [chr(0x800)]
    + [chr(lead << 12) for lead in range(1, 16) if lead != 0xD]
    + [chr(0xD000)]
    + [chr(c) for c in (0xFFFD, 0xFFFF, 0x1F600, 0x40000, 0x80000, 0xC0000, 0x10FFFF)]
)
VALID_JSON_BYTES = set(range(0x20, 0x80)) | set(range(0x80, 0xC0)) | set(range(0xC2, 0xF5))
HAND_WRITTEN_JSON = (
    b'{ "a" : [1 , 2.50, -0.0, 1E-7, 10e+2],\n\t"\\u00e9\\/\\"\\\\\\b\\f\\n\\r\\t":\r\n'
    b' "\\ud83d\\ude00 \\u0000 \\u001f", "deep": [[[[{}]]]], "empty": "" }  '
)


async def test_bodies_with_every_utf8_byte_value_round_trip(store: CheckpointStorage) -> None:
    text = "".join(EVERY_UTF8_LEAD)
    body = encode_value({text: [text, "\\u0000", "\\", '"', "'", "$ne", None]})
    assert set(body) == VALID_JSON_BYTES
    await _round_trip_everywhere(store, seal(body))


async def test_hand_written_json_bodies_round_trip_byte_for_byte(
    store: CheckpointStorage,
) -> None:
    await _round_trip_everywhere(store, seal(HAND_WRITTEN_JSON))


async def test_concurrent_commits_through_two_handles_lose_nothing(
    store: CheckpointStorage, store_factory: StoreFactory
) -> None:
    other = await store_factory()
    run = await create(store)
    rid = run.run_id

    async def write(handle: CheckpointStorage, seq: int) -> None:
        await handle.commit(
            make_commit(
                run,
                steps=[make_step(rid, seq)],
                events=[make_event(rid, seq)],
                journal=[make_journal(rid, seq, 0)],
                checkpoints=[make_checkpoint(rid, seq)],
            )
        )

    await asyncio.gather(*(write(store if seq % 2 else other, seq) for seq in range(1, 41)))
    assert await store.load_steps(rid) == [make_step(rid, seq) for seq in range(1, 41)]
    assert sorted(e.seq for e in await other.read_events(rid)) == list(range(1, 41))
    assert [c.seq for c in await store.list_checkpoints(rid)] == list(range(1, 41))
    assert await other.read_journal(rid, 17) == [make_journal(rid, 17, 0)]
