"""What the commands read from a store, as plain data with stable keys (the --json form)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

import orjson

from nestegg.checkpoint.cancels import cancelled_by
from nestegg.checkpoint.codec import enums_kept
from nestegg.checkpoint.formats import parse_checkpoint, parse_journal
from nestegg.checkpoint.loader import load_latest, load_state, unusable_checkpoints
from nestegg.checkpoint.ownership import run_state
from nestegg.checkpoint.records import (
    CheckpointRecord,
    EventRecord,
    JournalRecord,
    RunRecord,
    StepBlock,
    StepRecord,
)
from nestegg.checkpoint.step_blocks import unpack_block
from nestegg.checkpoint.step_formats import parse_step
from nestegg.checkpoint.stores.base import (
    CheckpointStorage,
    checkpoints_of,
    forks_of,
    load_history,
)
from nestegg.checkpoint.stores.common import run_not_found
from nestegg.checkpoint.views import (
    CheckpointInfo,
    CheckpointState,
    Event,
    RunInfo,
    run_input,
    run_result,
    to_datetime,
)
from nestegg.cli.wait_words import add_wait
from nestegg.constants import (
    CANCELLED,
    COMPLETED,
    FORK_SCAN,
    IN_FLIGHT_EVENT_WINDOW,
    INTERRUPTED,
    MISSING,
    QUEUED,
    RUNNING,
    STEP_STARTED,
    WAITING,
)
from nestegg.errors import CheckpointCorruptedError, CheckpointNotFoundError
from nestegg.identifiers import check_name
from nestegg.strategies import Undecided, upcoming_at

ERROR_SUMMARY_KEYS = ("type", "message", "agent", "hook", "seq")


async def get_run(store: CheckpointStorage, run_id: str) -> RunRecord:
    """The run, or RunNotFoundError (InvalidIdentifierError for an id no run can have, on
    every store alike)."""
    run = await store.get_run(check_name(run_id, "run id"))
    if run is None:
        raise run_not_found(run_id)
    return run


async def get_checkpoint(store: CheckpointStorage, checkpoint_id: str) -> CheckpointRecord:
    """The checkpoint, or CheckpointNotFoundError (InvalidIdentifierError for an id no
    checkpoint can have, on every store alike)."""
    record = await store.get_checkpoint(check_name(checkpoint_id, "checkpoint id"))
    if record is None:
        raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r} in the store")
    return record


def _safe_error(run: RunRecord) -> dict[str, Any] | None:
    try:
        return RunInfo.from_record(run).error
    except CheckpointCorruptedError:
        return {"type": "unreadable", "message": "the stored error is damaged"}


def run_row(
    run: RunRecord, last: CheckpointRecord | None, now: float, *, full_error: bool = False
) -> dict[str, Any]:
    """A run as plain data: status, whether it is interrupted or queued at ``now`` (see
    :func:`run_state`), progress, owner, outcome."""
    error = _safe_error(run)
    state = run_state(run, now)
    if error is not None and not full_error:
        error = {k: error[k] for k in ERROR_SUMMARY_KEYS if k in error}
    return {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": run.status,
        "interrupted": state == INTERRUPTED,
        "queued": state == QUEUED,
        "steps": run.step_seq,
        "last_checkpoint": checkpoint_row(last) if last is not None else None,
        "created_at": to_datetime(run.created_at),
        "updated_at": to_datetime(run.updated_at),
        "owner": run.owner.to_json() if run.owner else None,
        "lease_until": to_datetime(run.lease_until),
        "fence": run.fence,
        "parent_run": run.parent_run,
        "parent_checkpoint": run.parent_checkpoint,
        "error": error,
        "waits_for": None,
        "cancelled_by": None,
    }


async def fork_rows(
    store: CheckpointStorage, run: Mapping[str, Any], now: float, scan: int = FORK_SCAN
) -> tuple[list[dict[str, Any]], bool]:
    """The runs forked from ``run`` (a :func:`run_row`), newest first, as plain data (id,
    the checkpoint it was forked from, status, whether it is interrupted or queued at
    ``now`` as :func:`run_row` says, creation time), and whether that is all of them: a
    store without ``ForkListing`` is searched within the ``scan`` runs of the pipeline
    newer than the run (:func:`~nestegg.checkpoint.stores.base.forks_of`)."""
    forks, complete = await forks_of(
        store,
        run["run_id"],
        pipeline=run["pipeline"],
        created_at=run["created_at"].timestamp(),
        scan=scan,
    )
    rows = []
    for fork in forks:
        state = run_state(fork, now)
        rows.append(
            {"run_id": fork.run_id, "checkpoint": fork.parent_checkpoint, "status": fork.status,
             "interrupted": state == INTERRUPTED, "queued": state == QUEUED,
             "created_at": to_datetime(fork.created_at)}
        )  # fmt: skip
    return rows, complete


async def complete_row(
    store: CheckpointStorage, run: RunRecord, row: dict[str, Any], now: float
) -> None:
    """Fill in what ``row`` (:func:`run_row`) reads beyond the run record: a waiting run's
    ``waits_for`` (:func:`add_wait`); for a run cancelled from outside, ``cancelled_by``
    (the canceller: host, pid, process start) and as its ``owner`` the one that last ran
    it, which the canceller's claim replaced in the store (None: none had it, it was
    queued). A run whose last events are damaged keeps its stored owner, its canceller
    unknown (``{"unreadable": why}``), and a waiting one's wait is unknown
    (``{"unreadable": why, "deadline": …, "due": …}``)."""
    await add_wait(store, run, row, now)
    try:
        cancel = await cancelled_by(store, run)
    except CheckpointCorruptedError as error:
        row["cancelled_by"] = {"unreadable": str(error)}
        return
    if cancel is not None:
        row["owner"], row["cancelled_by"] = cancel.get("previous_owner"), cancel.get("by")


def shown_status(row: dict[str, Any]) -> str:
    """The status people see: ``interrupted`` for a running run whose owner is gone,
    ``queued`` for one no worker took yet."""
    if row["interrupted"]:
        return INTERRUPTED
    return QUEUED if row["queued"] else str(row["status"])


RUN_ENDED_AFTER = "none, the run ended after this step"
"""The next agent shown for the checkpoint of a completed run's last step."""

CHOSEN_BY_SELECTOR = "chosen by the selector"
"""The next agent shown when the selector picks it as the run goes on."""


def next_agent_shown(
    next_agent: str | None, position: Mapping[str, Any] | None, run: RunRecord, seq: int
) -> str | None:
    """The agent that runs next from the checkpoint after step ``seq`` of ``run`` (its
    recorded ``next_agent`` and the strategy's ``position``) as people see it: the one it
    records (a checkpoint taken inside an agent), :data:`RUN_ENDED_AFTER` at a completed
    run's last step, else the one the strategy's position says
    (:func:`nestegg.strategies.upcoming_at`), :data:`CHOSEN_BY_SELECTOR` when the
    selector picks it, None when nothing says it, to be left out."""
    if next_agent:
        return next_agent
    if run.status == COMPLETED and seq == run.step_seq:
        return RUN_ENDED_AFTER
    upcoming = upcoming_at(position)
    return CHOSEN_BY_SELECTOR if upcoming is Undecided.SELECTOR else upcoming


def checkpoint_row(record: CheckpointRecord) -> dict[str, Any]:
    """A checkpoint's header as plain data, with its turn and next agent when readable."""
    info = CheckpointInfo.from_record(record)
    row: dict[str, Any] = {
        "checkpoint_id": info.checkpoint_id,
        "run_id": info.run_id,
        "seq": info.seq,
        "reason": info.reason,
        "created_at": info.created_at,
        "turn": None,
        "next_agent": None,
        "position": None,
        "valid": True,
    }
    try:
        body = parse_checkpoint(record.body, f"checkpoint {record.checkpoint_id!r}")
        row["turn"] = body.get("turn")
        row["next_agent"] = body.get("next")
        row["position"] = body.get("position")
    except (CheckpointCorruptedError, AttributeError):
        row["valid"] = False
    return row


async def checkpoint_rows(store: CheckpointStorage, run: RunRecord) -> list[dict[str, Any]]:
    """The run's checkpoints as plain data, oldest first, each ``valid`` when a resume from
    it would use it: its body and the step records it rests on intact (read once for all)."""
    checkpoints = await store.list_checkpoints(run.run_id)
    unusable = await unusable_checkpoints(store, run, checkpoints)
    rows = [checkpoint_row(checkpoint) for checkpoint in checkpoints]
    for row in rows:
        row["valid"] = row["checkpoint_id"] not in unusable
    return rows


async def list_run_rows(
    store: CheckpointStorage,
    *,
    pipeline: str | None,
    statuses: list[str] | None,
    shown: str | None,
    limit: int | None,
    now: float,
) -> list[dict[str, Any]]:
    """Runs newest first, each with its last checkpoint; only those shown as ``shown``
    (``interrupted``, ``queued``: see :func:`run_state`) unless it is None."""
    fetch_limit = None if shown else limit
    runs = await store.list_runs(pipeline=pipeline, statuses=statuses, limit=fetch_limit)
    if shown:
        runs = [run for run in runs if run_state(run, now) == shown][:limit]
    listed = await checkpoints_of(store, [run.run_id for run in runs])
    rows = []
    for run, checkpoints in zip(runs, listed, strict=True):
        rows.append(run_row(run, checkpoints[-1] if checkpoints else None, now))
        await complete_row(store, run, rows[-1], now)
    return rows


def step_row(seq: int, agent: str, body: bytes, run_id: str) -> dict[str, Any]:
    """One executed step as plain data (``damaged`` when its record cannot be read)."""
    try:
        step = parse_step(body, f"step {seq} of run {run_id!r}")
        started: datetime | None = datetime.fromtimestamp(float(step.get("started", 0)), UTC)
        return {
            "seq": seq,
            "agent": agent,
            "outcome": str(step.get("outcome")),
            "started": started,
            "duration": float(step.get("duration", 0.0)),
            "produced_data": "data" in step,
        }
    except (CheckpointCorruptedError, orjson.JSONDecodeError, TypeError, ValueError):
        return {
            "seq": seq,
            "agent": agent,
            "outcome": "damaged",
            "started": None,
            "duration": None,
            "produced_data": False,
        }


def step_rows(piece: StepRecord | StepBlock, run_id: str) -> list[dict[str, Any]]:
    """The rows of a step record or of a block of them (each ``damaged`` when its block's
    head cannot be read: where the records lie in it is then unknown)."""
    if isinstance(piece, StepRecord):
        return [step_row(piece.seq, piece.agent, piece.body, run_id)]
    try:
        records = unpack_block(piece)
    except CheckpointCorruptedError:
        seqs = range(piece.first_seq, piece.last_seq + 1)
        return [step_row(seq, "?", b"", run_id) for seq in seqs]
    return [step_row(r.seq, r.agent, r.body, run_id) for r in records]


def history_rows(
    pieces: Sequence[StepRecord | StepBlock], run_id: str, after: int, upto: int
) -> list[dict[str, Any]]:
    """The rows of a run's steps past ``after`` read from ``pieces`` (:func:`step_rows`),
    with a ``missing`` row for each step up to ``upto`` (the steps the run counts) whose
    record is not there (a row deleted, the torn end of a file store's log), in order:
    left out, a timeline would end early without saying so."""
    rows = [row for piece in pieces for row in step_rows(piece, run_id) if row["seq"] > after]
    found = {row["seq"] for row in rows}
    rows.extend(
        {**step_row(seq, "?", b"", run_id), "outcome": MISSING}
        for seq in range(after + 1, upto + 1)
        if seq not in found
    )
    return sorted(rows, key=itemgetter("seq"))


def _decoded(read: Any, run: RunRecord) -> Any:
    try:
        return read(run)
    except CheckpointCorruptedError as error:
        return {"unreadable": str(error)}


async def run_details(
    store: CheckpointStorage, run_id: str, tail: int | None, now: float
) -> dict[str, Any]:
    """A run in full: its row, the runs forked from it (:func:`fork_rows`), input, result,
    steps (the last ``tail``, None: all) with the checkpoints taken at each, and the step
    that failed."""
    run = await get_run(store, run_id)
    checkpoints = await store.list_checkpoints(run.run_id)
    after = max(0, run.step_seq - tail) if tail is not None else 0
    by_seq: dict[int, list[str]] = {}
    for checkpoint in checkpoints:
        by_seq.setdefault(checkpoint.seq, []).append(checkpoint.checkpoint_id)
    history = await load_history(store, run.run_id)  # blocks whole: heads read here
    steps = history_rows(history, run.run_id, after, run.step_seq)
    for row in steps:
        row["checkpoints"] = by_seq.get(row["seq"], [])
    row = run_row(run, checkpoints[-1] if checkpoints else None, now, full_error=True)
    await complete_row(store, run, row, now)
    error = row["error"] or {}
    failed = (
        {k: error.get(k) for k in ERROR_SUMMARY_KEYS}
        | {"started": _at(error.get("started")), "duration": error.get("duration")}
        if "seq" in error and "agent" in error
        else None
    )
    forks, forks_complete = await fork_rows(store, row, now)
    return {
        "run": row,
        "forks": forks,
        "forks_complete": forks_complete,
        "input": _decoded(run_input, run),
        "result": _decoded(run_result, run),
        "steps_before": after,
        "steps": steps,
        "initial_checkpoints": by_seq.get(0, []),
        "checkpoints": [checkpoint_row(c) for c in checkpoints],
        "failed_step": failed,
        "step_in_flight": (
            await step_in_flight(store, run) if run.status in UNFINISHED_STEP else None
        ),
    }


UNFINISHED_STEP = (RUNNING, WAITING, CANCELLED)
"""The statuses of a run that can stop in a step: its start is stored, not its end."""


def _at(seconds: Any) -> datetime | None:
    return datetime.fromtimestamp(seconds, UTC) if isinstance(seconds, int | float) else None


async def step_in_flight(store: CheckpointStorage, run: RunRecord) -> dict[str, Any] | None:
    """The step a running, waiting or cancelled run has started and not committed (its
    agent, start and the calls it has journaled so far), from its ``step_started`` event;
    None when there is none (between steps, or a start not written yet);
    ``{"unreadable": why}`` when the run's last events are damaged."""
    try:
        start = await in_flight_start(store, run)
    except CheckpointCorruptedError as error:
        return {"unreadable": str(error)}
    if start is None:
        return None
    seq = start.data["seq"]
    calls = [row for row, _ in await journaled_calls(store, run.run_id, seq)]
    return {"seq": seq, "agent": start.data.get("agent"), "started": start.at, "calls": calls}


async def in_flight_start(store: CheckpointStorage, run: RunRecord) -> Event | None:
    """The ``step_started`` event of the step a running run has started and not committed
    yet; None when there is none (between steps, or a start not written yet).

    Raises:
        CheckpointCorruptedError: the run's event log is damaged (a torn batch).
    """
    since = max(0, run.event_seq - IN_FLIGHT_EVENT_WINDOW)
    start = _last_start(await store.read_events(run.run_id, since))
    if start is None and since:  # a step with many journaled calls: look further back
        start = _last_start(await store.read_events(run.run_id))
    try:
        event = Event.from_record(start) if start is not None else None
    except CheckpointCorruptedError:
        return None
    if event is None or event.data.get("seq") != run.step_seq + 1:
        return None
    return event


EVENTS_PAGE = 256
"""Events :func:`readable_events` reads at once when a run's log is damaged."""


async def readable_events(
    store: CheckpointStorage, run_id: str, since: int = 0
) -> tuple[list[EventRecord], CheckpointCorruptedError | None]:
    """The run's events after ``since`` up to the first damage in its log (a torn batch),
    and that damage (None: the log reads whole). A damaged log is read again a page, then
    an event, at a time: a read stops at the batch holding its last event."""
    try:
        return await store.read_events(run_id, since), None
    except CheckpointCorruptedError as error:
        damage = error
    found: list[EventRecord] = []
    page = EVENTS_PAGE
    while True:
        try:
            records = await store.read_events(run_id, since, page)
        except CheckpointCorruptedError:
            if page == 1:
                return found, damage
            page = 1  # the damage is in this page: the events before it one by one
            continue
        if not records:
            return found, damage
        found.extend(records)
        since = records[-1].seq


def _last_start(events: list[EventRecord]) -> EventRecord | None:
    return next((e for e in reversed(events) if e.kind == STEP_STARTED), None)


async def journaled_calls(
    store: CheckpointStorage, run_id: str, step: int
) -> list[tuple[dict[str, Any], datetime | None]]:
    """The calls step ``step`` has journaled, by position: each call's row (position,
    function, ``returned`` or ``failed``, duration) and when it returned, its start plus
    its duration (None for an entry damaged or journaled before those were recorded)."""
    return [_call(record) for record in await store.read_journal(run_id, step)]


def _call(record: JournalRecord) -> tuple[dict[str, Any], datetime | None]:
    try:
        entry = parse_journal(record.body, f"journal entry {record.step}/{record.position}")
    except CheckpointCorruptedError:
        entry = {"error": "damaged", "started": None, "duration": None}
    started, duration = entry["started"], entry["duration"]
    row = {
        "position": record.position,
        "function": entry.get("function"),
        "outcome": "failed" if "error" in entry else "returned",
        "duration": duration,  # None: damaged, or journaled without it
    }
    returned = None if started is None or duration is None else _at(started + duration)
    return row, returned


async def resolve_state(store: CheckpointStorage, reference: str) -> CheckpointState:
    """The state of a checkpoint id, or of a run id's newest valid checkpoint.

    Raises:
        InvalidIdentifierError: an id no checkpoint or run can have.
        CheckpointNotFoundError: neither a checkpoint nor a run has that id.
        CheckpointCorruptedError: the checkpoint or a step it needs is damaged.
    """
    record = await store.get_checkpoint(check_name(reference, "checkpoint or run id"))
    if record is not None:
        run = await get_run(store, record.run_id)
        return await load_state(store, run, record)
    named_run = await store.get_run(reference)
    if named_run is None:
        raise CheckpointNotFoundError(f"no checkpoint or run {reference!r} in the store")
    state, _ = await load_latest(store, named_run)
    return state


def state_json(state: CheckpointState) -> dict[str, Any]:
    """A restored state as plain data."""
    return state.to_json()


async def compared_states(
    store: CheckpointStorage, old: str, new: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The states of ``old`` and ``new`` (ids as :func:`resolve_state` takes them) as
    plain data for ``diff``: an enum whose class this process does not import is a
    :class:`~nestegg.checkpoint.codec.KeptEnum`, as stored, not its plain value, from which
    it would not differ."""
    with enums_kept(unimported_only=True):
        first = state_json(await resolve_state(store, old))
        second = state_json(await resolve_state(store, new))
    return first, second


def event_row(event: Event) -> dict[str, Any]:
    """An event as plain data."""
    return {
        "run_id": event.run_id,
        "seq": event.seq,
        "at": event.at,
        "kind": event.kind,
        "data": event.data,
    }
