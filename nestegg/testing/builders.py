"""Builders of store records for the contract suite: runs with sealed input, steps, events,
checkpoints; and what a reader can see of a run."""

from __future__ import annotations

import itertools
from typing import Any

from nestegg.checkpoint.codec import encode_value, seal, seal_json
from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    StepRecord,
    new_checkpoint_id,
)
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import REASON_POLICY, RUNNING, STEP_COMPLETED

T0 = 1_700_000_000.123456
"""A fixed start time; tests add offsets so orders are deterministic."""

OWNER = Owner(host="host-a#0badc0de", pid=4242, started="123456")
OTHER_OWNER = Owner(host="host-b#feedbeef", pid=7, started="99")

_run_numbers = itertools.count(1)


def make_run(
    run_id: str | None = None,
    *,
    pipeline: str = "pipeline",
    status: str = RUNNING,
    input_value: Any = None,
    created_at: float | None = None,
    updated_at: float | None = None,
    **fields: Any,
) -> RunRecord:
    """A RunRecord whose input is ``input_value`` encoded and sealed.

    ``created_at`` defaults to T0 plus a growing offset, so later runs are newer;
    ``fields`` sets any other RunRecord field (fence, owner, result, parent_run, ...).
    """
    number = next(_run_numbers)
    created = T0 + number if created_at is None else created_at
    value = {"run": number, "items": [1, 2, 3]} if input_value is None else input_value
    return RunRecord(
        run_id=run_id or f"run-{number:06d}",
        pipeline=pipeline,
        status=status,
        input=seal(encode_value(value)),
        created_at=created,
        updated_at=created if updated_at is None else updated_at,
        **fields,
    )


def make_step(run_id: str, seq: int, *, agent: str = "agent", data: Any = None) -> StepRecord:
    """A step record whose sealed body names its agent, run and seq, in the checkpointer's
    layout (the agent first, the data last: a store may pack such records in blocks)."""
    body = {"agent": agent, "run": run_id, "seq": seq, "data": data}
    return StepRecord(run_id=run_id, seq=seq, agent=agent, body=seal_json(body))


def make_event(
    run_id: str, seq: int, *, kind: str = STEP_COMPLETED, at: float | None = None
) -> EventRecord:
    """An event record with a small sealed body."""
    when = T0 + seq if at is None else at
    body = seal_json({"run": run_id, "seq": seq, "kind": kind})
    return EventRecord(run_id=run_id, seq=seq, at=when, kind=kind, body=body)


def make_checkpoint(
    run_id: str,
    seq: int,
    *,
    checkpoint_id: str | None = None,
    reason: str = REASON_POLICY,
    created_at: float | None = None,
) -> CheckpointRecord:
    """A checkpoint record after step ``seq`` with a fresh time-sortable id."""
    return CheckpointRecord(
        checkpoint_id=checkpoint_id or new_checkpoint_id(),
        run_id=run_id,
        seq=seq,
        created_at=T0 + seq if created_at is None else created_at,
        reason=reason,
        body=seal_json({"run": run_id, "seq": seq, "cursor": {"next": seq + 1}}),
    )


def make_journal(run_id: str, step: int, position: int) -> JournalRecord:
    """A journal entry of call ``position`` in step ``step``."""
    body = seal_json({"function": "fetch", "step": step, "position": position, "ok": True})
    return JournalRecord(run_id=run_id, step=step, position=position, body=body)


def make_commit(run: RunRecord, **fields: Any) -> Commit:
    """A Commit to ``run`` carrying its current fence; ``fields`` sets the rest."""
    fields.setdefault("fence", run.fence)
    return Commit(run_id=run.run_id, **fields)


async def create(store: CheckpointStorage, **fields: Any) -> RunRecord:
    """Create a run built by :func:`make_run` in ``store`` and return it."""
    run = make_run(**fields)
    await store.create_run(run)
    return run


async def commit_steps(
    store: CheckpointStorage,
    run: RunRecord,
    seqs: range | list[int],
    *,
    checkpoints: bool = False,
) -> list[StepRecord]:
    """Commit one step (and one event, and optionally a checkpoint) per seq, one by one."""
    steps = []
    for seq in seqs:
        step = make_step(run.run_id, seq)
        extra = [make_checkpoint(run.run_id, seq)] if checkpoints else []
        await store.commit(
            make_commit(
                run,
                steps=[step],
                events=[make_event(run.run_id, seq)],
                checkpoints=extra,
                step_seq=seq,
                event_seq=seq,
                updated_at=T0 + 1000 + seq,
            )
        )
        steps.append(step)
    return steps


async def snapshot(store: CheckpointStorage, run_id: str, steps: range = range(10)) -> Any:
    """Everything a reader can see of one run."""
    checkpoints = await store.list_checkpoints(run_id)
    return (
        await store.get_run(run_id),
        await store.load_steps(run_id),
        await store.read_events(run_id),
        checkpoints,
        [await store.get_checkpoint(c.checkpoint_id) for c in checkpoints],
        [await store.read_journal(run_id, step) for step in steps],
    )


def assert_bytes_fields(*records: Any) -> None:
    """Sealed payloads come back as bytes, not memoryview/bytearray/str."""
    for record in records:
        for name in ("input", "result", "error", "body"):
            value = getattr(record, name, None)
            assert value is None or type(value) is bytes, (name, type(value))
