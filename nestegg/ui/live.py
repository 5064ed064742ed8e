"""Live updates over server-sent events, read from the store's event log.

The run stream polls the run's events after the last one sent and tells the page what
changed (``event: change``); it ends with ``event: end`` once the run is neither running
nor waiting and its last events are sent. A waiting run's stream also says when its wait
is over (its signal stored, its deadline or timer passed), and it follows the run when
another process resumes it. The runs stream polls the first page of the table and sends
``change`` when any of its runs moved on or a waiting run's wait is over.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse

from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.waiting import resumable_now, wait_due
from nestegg.cli import reading
from nestegg.constants import RUNNING, WAITING
from nestegg.errors import CheckpointCorruptedError, ConfigurationError
from nestegg.ui import queries
from nestegg.ui.pages import int_param, now_of, pipeline_param, status_param, store_of, takes

POLL_SECONDS = 0.25
"""Seconds between reads of a running run's event log."""
WAIT_POLL_SECONDS = 1.0
"""Seconds between reads of a waiting run (its record, events and signals)."""
FOLLOWED = (RUNNING, WAITING)
"""The statuses of a run whose stream stays open: it may go on without this page."""
WAIT_STATES = {"over": True, "on": False}
"""``?wait=`` of the run stream: whether the page shows the run's wait as over."""
RUNS_POLL_SECONDS = 1.0
"""Seconds between reads of the runs table's first page."""
KEEPALIVE_SECONDS = 15.0
EVENTS_PER_READ = 1000
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def message(kind: str, data: object) -> bytes:
    """One server-sent event."""
    return b"event: %s\ndata: %s\n\n" % (kind.encode(), orjson.dumps(data))


def _stream(events: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers=HEADERS)


@takes("since", "wait")
async def run_events(request: Request) -> StreamingResponse:
    """``change`` with the new events' kinds and the run's status and steps, after
    ``?since=`` (an event sequence number), and for a waiting run when its wait is over
    or no longer over (``wait``: ``over`` or ``on``), against ``?wait=`` (what the page
    shows) at first; ``end`` when the run stopped running or waiting."""
    store = store_of(request)
    run = await reading.get_run(store, request.path_params["run_id"])
    since = int_param(request, "since") or 0
    shown = _wait_param(request)

    async def events() -> AsyncIterator[bytes]:
        nonlocal since, shown
        quiet = 0.0
        while True:
            current = await store.get_run(run.run_id)
            if current is None:  # deleted meanwhile
                yield message("end", {"status": "deleted"})
                return
            records = await store.read_events(run.run_id, since, EVENTS_PER_READ)
            data: dict[str, object] = {"seq": since, "kinds": [], "steps": current.step_seq}
            if records:
                since = records[-1].seq
                data.update(seq=since, kinds=sorted({r.kind for r in records}))
            moved = False  # a waiting run's wait is over, or no longer over
            if current.status == WAITING:
                over = await _wait_over(store, current, now_of(request))
                data["wait"] = "over" if over else "on"
                moved, shown = shown is not None and over != shown, over
            if records or moved:
                yield message("change", {**data, "status": current.status})
                quiet = 0.0
            if current.status not in FOLLOWED and since >= current.event_seq:
                yield message("end", {"status": current.status})
                return
            if await request.is_disconnected():
                return
            pause = WAIT_POLL_SECONDS if current.status == WAITING else POLL_SECONDS
            await asyncio.sleep(pause)
            quiet += pause
            if quiet >= KEEPALIVE_SECONDS:
                yield b": keep-alive\n\n"
                quiet = 0.0

    return _stream(events())


async def _wait_over(store: CheckpointStorage, run: RunRecord, now: float) -> bool:
    """Whether a waiting run can go on now; by its deadline alone when its last events
    cannot be read (what it waits for is unknown)."""
    try:
        return await resumable_now(store, run, now)
    except CheckpointCorruptedError:
        return wait_due(run, now)


def _wait_param(request: Request) -> bool | None:
    """``?wait=``: True for ``over``, False for ``on``, None when absent."""
    raw = request.query_params.get("wait")
    if raw is None or raw == "":
        return None
    if raw not in WAIT_STATES:
        raise ConfigurationError(f"wait must be 'over' or 'on', got {raw!r}")
    return WAIT_STATES[raw]


@takes("status", "pipeline", "waits")
async def runs_events(request: Request) -> StreamingResponse:
    """``change`` whenever a run on the table's first page (with its filters) moved on,
    a waiting run's wait ending too (its signal stored from elsewhere, its deadline or
    timer passed), and at first when the waits over are not those of ``?waits=`` (what
    the table shows: :func:`nestegg.ui.queries.waits_token`)."""
    watch = queries.RunsWatch(
        store_of(request),
        status=status_param(request),
        pipeline=pipeline_param(request),
    )
    shown = request.query_params.get("waits") or None

    async def events() -> AsyncIterator[bytes]:
        seen = None
        while True:
            signature = await watch.signature(now_of(request))
            if seen is None:  # at first: against the waits the table shows
                moved = shown not in (None, queries.waits_token(queries.over_in(signature)))
            else:
                moved = signature != seen
            if moved:
                yield message("change", {"runs": len(signature)})
            seen = signature
            if await request.is_disconnected():
                return
            await asyncio.sleep(RUNS_POLL_SECONDS)

    return _stream(events())
