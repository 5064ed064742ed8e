"""A step's facts are stored once: ``step_completed`` events hold the step's seq alone and
are read back, by the API and the command, with the agent, outcome and duration of the
step record; events written before (holding those themselves) read as they always did."""

from __future__ import annotations

from nestegg.checkpoint.event_log import read_events
from nestegg.checkpoint.formats import event_body, parse_event, step_completed_body
from nestegg.checkpoint.records import Commit, EventRecord, StepRecord
from nestegg.checkpoint.step_formats import step_body
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import RUN_RESUMED, STEP_COMPLETED
from nestegg.testing.builders import create

from .conftest import Pipeline

OLD_PAYLOAD = {"seq": 1, "agent": "a", "outcome": "completed", "duration": 0.5}


def step(run_id: str, seq: int, agent: str, duration: float) -> StepRecord:
    body = step_body(agent, "completed", None, 100.0 + seq, duration, b'"x"')
    return StepRecord(run_id, seq, agent, body)


def completed(run_id: str, seq: int, step_seq: int, body: bytes | None = None) -> EventRecord:
    body = step_completed_body(step_seq) if body is None else body
    return EventRecord(run_id, seq, 200.0 + seq, STEP_COMPLETED, body)


async def test_step_completed_events_hold_the_seq_and_read_with_the_records_facts(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, ("a", "b"))
    await pipeline.clutch.run([], run_id="once")
    stored = await checkpoint_store.read_events("once")
    slim = [parse_event(e.body, "event") for e in stored if e.kind == STEP_COMPLETED]
    assert slim == [{"seq": 1}, {"seq": 2}]

    events = [e for e in await pipeline.clutch.events("once") if e.kind == STEP_COMPLETED]
    steps = (await pipeline.clutch.history("once")).steps
    assert [e.data for e in events] == [
        {"seq": s.seq, "agent": s.agent, "outcome": "completed", "duration": s.duration}
        for s in steps
    ]
    assert list(events[0].data) == ["seq", "agent", "outcome", "duration"]
    later = await pipeline.clutch.events("once", since_seq=events[1].seq - 1)
    assert later[0].data == events[1].data


async def test_events_written_before_keep_their_own_facts(
    checkpoint_store: CheckpointStorage,
) -> None:
    run = await create(checkpoint_store)
    records = [step(run.run_id, 1, "a", 9.0), step(run.run_id, 2, "b", 0.25)]
    events = [
        completed(run.run_id, 1, 1, event_body(OLD_PAYLOAD)),  # as versions before wrote it
        completed(run.run_id, 2, 2),
    ]
    await checkpoint_store.commit(
        Commit(run.run_id, run.fence, steps=records, events=events, step_seq=2, event_seq=2)
    )
    read = await read_events(checkpoint_store, run.run_id)
    assert [e.data for e in read] == [
        OLD_PAYLOAD,
        {"seq": 2, "agent": "b", "outcome": "completed", "duration": 0.25},
    ]


async def test_an_attempt_whose_record_a_resume_dropped_shows_its_seq_alone(
    checkpoint_store: CheckpointStorage,
) -> None:
    run = await create(checkpoint_store)
    rid = run.run_id
    first = [step(rid, 1, "a", 1.0), step(rid, 2, "b", 2.0)]
    events = [completed(rid, 1, 1), completed(rid, 2, 2)]
    await checkpoint_store.commit(
        Commit(rid, run.fence, steps=first, events=events, step_seq=2, event_seq=2)
    )
    resumed = EventRecord(rid, 3, 300.0, RUN_RESUMED, event_body({"seq": 1, "previous": "x"}))
    await checkpoint_store.commit(
        Commit(
            rid,
            run.fence,
            truncate_after=1,
            steps=[step(rid, 2, "b", 3.0)],
            events=[resumed, completed(rid, 4, 2)],
            step_seq=2,
            event_seq=4,
        )
    )
    read = [e.data for e in await read_events(checkpoint_store, rid)]
    assert read == [
        {"seq": 1, "agent": "a", "outcome": "completed", "duration": 1.0},
        {"seq": 2},  # the first attempt of step 2: its record is gone
        {"seq": 1, "previous": "x"},
        {"seq": 2, "agent": "b", "outcome": "completed", "duration": 3.0},
    ]
    assert [e.data for e in await read_events(checkpoint_store, rid, 2)] == read[2:]


async def test_a_damaged_step_record_makes_its_event_unreadable_not_the_log(
    checkpoint_store: CheckpointStorage,
) -> None:
    run = await create(checkpoint_store)
    good = step(run.run_id, 1, "a", 1.0)
    damaged = good._replace(body=good.body.replace(b'"a"', b'"z"'))
    await checkpoint_store.commit(
        Commit(
            run.run_id,
            run.fence,
            steps=[damaged],
            events=[completed(run.run_id, 1, 1)],
            step_seq=1,
            event_seq=1,
        )
    )
    [event] = await read_events(checkpoint_store, run.run_id)
    assert event.data["seq"] == 1 and "step 1" in event.data["unreadable"]


async def test_events_of_steps_packed_in_blocks_read_their_records(
    checkpoint_store: CheckpointStorage,
) -> None:
    run = await create(checkpoint_store)
    rid, count = run.run_id, 300  # SQLite packs steps 1-256 in a block
    for seq in range(1, count + 1):
        await checkpoint_store.commit(
            Commit(
                rid,
                run.fence,
                steps=[step(rid, seq, f"agent{seq % 3}", seq / 1000)],
                events=[completed(rid, seq, seq)],
                step_seq=seq,
                event_seq=seq,
            )
        )
    read = await read_events(checkpoint_store, rid)
    assert [e.data for e in read] == [
        {"seq": seq, "agent": f"agent{seq % 3}", "outcome": "completed", "duration": seq / 1000}
        for seq in range(1, count + 1)
    ]
