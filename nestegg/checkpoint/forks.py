"""Fork and time travel: continue from any checkpoint on a new run; draw a run's tree."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from nestegg.agents import check_name, to_plain
from nestegg.checkpoint.checkpointer import Snapshot, checkpoint_body
from nestegg.checkpoint.codec import encode_value, seal, unseal
from nestegg.checkpoint.loader import load_state
from nestegg.checkpoint.ownership import current_owner
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    new_checkpoint_id,
    new_run_id,
)
from nestegg.checkpoint.views import (
    CheckpointInfo,
    HistoryCheckpoint,
    RunHistory,
    RunInfo,
    StepInfo,
)
from nestegg.constants import REASON_FORK, RUN_FORKED, RUNNING
from nestegg.errors import ConfigurationError, RunExistsError
from nestegg.task import StepListeners

if TYPE_CHECKING:
    from nestegg.checkpoint.runs import RunBook


async def fork(
    book: RunBook,
    checkpoint_id: str,
    data: Any,
    run_id: str | None,
    listeners: StepListeners,
) -> Any:
    """Start a new run from ``checkpoint_id`` (with ``data`` replaced unless None)."""
    record = await book._checkpoint(checkpoint_id)
    parent = await book._get(record.run_id)
    if parent.pipeline != book.clutch.name:
        raise ConfigurationError(
            f"checkpoint {checkpoint_id!r} belongs to pipeline {parent.pipeline!r}, "
            f"not {book.clutch.name!r}"
        )
    book.clutch.validate()
    state = await load_state(book.store, parent, record)
    new_id = check_name(run_id, "run id") if run_id is not None else new_run_id()
    inline = encode_value(to_plain(data), "data") if data is not None else None
    if inline is None and state.data_inline:
        inline = encode_value(state.data, "data")
    snapshot = Snapshot(
        state.seq,
        state.turn,
        state.data_seq,
        state.source,
        state.position,
        encode_value(state.metadata, "metadata"),
        inline,
    )
    now = time.time()
    child = replace(
        parent,
        run_id=new_id,
        status=RUNNING,
        created_at=now,
        updated_at=now,
        fence=1,
        owner=current_owner(),
        lease_until=now + book.lease,
        result=None,
        error=None,
        step_seq=state.seq,
        event_seq=1,
        parent_run=parent.run_id,
        parent_checkpoint=checkpoint_id,
    )
    if await book.store.get_run(new_id) is not None:
        raise RunExistsError(f"run {new_id!r} exists; choose another run_id", new_id)
    await book.store.create_run(child)
    start = CheckpointRecord(
        new_checkpoint_id(),
        new_id,
        state.seq,
        now,
        REASON_FORK,
        seal(checkpoint_body(snapshot, state.next_agent)),
    )
    copied = await book.store.load_steps(parent.run_id, 0, state.seq)
    steps = [step._replace(run_id=new_id) for step in copied]
    payload = {"parent_run": parent.run_id, "parent_checkpoint": checkpoint_id}
    forked = EventRecord(new_id, 1, now, RUN_FORKED, seal(orjson.dumps(payload)))
    await book.store.commit(
        Commit(new_id, 1, steps=steps, events=[forked], checkpoints=[start], updated_at=now)
    )
    child_state = await load_state(book.store, child, start)
    return await book._resume(child, child_state, [start.checkpoint_id], listeners)


async def history(book: RunBook, run_id: str) -> RunHistory:
    """The run's steps and checkpoints with parents, and the runs forked from it."""
    run = await book._get(check_name(run_id, "run id"))
    records = await book.store.load_steps(run.run_id)
    steps = []
    for record in records:
        body = orjson.loads(unseal(record.body, f"step {record.seq} of run {run.run_id!r}"))
        steps.append(
            StepInfo(
                seq=record.seq,
                agent=record.agent,
                outcome=str(body.get("outcome")),
                started=datetime.fromtimestamp(float(body.get("started", 0.0)), UTC),
                duration=float(body.get("duration", 0.0)),
                produced_data="data" in body,
            )
        )
    checkpoints = []
    previous = run.parent_checkpoint
    for checkpoint in await book.store.list_checkpoints(run.run_id):
        checkpoints.append(HistoryCheckpoint(CheckpointInfo.from_record(checkpoint), previous))
        previous = checkpoint.checkpoint_id
    forks = [
        RunInfo.from_record(r)
        for r in await book.store.list_runs(pipeline=run.pipeline)
        if r.parent_run == run.run_id
    ]
    return RunHistory(RunInfo.from_record(run), steps, checkpoints, forks)
