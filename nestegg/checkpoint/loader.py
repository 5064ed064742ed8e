"""Loading a run's state: a checkpoint plus the step records up to its sequence number.

Every record's checksum is checked. A torn or altered checkpoint or step record makes
that checkpoint unusable; :func:`load_latest` then falls back to the newest valid one
(or to the run's input) with a :class:`CheckpointFallbackWarning`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import orjson

from nestegg.checkpoint.codec import has_tags, rebuild, unseal, unseal_json
from nestegg.checkpoint.records import CheckpointRecord, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.views import CheckpointInfo, CheckpointState, run_input
from nestegg.errors import CheckpointCorruptedError, CheckpointFallbackWarning

log = logging.getLogger("nestegg")


def initial_state(run: RunRecord) -> CheckpointState:
    """The state a run starts from: its input, before any step."""
    return CheckpointState(
        run_id=run.run_id,
        checkpoint=None,
        seq=0,
        turn=0,
        data=run_input(run),
        source="input",
        data_seq=0,
        history=[],
        metadata={},
        position=None,
        next_agent=None,
    )


async def load_state(
    store: CheckpointStorage, run: RunRecord, checkpoint: CheckpointRecord
) -> CheckpointState:
    """The run's state at ``checkpoint``.

    Raises:
        CheckpointCorruptedError: the checkpoint or a step record it needs is damaged
            or missing.
    """
    where = f"checkpoint {checkpoint.checkpoint_id!r} of run {run.run_id!r}"
    body = unseal_json(checkpoint.body, where)
    try:
        seq, turn = int(body["seq"]), int(body["turn"])
        metadata = rebuild(body.get("metadata") or {}, where)
    except (KeyError, TypeError, ValueError):
        raise CheckpointCorruptedError(f"{where} lacks its fields") from None
    records = await store.load_steps(run.run_id, upto=seq)
    if len(records) != seq or (records and records[-1].seq != seq):
        raise CheckpointCorruptedError(
            f"{where} covers {seq} steps but {len(records)} step records are stored"
        )
    entries: list[dict[str, Any]] = [{"source": "input", "data": run_input(run)}]
    data_seq = 0
    steps: list[dict[str, Any]] = []
    for record in records:
        step_where = f"step {record.seq} of run {run.run_id!r}"
        raw = unseal(record.body, step_where)
        try:
            step = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise CheckpointCorruptedError(f"{step_where} holds invalid JSON") from None
        if "data" in step:
            data = step.pop("data")
            if has_tags(raw):
                data = rebuild(data, step_where)
            entries.append({"source": record.agent, "data": data})
            data_seq = record.seq
        step["seq"] = record.seq
        steps.append(step)
    if len(entries) - 1 != turn:
        raise CheckpointCorruptedError(
            f"{where} says turn {turn} but the steps give {len(entries) - 1}"
        )
    current = entries.pop()
    if "data" in body:
        current = {"source": current["source"], "data": rebuild(body["data"], where)}
    return CheckpointState(
        run_id=run.run_id,
        checkpoint=CheckpointInfo.from_record(checkpoint),
        seq=seq,
        turn=turn,
        data=current["data"],
        source=current["source"],
        data_seq=data_seq,
        history=entries,
        metadata=metadata if isinstance(metadata, dict) else {},
        position=body.get("position"),
        next_agent=body.get("next"),
        steps=steps,
        data_inline="data" in body,
    )


async def load_latest(
    store: CheckpointStorage, run: RunRecord
) -> tuple[CheckpointState, list[CheckpointRecord]]:
    """The newest valid state of ``run`` and the checkpoints it keeps (up to that state).

    Falls back past damaged checkpoints with a warning; with none valid, the run's input.

    Raises:
        CheckpointCorruptedError: even the run's input is damaged.
    """
    checkpoints = await store.list_checkpoints(run.run_id)
    for index in range(len(checkpoints) - 1, -1, -1):
        checkpoint = checkpoints[index]
        try:
            state = await load_state(store, run, checkpoint)
        except CheckpointCorruptedError as error:
            message = f"skipping damaged checkpoint: {error}; falling back to an older one"
            warnings.warn(message, CheckpointFallbackWarning, stacklevel=2)
            log.warning(message)
            continue
        return state, checkpoints[: index + 1]
    return initial_state(run), []
