"""What `nestegg events` prints: a run's events as lines or JSON, and --follow, which
also prints the calls the steps under way journal."""

from __future__ import annotations

import asyncio
import math
import time
from datetime import UTC, datetime
from typing import Any

from nestegg.checkpoint.event_log import StepFacts, step_facts_for
from nestegg.checkpoint.ownership import run_state
from nestegg.checkpoint.records import EventRecord, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.views import Event, to_datetime
from nestegg.cli import reading
from nestegg.cli.render import Output, seconds, to_json
from nestegg.constants import (
    CALL_JOURNALED,
    INTERRUPTED,
    LATEST_TIME,
    RUN_CANCELLED,
    RUN_FAILED,
    RUN_RESUMED,
    RUN_WAITING,
    RUNNING,
    STEP_COMPLETED,
    STEP_FAILED,
)
from nestegg.errors import CheckpointCorruptedError


def event_row(record: EventRecord, steps: StepFacts) -> dict[str, Any]:
    """An event as plain data; a damaged one says so in its ``data``."""
    try:
        return reading.event_row(Event.from_record(record, steps.get(record.seq)))
    except CheckpointCorruptedError as error:
        at = to_datetime(record.at)
        return {
            "run_id": record.run_id,
            "seq": record.seq,
            "at": at,
            "kind": record.kind,
            "data": {"unreadable": str(error)},
        }


TIME_KEYS = frozenset({"started", "deadline"})
"""The keys of event data holding a time (UNIX seconds): a step's start, a wait's end;
a line shows them as it shows an event's time, --json as the number stored."""


def _detail(key: str, value: Any) -> str:
    if key == "duration" and (value is None or isinstance(value, int | float)):
        return f"{key}={seconds(value)}"
    if key in TIME_KEYS and isinstance(value, int | float) and 0 <= value <= LATEST_TIME:
        return f"{key}={_clock_time(value)}"
    if isinstance(value, float) and math.isfinite(value):
        return f"{key}={value:.6g}"
    return f"{key}={value if isinstance(value, str) else to_json(value, indent=False)}"


def _clock_time(seconds_: float) -> str:
    """UNIX seconds as local time to the millisecond, as event lines show times."""
    return _stamp(datetime.fromtimestamp(seconds_, UTC))


def _stamp(moment: datetime) -> str:
    """A time as an event line shows it: local, to the millisecond."""
    return moment.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def event_line(row: dict[str, Any]) -> str:
    """An event's line: seq, time, kind and its data as ``key=value``."""
    details = " ".join(_detail(key, value) for key, value in row["data"].items())
    stamp = _stamp(row["at"])
    seq = "-" if row["seq"] is None else row["seq"]
    return f"{seq:>5}  {stamp}  {row['kind']:<17} {details}".rstrip()


async def follow(
    store: CheckpointStorage, out: Output, run_id: str, since: int, interval: float
) -> None:
    """Print the run's events after ``since``, then the new ones every ``interval``
    seconds until the run is no longer running; and the calls journaled by the steps
    under way while following, each step's before the event that ends it."""
    warned = False
    run = await reading.get_run(store, run_id)
    calls = _FollowedCalls(store, out, run)
    while True:
        records, damage = await reading.readable_events(store, run_id, since)
        steps = await step_facts_for(store, run_id, records)
        for record in records:
            row = event_row(record, steps)
            calls.note_resume(row)
            ended = _step_ended_by(row)
            if ended is not None:
                await calls.print_new(ended)
            print_event(out, row)
            since = record.seq
        if damage is not None:  # after the events before it
            raise damage
        if run.status != RUNNING:  # its last events were committed with the status
            return
        start = await reading.in_flight_start(store, run)
        if start is not None:
            await calls.print_new(start.data["seq"], attempt=(run.fence, since))
        if not warned and run_state(run, time.time()) == INTERRUPTED:
            out.note(f"run {run_id!r} is interrupted (its owner is gone); waiting for a resume")
            warned = True
        await asyncio.sleep(interval)
        run = await reading.get_run(store, run_id)


def _step_ended_by(row: dict[str, Any]) -> int | None:
    """The step an event ends: the one it completes or fails, or the one under way when
    the run stopped (waits, is cancelled or fails: the step after the ``steps`` it had
    committed); None for other events. Its calls are printed before the event."""
    data = row["data"]
    if row["kind"] in (STEP_COMPLETED, STEP_FAILED):
        seq = data.get("seq")
        return seq if type(seq) is int else None
    if row["kind"] in (RUN_WAITING, RUN_CANCELLED, RUN_FAILED):
        committed = data.get("steps")
        return committed + 1 if type(committed) is int else None
    return None


_CallKey = tuple[int, int, datetime | None, float | None]
"""A journal entry as the follower knows it: step, position, when it returned, duration."""


class _FollowedCalls:
    """The calls ``events --follow`` prints: those journaled by the steps that run while
    it follows, each journal entry once.

    The steps committed before it began are history (no calls), until a resume written
    while it follows goes back to an earlier checkpoint (``run_resumed``, its ``seq``):
    the steps after it run again. Their calls are dropped and made again (a new entry at
    the same step and position, another start and duration: printed), or replayed from
    the journal (the same entry: not printed twice).
    """

    def __init__(self, store: CheckpointStorage, out: Output, run: RunRecord) -> None:
        self.store, self.out, self.run_id = store, out, run.run_id
        self.first = run.step_seq + 1
        self.live_after = run.event_seq  # the events after it are written while following
        self.shown: set[_CallKey] = set()

    def note_resume(self, row: dict[str, Any]) -> None:
        """Take in an event: a resume written while following runs the steps after its
        checkpoint again."""
        resumed_at = row["data"].get("seq")
        if row["kind"] == RUN_RESUMED and row["seq"] > self.live_after and type(resumed_at) is int:
            self.first = min(self.first, resumed_at + 1)

    async def print_new(self, step: int, attempt: tuple[int, int] | None = None) -> None:
        """Print the calls step ``step`` has journaled not printed yet (none for a step of
        the history), as ``call_journaled`` lines at the time each call returned (the time
        of printing for a call journaled before durations were recorded). The journal is
        read, not the event log (a call writes no event), so they have no event sequence
        number (``-``).

        ``attempt``: for a step in flight, the fence of the run as last read and the last
        event printed. Its calls are printed only if, once they are read, the run is still
        at that fence and has no event that is not printed yet: a resume that claimed it
        meanwhile (a new fence, the old attempt's step still the one after ``step_seq``
        until its opening commit lands) may have run the steps again, and their calls
        come after the resume's events, which the next poll prints first."""
        if step < self.first:
            return
        new = [
            (call, returned, key)
            for call, returned in await reading.journaled_calls(self.store, self.run_id, step)
            if (key := (step, call["position"], returned, call["duration"])) not in self.shown
        ]
        if new and attempt is not None:  # read the run again only for calls to print
            fence, printed_through = attempt
            now = await self.store.get_run(self.run_id)
            if now is None or now.fence != fence or now.event_seq > printed_through:
                return
        for call, returned, key in new:
            self.shown.add(key)
            row = {
                "run_id": self.run_id,
                "seq": None,
                "at": returned or datetime.now(UTC),
                "kind": CALL_JOURNALED,
                "data": {"seq": step, **call},
            }
            print_event(self.out, row)


def print_event(out: Output, row: dict[str, Any]) -> None:
    """Print an event: its line, or with --json one JSON object."""
    if out.as_json:
        out.json(row, indent=False)
    else:
        out.line(event_line(row))
