"""What the pages read from a store: a page of runs, a window of a run's steps, one step's
journal, a run's family of forks, a state as a tree and a diff.

Built on the command's reading helpers (:mod:`nestegg.cli.reading`); nothing here reads a
whole run's history or every run of the store, so a 10,000-step run or 100,000 runs stay
cheap to show.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nestegg.checkpoint.formats import parse_journal
from nestegg.checkpoint.loader import load_state
from nestegg.checkpoint.ownership import run_state
from nestegg.checkpoint.records import CheckpointRecord, EventRecord, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage, load_history
from nestegg.checkpoint.views import CheckpointState, Event, run_input, run_result, to_datetime
from nestegg.checkpoint.waiting import signal_stored, wait_due, wait_known
from nestegg.cli import reading
from nestegg.cli.diff import diff_values
from nestegg.cli.wait_words import wait_is_over
from nestegg.clutch import Clutch
from nestegg.constants import (
    COMPLETED,
    FINISHED,
    FORK_SCAN,
    INTERRUPTED,
    RUN_FORKED,
    RUN_RESUMED,
    RUN_STARTED,
    RUNNING,
    SHOWN_RUNNING,
    STEP_FAILED,
    STEP_STARTED,
    WAITING,
)
from nestegg.errors import CheckpointCorruptedError, CheckpointNotFoundError, ConfigurationError
from nestegg.ui.forks import fork_offer
from nestegg.ui.resumes import resume_offer

RUNS_PAGE = 50
"""Runs on a page of the runs table."""
STEP_WINDOW = 200
"""Steps of the timeline shown at once (the newest, or those before ``?before=``)."""
EVENTS_READ = 5000
"""Newest events read for a run page's incidents (crashes, failures, takeovers)."""
INCIDENT_KINDS = (STEP_FAILED, RUN_RESUMED, RUN_FORKED)
OPENINGS = (RUN_STARTED, RUN_RESUMED)
"""The events that begin a run attempt."""
ANCESTORS_SHOWN = 20
WHOLE_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)")
"""A whole number as a step's address writes it: decimal digits with no leading zero,
no plus sign, no underscore, no space."""


def encode_cursor(run: RunRecord) -> str:
    """The ``?before=`` value of the page after ``run``: its creation time and id."""
    return f"{run.created_at!r}:{run.run_id}"


def decode_cursor(text: str | None) -> tuple[float, str] | None:
    """A cursor from :func:`encode_cursor`; None for none.

    Raises:
        ConfigurationError: a malformed one.
    """
    if not text:
        return None
    at, _, run_id = text.partition(":")
    try:
        created = float(at)
    except ValueError:
        created = math.nan
    if not run_id or not math.isfinite(created):
        raise ConfigurationError(
            f"before must be the cursor of a next-page link (CREATED:RUN_ID), got {text!r}"
        )
    return created, run_id


def _statuses(status: str | None) -> list[str] | None:
    """The stored statuses a filter reads (``interrupted`` and ``queued`` runs are running
    ones)."""
    return [RUNNING] if status in SHOWN_RUNNING else ([status] if status else None)


@dataclass(frozen=True, slots=True)
class RunsPage:
    """One page of the runs table and the cursor of the next (None: the last page)."""

    rows: list[dict[str, Any]]
    next_cursor: str | None


async def runs_page(
    store: CheckpointStorage,
    *,
    status: str | None,
    pipeline: str | None,
    before: tuple[float, str] | None,
    now: float,
    size: int = RUNS_PAGE,
) -> RunsPage:
    """A page of runs, newest first; ``status`` may be ``interrupted`` (running, owner gone)
    or ``queued`` (running, no worker took it yet).

    Reads ``size + 1`` runs from the store and the checkpoints of those shown.
    """
    runs = await store.list_runs(
        pipeline=pipeline or None, statuses=_statuses(status), limit=size + 1, before=before
    )
    more = len(runs) > size
    runs = runs[:size]
    cursor = encode_cursor(runs[-1]) if more and runs else None
    if status in SHOWN_RUNNING:
        runs = [run for run in runs if run_state(run, now) == status]
    listed = await asyncio.gather(*(store.list_checkpoints(run.run_id) for run in runs))
    rows = await asyncio.gather(
        *(
            flagged(
                store, run, reading.run_row(run, checkpoints[-1] if checkpoints else None, now), now
            )
            for run, checkpoints in zip(runs, listed, strict=True)
        )
    )
    return RunsPage(list(rows), cursor)


async def flagged(
    store: CheckpointStorage, run: RunRecord, row: dict[str, Any], now: float
) -> dict[str, Any]:
    """The row with the status people see (``interrupted``, ``queued``), whether it needs
    a look, for a run cancelled from outside who cancelled it, and for a waiting run what
    it waits for and whether that wait is over (see :func:`reading.complete_row`)."""
    row["shown_status"] = reading.shown_status(row)
    row["flag"] = row["shown_status"] in (INTERRUPTED, WAITING)
    await reading.complete_row(store, run, row, now)
    return row


def wait_over(row: dict[str, Any]) -> bool:
    """Whether a row of :func:`flagged` shows its run's wait as over (a resume goes on)."""
    return wait_is_over(row.get("waits_for"))


def waits_token(over: Iterable[str]) -> str:
    """What a runs table shows of its runs' waits, in a few characters: a digest of the
    runs whose wait it shows as over. The runs stream takes it (``?waits=``) and says
    ``change`` at its first read when the store says otherwise, as a run page's stream
    does with ``?wait=``."""
    return hashlib.blake2b("\0".join(sorted(over)).encode(), digest_size=8).hexdigest()


class RunsWatch:
    """What the runs stream reads of the table's first page (with its filters) at each
    poll: the runs (no checkpoint), and of each waiting run whether its wait is over. A
    wait's signal name is read once (from the run's last events), and the signal itself
    only until it is stored (a stored signal stays)."""

    def __init__(self, store: CheckpointStorage, *, status: str | None, pipeline: str | None):
        self.store, self.status, self.pipeline = store, status, pipeline
        self.waits: dict[tuple[str, int], tuple[str | None, bool]] = {}

    async def signature(self, now: float) -> list[tuple[Any, ...]]:
        """What changes on the page when any of its runs moves on; a row's last item
        says whether its wait is over (None: the run does not wait)."""
        runs = await self.store.list_runs(
            pipeline=self.pipeline or None, statuses=_statuses(self.status), limit=RUNS_PAGE
        )
        known, self.waits = self.waits, {}
        return [
            (
                r.run_id, r.status, r.step_seq, r.updated_at, run_state(r, now),
                await self._over(r, now, known) if r.status == WAITING else None,
            )
            for r in runs
        ]  # fmt: skip

    async def _over(
        self, run: RunRecord, now: float, known: dict[tuple[str, int], tuple[str | None, bool]]
    ) -> bool:
        key = (run.run_id, run.event_seq)  # a new wait writes a new event
        if key in known:
            signal, received = known[key]
        else:
            wait = await wait_known(self.store, run)  # unreadable: only its deadline counts
            signal, received = (wait.signal if wait else None), False
        if signal and not received:
            received = await signal_stored(self.store, run.run_id, signal)
        self.waits[key] = (signal, received)
        return received or wait_due(run, now)


def over_in(signature: list[tuple[Any, ...]]) -> list[str]:
    """The runs of a :meth:`RunsWatch.signature` whose wait is over."""
    return [entry[0] for entry in signature if entry[-1]]


def _decoded(read: Callable[[RunRecord], Any], run: RunRecord) -> Any:
    try:
        return read(run)
    except CheckpointCorruptedError as error:
        return {"unreadable": str(error)}


def event_row(record: EventRecord) -> dict[str, Any]:
    """An event as plain data (``unreadable`` in its data when damaged)."""
    try:
        return reading.event_row(Event.from_record(record))
    except CheckpointCorruptedError as error:
        return {"seq": record.seq, "kind": record.kind, "data": {"unreadable": str(error)}}


def _incidents(events: list[EventRecord], low: int, high: int) -> dict[int, list[dict[str, Any]]]:
    """Failures, resumes and forks of the steps ``low < seq <= high + 1``, by step: a resume
    after step n (a crash or takeover when the run was still running: ``previous`` is
    ``interrupted``, or ``running`` in runs resumed before that was recorded) shows before n + 1."""
    found: dict[int, list[dict[str, Any]]] = {}
    for record in events:
        if record.kind not in INCIDENT_KINDS:
            continue
        row = event_row(record)
        data = row["data"]
        seq = int(data.get("seq", 0)) + (0 if record.kind == STEP_FAILED else 1)
        if low < seq <= high + 1:
            if record.kind == RUN_RESUMED:
                row["takeover"] = data.get("previous") in (RUNNING, INTERRUPTED)
            found.setdefault(seq, []).append(row)
    return found


async def run_window(
    store: CheckpointStorage,
    run_id: str,
    before: int | None,
    now: float,
    size: int = STEP_WINDOW,
    resumer: Clutch | None = None,
) -> dict[str, Any]:
    """A run's page: summary, input, result or error, and the steps ``before - size <= seq
    < before`` (the newest when None) with their checkpoints and incidents; with
    ``resumer`` (the Clutch that resumes runs), its resume button
    (:func:`~nestegg.ui.resumes.resume_offer`); ``cancel``: whether its cancel button shows
    (a running or waiting run: one a cancel would not refuse or leave as it is);
    ``events_damage``: why the run's newest events cannot be read (None: they can), its
    step in flight then unreadable and the incidents after the damage not shown."""
    run = await reading.get_run(store, run_id)
    high = run.step_seq if before is None else max(0, min(before - 1, run.step_seq))
    low = max(0, high - size)
    checkpoints = await store.list_checkpoints(run.run_id)
    history = await load_history(store, run.run_id, low, high)
    since = max(0, run.event_seq - EVENTS_READ)
    events, damage = await reading.readable_events(store, run.run_id, since)
    by_seq: dict[int, list[dict[str, Any]]] = {}
    for checkpoint in checkpoints:
        if low <= checkpoint.seq <= high:
            by_seq.setdefault(checkpoint.seq, []).append(reading.checkpoint_row(checkpoint))
    steps = reading.history_rows(history, run.run_id, low, high)
    longest = max((s["duration"] or 0.0 for s in steps), default=0.0)
    incidents = _incidents(events, low, high)
    for step in steps:
        step["checkpoints"] = by_seq.get(step["seq"], [])
        step["bar"] = round(100 * (step["duration"] or 0.0) / longest, 1) if longest else 0
        step["incidents"] = incidents.get(step["seq"], [])
    last = checkpoints[-1] if checkpoints else None
    row = await flagged(store, run, reading.run_row(run, last, now, full_error=True), now)
    latest = high == run.step_seq
    pending = None
    if latest and damage is not None and run.status != COMPLETED:
        pending = {"seq": run.step_seq + 1, "status": row["shown_status"],
                   "unreadable": str(damage)}  # fmt: skip
    elif latest:
        pending = await _pending(store, run, events, row["shown_status"])
        failed = row["error"] or {}
        if pending is not None and failed.get("seq") == pending["seq"]:
            pending["duration"] = failed.get("duration")  # as nestegg show times it
    return {
        "pending": pending,
        "events_damage": None if damage is None else str(damage),
        "run": row,
        "input": _decoded(run_input, run),
        "result": _decoded(run_result, run),
        "steps": steps,
        "low": low,
        "high": high,
        "after_incidents": incidents.get(high + 1, []) if high == run.step_seq else [],
        "initial_checkpoints": by_seq.get(0, []),
        "checkpoint_ids": [c.checkpoint_id for c in checkpoints],
        "last_event": run.event_seq,
        "resume": await resume_offer(store, resumer, run, now) if resumer else None,
        "cancel": run.status not in FINISHED,
    }


async def _pending(
    store: CheckpointStorage, run: RunRecord, events: list[EventRecord], status: str
) -> dict[str, Any] | None:
    """The step after the last committed one when it started and is not committed: under
    way, waiting, interrupted, or the step that failed (its agent and start from its
    ``step_started`` event, and how many calls it journaled). None when there is none."""
    if run.status == COMPLETED:
        return None
    seq = run.step_seq + 1
    start = next((e for e in reversed(events) if e.kind == STEP_STARTED), None)
    data = event_row(start)["data"] if start is not None else {}
    calls = len(await store.read_journal(run.run_id, seq))
    if data.get("seq") != seq and not calls:
        return None
    started = start.at if start is not None and data.get("seq") == seq else None
    return {"seq": seq, "agent": data.get("agent") if started else None, "status": status,
            "started": to_datetime(started) if started else None, "calls": calls,
            "duration": None}  # fmt: skip


def range_text(window: dict[str, Any]) -> str:
    """Which steps a window shows: ``steps 1-200 of 10000``."""
    first = window["low"] + 1 if window["steps"] else 0
    return f"steps {first}\N{EN DASH}{window['high']} of {window['run']['steps']}"


def previous_checkpoint(ids: list[str], checkpoint_id: str) -> str | None:
    """The checkpoint before ``checkpoint_id`` in a run's list, or None."""
    at = ids.index(checkpoint_id) if checkpoint_id in ids else 0
    return ids[at - 1] if at > 0 else None


def step_of(run: RunRecord, address: str) -> int:
    """The step of ``run`` that ``address`` (the last part of a step's address) names: a
    number from 1 to the run's last step (one past its committed steps when it did not
    complete: the step under way, waiting or failed).

    Only a number written as the page writes it is one: ``01``, ``+1``, `` 1`` or ``1_0``
    (which ``int()`` takes) name no step.

    Raises:
        CheckpointNotFoundError: there is no such step (a number out of that range, a
            negative number, anything else); the message names the run, the step asked
            for and the range there is.
    """
    last = run.step_seq + (0 if run.status == COMPLETED else 1)
    number = WHOLE_NUMBER.fullmatch(address) is not None
    if number and len(address) <= len(str(last)) and 1 <= (seq := int(address)) <= last:
        return seq
    asked = address if number else repr(address)
    steps = f"its steps are 1{chr(0x2013)}{last}" if last else "it has none yet"
    raise CheckpointNotFoundError(f"run {run.run_id!r} has no step {asked}: {steps}")


async def step_detail(store: CheckpointStorage, run_id: str, address: str) -> dict[str, Any]:
    """One step (``address``: its number, see :func:`step_of`): its record's row and data,
    how often it ran, and its journaled calls, each with its duration and whether the
    step's last attempt replayed it (recorded by an earlier attempt) or executed it;
    ``events_damage``: why the run's event log cannot be read whole (None: it can), how
    often the step ran and which calls were replayed then unknown."""
    run = await reading.get_run(store, run_id)
    seq = step_of(run, address)
    rows = [row for piece in await load_history(store, run_id, seq - 1, seq) for row in
            reading.step_rows(piece, run_id)]  # fmt: skip
    step = rows[0] if rows else None
    events, damage = await reading.readable_events(store, run_id)
    attempts = sum(
        1
        for record in events
        if record.kind == STEP_STARTED and event_row(record)["data"].get("seq") == seq
    )
    started_at = step["started"] if step else None
    last_opening = _last_opening(events, started_at.timestamp() if started_at else None)
    calls = []
    for record in await store.read_journal(run.run_id, seq):
        try:
            entry = parse_journal(record.body, f"journal entry {seq}/{record.position}")
        except CheckpointCorruptedError as error:
            entry = {"unreadable": str(error), "started": None, "duration": None}
        started = entry["started"]
        unknown = started is None or damage is not None
        entry["replayed"] = None if unknown else started < last_opening
        calls.append({"position": record.position, **entry})
    return {"run_id": run.run_id, "seq": seq, "step": step, "calls": calls,
            "attempts": attempts,
            "events_damage": None if damage is None else str(damage)}  # fmt: skip


def _last_opening(events: list[EventRecord], before: float | None) -> float:
    """When the run attempt that ran a step last began: its latest start or resume at or
    before the step's start (``before``; None: a step not committed, run by the latest
    attempt). A call recorded before that was replayed by the step's last attempt."""
    openings = [e.at for e in events if e.kind in OPENINGS and (before is None or e.at <= before)]
    return max(openings, default=float("-inf"))


async def family(store: CheckpointStorage, run: dict[str, Any], now: float) -> dict[str, Any]:
    """The runs a run was forked from (oldest first), the runs forked from it (newest
    first; each with the status people see at ``now``) and whether those are all of
    them (:func:`~nestegg.cli.reading.fork_rows`: a store without ``ForkListing`` is
    searched within FORK_SCAN newer runs)."""
    ancestors: list[dict[str, Any]] = []
    parent, at = run["parent_run"], run["parent_checkpoint"]
    while parent and len(ancestors) < ANCESTORS_SHOWN:
        record = await store.get_run(parent)
        ancestors.insert(0, {"run_id": parent, "checkpoint": at, "exists": record is not None})
        if record is None:
            break
        parent, at = record.parent_run, record.parent_checkpoint
    children, complete = await reading.fork_rows(store, run, now, FORK_SCAN)
    for child in children:
        child["shown_status"] = reading.shown_status(child)
    return {"ancestors": ancestors, "children": children, "complete": complete}


async def checkpoint_run(
    store: CheckpointStorage, checkpoint_id: str
) -> tuple[RunRecord, CheckpointRecord]:
    """A checkpoint's run and its record (its state not read).

    Raises:
        CheckpointNotFoundError: no such checkpoint.
        RunNotFoundError: its run is gone.
        InvalidIdentifierError: an id no checkpoint can have.
    """
    record = await reading.get_checkpoint(store, checkpoint_id)
    return await reading.get_run(store, record.run_id), record


async def checkpoint_state(
    store: CheckpointStorage, checkpoint_id: str
) -> tuple[RunRecord, CheckpointState]:
    """A checkpoint's run and the state the checkpoint restores.

    Raises:
        CheckpointNotFoundError: no such checkpoint.
        RunNotFoundError: its run is gone.
        CheckpointCorruptedError: the checkpoint or a step it needs is damaged.
    """
    run, record = await checkpoint_run(store, checkpoint_id)
    return run, await load_state(store, run, record)


async def state_of(
    store: CheckpointStorage, checkpoint_id: str, forker: Clutch | None = None
) -> dict[str, Any]:
    """A checkpoint's restored state as plain data, with the ids of its run's checkpoints
    and its next agent as people see it (``next``:
    :func:`~nestegg.cli.reading.next_agent_shown`);
    with ``forker`` (the Clutch that forks runs), its fork form
    (:func:`~nestegg.ui.forks.fork_offer`).

    Raises:
        CheckpointNotFoundError: no such checkpoint.
    """
    run, state = await checkpoint_state(store, checkpoint_id)
    ids = [c.checkpoint_id for c in await store.list_checkpoints(run.run_id)]
    return {
        "state": reading.state_json(state),
        "checkpoint_ids": ids,
        "next": reading.next_agent_shown(state.next_agent, state.position, run, state.seq),
        "fork": fork_offer(forker, run, state) if forker else None,
    }


async def diff_of(store: CheckpointStorage, old: str, new: str) -> dict[str, Any]:
    """What changed from checkpoint ``old`` to ``new`` (ids and run ids left out)."""
    keys = ("checkpoint_id", "run_id")
    first, second = await reading.compared_states(store, old, new)
    changes = diff_values(
        {k: v for k, v in first.items() if k not in keys},
        {k: v for k, v in second.items() if k not in keys},
    )
    return {"old": first, "new": second, "changes": changes}
