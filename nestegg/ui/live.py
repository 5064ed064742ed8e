"""Live updates over server-sent events, read from the store's event log.

The run stream polls the run's events after the last one sent and tells the page what
changed (``event: change``); it ends with ``event: end`` once the run is no longer running
and its last events are sent. The runs stream polls the first page of the table and sends
``change`` when any of its runs moved on.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse

from nestegg.cli import reading
from nestegg.constants import RUNNING
from nestegg.ui import queries
from nestegg.ui.pages import int_param, now_of, status_param, store_of, takes

POLL_SECONDS = 0.25
"""Seconds between reads of a run's event log."""
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


@takes("since")
async def run_events(request: Request) -> StreamingResponse:
    """``change`` with the new events' kinds and the run's status and steps, after
    ``?since=`` (an event sequence number); ``end`` when the run stopped running."""
    store = store_of(request)
    run = await reading.get_run(store, request.path_params["run_id"])
    since = int_param(request, "since") or 0

    async def events() -> AsyncIterator[bytes]:
        nonlocal since
        quiet = 0.0
        while True:
            current = await store.get_run(run.run_id)
            if current is None:  # deleted meanwhile
                yield message("end", {"status": "deleted"})
                return
            records = await store.read_events(run.run_id, since, EVENTS_PER_READ)
            if records:
                since = records[-1].seq
                kinds = sorted({r.kind for r in records})
                data = {"seq": since, "kinds": kinds, "steps": current.step_seq}
                yield message("change", {**data, "status": current.status})
                quiet = 0.0
            if current.status != RUNNING and since >= current.event_seq:
                yield message("end", {"status": current.status})
                return
            if await request.is_disconnected():
                return
            await asyncio.sleep(POLL_SECONDS)
            quiet += POLL_SECONDS
            if quiet >= KEEPALIVE_SECONDS:
                yield b": keep-alive\n\n"
                quiet = 0.0

    return _stream(events())


@takes("status", "pipeline")
async def runs_events(request: Request) -> StreamingResponse:
    """``change`` whenever a run on the table's first page (with its filters) moved on."""
    store = store_of(request)
    status = status_param(request)
    pipeline = request.query_params.get("pipeline") or None

    async def events() -> AsyncIterator[bytes]:
        seen = None
        while True:
            signature = await queries.runs_signature(
                store, status=status, pipeline=pipeline, now=now_of(request)
            )
            if seen is not None and signature != seen:
                yield message("change", {"runs": len(signature)})
            seen = signature
            if await request.is_disconnected():
                return
            await asyncio.sleep(RUNS_POLL_SECONDS)

    return _stream(events())
