"""Fork and time travel: continue from any checkpoint on a new run; draw a run's tree."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from nestegg.agents import to_plain
from nestegg.checkpoint.admission import fork_start
from nestegg.checkpoint.codec import decode_value, encode_value, seal
from nestegg.checkpoint.formats import checkpoint_body, event_body
from nestegg.checkpoint.given import GivenData
from nestegg.checkpoint.ownership import current_owner
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    RunRecord,
    StepRecord,
    new_checkpoint_id,
    new_run_id,
)
from nestegg.checkpoint.step_formats import parse_step, step_with_data
from nestegg.checkpoint.stores.base import forks_of
from nestegg.checkpoint.views import (
    CheckpointInfo,
    CheckpointState,
    HistoryCheckpoint,
    RunHistory,
    RunInfo,
    StepInfo,
    run_input,
)
from nestegg.constants import REASON_FORK, RUN_FORKED, RUNNING
from nestegg.errors import RunExistsError
from nestegg.identifiers import check_name
from nestegg.task import StepListeners

if TYPE_CHECKING:
    from nestegg.checkpoint.runs import CheckpointedRuns, PreparedRun


def fork_id_taken(run_id: str, option: str = "run_id") -> RunExistsError:
    """A fork's new run id is a run's already: choose another ``option`` (the argument
    that gave it: ``run_id``, the command's ``--run-id``)."""
    return RunExistsError(f"run {run_id!r} exists; choose another {option}", run_id)


async def start_fork(
    book: CheckpointedRuns,
    checkpoint_id: str,
    data: Any,
    run_id: str | None,
    listeners: StepListeners,
) -> tuple[RunRecord, PreparedRun, list[str], Any]:
    """Store a new run forked from ``checkpoint_id`` (with ``data`` replaced unless None;
    a :class:`~nestegg.checkpoint.given.GivenData`, data someone gave, is stored as the JSON
    its check encoded); the stored run, what its execution starts from, its kept
    checkpoints and its input (``CheckpointedRuns.fork`` drives it).

    Everything that can fail is checked before the first write, as a resume does, so a
    fork that raises stores nothing. The new run gets copies of the parent's step records
    up to the checkpoint; the copy that holds the current data (the run's input when no
    step produced any) holds the replaced data, so every later checkpoint of the fork
    restores the history the fork had.
    """
    new_id = check_name(run_id, "run id") if run_id is not None else new_run_id()
    record = await book.get_checkpoint_record(checkpoint_id)
    parent = await book.get_run_record(record.run_id)
    state, copied = await fork_start(book.store, book.clutch, parent, record, data)
    if isinstance(data, GivenData):  # checked and encoded when it was given
        replaced: bytes | None = data.encoded
    else:
        replaced = encode_value(to_plain(data), "data") if data is not None else None
    if replaced is None and state.data_inline:  # a fork stored before its data was copied
        replaced = encode_value(state.data, "data")
    steps = [_copy_step(step, new_id, replaced, state.data_seq) for step in copied]
    now = book.config.clock()
    new_input = seal(replaced) if replaced is not None and state.data_seq == 0 else None
    child = _child_run(book, parent, new_id, checkpoint_id, new_input, now)
    start_id = new_checkpoint_id()
    child_state = _forked_state(state, new_id, start_id, now, replaced)
    prepared = book.prepare(child, child_state, listeners, of_run=parent.run_id)
    input_data = run_input(child)
    if await book.store.get_run(new_id) is not None:
        raise fork_id_taken(new_id)
    body = seal(checkpoint_body(prepared.base, state.next_agent))
    start = CheckpointRecord(start_id, new_id, state.seq, now, REASON_FORK, body)
    payload = {"parent_run": parent.run_id, "parent_checkpoint": checkpoint_id}
    forked = EventRecord(new_id, 1, now, RUN_FORKED, event_body(payload))
    await book.store.create_run(child)
    try:
        await book.store.commit(
            Commit(
                new_id,
                child.fence,
                steps=steps,
                events=[forked],
                checkpoints=[start],
                step_seq=state.seq,
                event_seq=forked.seq,
                updated_at=now,
            )
        )
    except BaseException:  # a fork half written is no fork: take the new run back
        with contextlib.suppress(Exception):
            await book.store.delete_run(new_id)
        raise
    started = replace(child, step_seq=state.seq, event_seq=forked.seq)
    return started, prepared, [start_id], input_data


def _child_run(
    book: CheckpointedRuns,
    parent: RunRecord,
    run_id: str,
    checkpoint_id: str,
    new_input: bytes | None,
    now: float,
) -> RunRecord:
    """The fork's run, owned by this process, before its steps are written; its input is
    the parent's unless ``new_input`` (sealed) replaces it."""
    return replace(
        parent,
        run_id=run_id,
        status=RUNNING,
        input=parent.input if new_input is None else new_input,
        created_at=now,
        updated_at=now,
        fence=1,
        owner=current_owner(),
        lease_until=now + book.lease,
        result=None,
        error=None,
        step_seq=0,
        event_seq=0,
        parent_run=parent.run_id,
        parent_checkpoint=checkpoint_id,
    )


def _copy_step(step: StepRecord, run_id: str, data: bytes | None, data_seq: int) -> StepRecord:
    """The fork's copy of a parent's step record: the one at ``data_seq`` holds ``data``
    (JSON; None: keep the step's own)."""
    if data is None or step.seq != data_seq:
        return step._replace(run_id=run_id)
    where = f"step {step.seq} of run {step.run_id!r}"
    return step._replace(run_id=run_id, body=step_with_data(step.body, data, where))


def _forked_state(
    state: CheckpointState, run_id: str, checkpoint_id: str, now: float, data: bytes | None
) -> CheckpointState:
    """What the fork's first checkpoint restores: ``state`` on run ``run_id``, its data
    replaced by ``data`` (JSON; None: kept)."""
    history = state.stored_history
    return replace(
        state,
        run_id=run_id,
        checkpoint=CheckpointInfo(
            checkpoint_id, run_id, state.seq, datetime.fromtimestamp(now, UTC), REASON_FORK
        ),
        data=state.data if data is None else decode_value(data, f"data of run {run_id!r}"),
        stored_history=replace(history, run_id=run_id) if history else None,
        data_inline=False,
    )


async def run_history(book: CheckpointedRuns, run_id: str) -> RunHistory:
    """The run's steps and checkpoints with parents, and the runs forked from it, newest
    first (found by the store's index of forks, ``ForkListing``, where it has one).

    A checkpoint's parent is the stored one before it; the first one's is the checkpoint
    the run was forked from, which pruning or deleting the parent run may have removed.
    """
    run = await book.own_run_record(run_id, ": its history is not this pipeline's")
    records = await book.store.load_steps(run.run_id)
    steps = []
    for record in records:
        body = parse_step(record.body, f"step {record.seq} of run {run.run_id!r}")
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
    forks, _ = await forks_of(
        book.store, run.run_id, pipeline=run.pipeline, created_at=run.created_at
    )  # every one: by the store's index of forks, else among every newer run of the pipeline
    return RunHistory(
        RunInfo.from_record(run), steps, checkpoints, [RunInfo.from_record(r) for r in forks]
    )
