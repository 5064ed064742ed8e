"""The caller's side: store a run, publish its first step, wait for its outcome.

A caller never executes agents. It learns what workers did from the store alone: the
run's status for the outcome, the event log and step records for streamed steps. Any
process can wait for any run, so a caller that restarted picks its result up again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nestegg import otel
from nestegg.agents import to_plain
from nestegg.cancellation import CancelWatch
from nestegg.checkpoint.codec import decode_value, unseal, unseal_json
from nestegg.checkpoint.formats import opening_payload, parse_event, refusal_body
from nestegg.checkpoint.step_formats import step_data
from nestegg.checkpoint.stores.common import run_not_found
from nestegg.checkpoint.views import run_input, run_result
from nestegg.checkpoint.waiting import still_waiting, wait_over
from nestegg.constants import (
    CANCELLED,
    COMPLETED,
    FAILED,
    RUN_STARTED,
    STEP_COMPLETED,
    WAITING,
)
from nestegg.durations import seconds_or_none
from nestegg.errors import NestEggError, RunFailedError, TransportError
from nestegg.task import StepEvent, StepListeners, outcome_hint
from nestegg.transport import tracing
from nestegg.transport.base import (
    OpeningProbe,
    StepMessage,
    Transport,
    channel_name,
    using,
)
from nestegg.transport.routes import first_route
from nestegg.wording import STEPS, counted

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.clutch import Clutch

log = logging.getLogger("nestegg")

POLL_FIRST = 0.005
"""Seconds between the first polls of a run's outcome; the gap grows with the time waited
(POLL_SHARE of it, so the outcome is seen at most that share late) up to POLL_MAX."""
POLL_SHARE = 0.125
POLL_MAX = 0.25


def failure_of(run: RunRecord) -> RunFailedError:
    """The RunFailedError of a failed or cancelled run, from its stored error."""
    if run.status == CANCELLED:
        return RunFailedError(run.run_id, None, "CancelledError", "the run was cancelled")
    detail: dict[str, Any] = {}
    if run.error is not None:
        detail = unseal_json(run.error, f"error of run {run.run_id!r}") or {}
    agent, hook = detail.get("agent"), detail.get("hook")
    return RunFailedError(
        run.run_id,
        str(agent) if agent else None,
        str(detail.get("type", "Exception")),
        str(detail.get("message", "")),
        str(hook) if hook else None,
    )


class Watcher:
    """Follows one run in the store: its committed steps (as StepEvents) and outcome."""

    def __init__(self, store: CheckpointStorage, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.event_seq = 0
        self.data: Any = None
        self.started = False

    async def steps(self, run: RunRecord) -> list[StepEvent]:
        """StepEvents of the steps committed since the last call, in order."""
        if not self.started:
            self.data, self.started = run_input(run), True
        events = await self.store.read_events(self.run_id, self.event_seq)
        found: list[StepEvent] = []
        for event in events:
            self.event_seq = event.seq
            if event.kind != STEP_COMPLETED:
                continue
            seq = int(parse_event(event.body, f"event {event.seq}")["seq"])
            for record in await self.store.load_steps(self.run_id, seq - 1, seq):
                where = f"step {record.seq} of run {self.run_id!r}"
                data = step_data(unseal(record.body, where), where)
                if data is not None:
                    self.data = decode_value(data, where)
                found.append(StepEvent(record.agent, self.data))
        return found


@dataclass
class RemoteProgress:
    """What a caller has seen of its run in the store, to say why a wait for its result
    timed out: whether a worker took it."""

    pipeline: str
    created: RunRecord | None = None
    """The run as the caller stored it."""
    seen: RunRecord | None = None
    """The run as the caller's last look at the store found it."""
    publishing: Transport | None = None
    """The transport publishing the run's first step now (None: not under way)."""

    def saw(self, run: RunRecord) -> None:
        """Note the run as a look at the store found it."""
        self.seen = run

    async def late(self, limit: float) -> str | TransportError:
        """Why the run's result did not come within ``limit`` seconds: the message of a
        TimeoutError, or the TransportError of a broker connection whose opening holds
        the stored run's first step (what the caller gets once the opening times out)."""
        if self.created is not None and isinstance(self.publishing, OpeningProbe):
            unanswered = self.publishing.unanswered()
            if unanswered is not None:
                return type(unanswered)(f"{unanswered}; {unpublished(self.created.run_id)}")
        if self.created is None:
            return (
                f"the run was not stored within {limit:g} s (its on_request hook and its "
                "write to the store took longer)"
            )
        seen = self.seen or self.created
        if seen.fence == self.created.fence:  # no claim since it was stored
            return (
                f"no worker took the first step of run {seen.run_id!r} within {limit:g} s: "
                f"is a worker of pipeline {self.pipeline!r} running (nestegg worker "
                "module:attr), on this caller's store (a worker on another store drops the "
                "step, with a warning)? The run is stored, and a worker that starts takes it: "
                f"{outcome_hint(seen.run_id)}"
            )
        return (
            f"run {seen.run_id!r} did not finish within {limit:g} s "
            f"({counted(seen.step_seq, STEPS)} committed by the workers so far); it goes on: "
            f"{outcome_hint(seen.run_id)}"
        )


async def wait_result(
    store: CheckpointStorage,
    run_id: str,
    timeout: float | None,
    listeners: StepListeners | None = None,
    seen: Callable[[RunRecord], None] | None = None,
    clock: Callable[[], float] = time.time,
    *,
    on_workers: bool = True,
) -> Any:
    """The run's result once it is stored, publishing its steps to ``listeners`` and
    handing every look at the run to ``seen``.

    A waiting run whose wait is over by ``clock`` (its signal stored, its deadline or
    timer passed) is waited for like a running one when ``on_workers`` (a worker's sweep
    resumes it); else it raises at once a RunWaiting saying so (``over``: ``recover()`` or
    ``resume_latest`` continues it, unless a ``signal()`` or a ``recover()`` elsewhere is
    doing so now). ``on_workers``: the RunWaiting of a run whose timer is not due says a
    worker's sweep resumes it (else: ``recover()``).

    Raises:
        RunNotFoundError: no such run.
        RunFailedError: the run failed or was cancelled.
        RunWaiting: the run waits for a signal or a timer, and its wait is not over (or,
            not ``on_workers``, is over).
        TimeoutError: not finished within ``timeout`` seconds.
    """
    started = time.monotonic()
    limit = seconds_or_none(timeout, "timeout")
    deadline = None if limit is None else started + limit
    watcher = Watcher(store, run_id)
    pause = POLL_FIRST
    stop = CancelWatch()
    while True:
        stop.raise_if_requested()  # cancelled, also if a library lost the cancellation
        run = await store.get_run(run_id)
        if run is None:
            raise run_not_found(run_id)
        if seen is not None:
            seen(run)
        if listeners is not None and listeners.queues:
            for event in await watcher.steps(run):
                listeners.publish(event)
        if run.status == COMPLETED:
            return run_result(run)
        if run.status in (FAILED, CANCELLED):
            raise failure_of(run)
        waiting = await still_waiting(store, run, clock(), on_workers=on_workers)
        if waiting is not None:
            raise waiting
        if run.status == WAITING and not on_workers:  # over, and no sweep here goes on
            raise await wait_over(store, run)
        if deadline is not None and time.monotonic() + pause > deadline:
            raise TimeoutError(f"run {run_id!r} did not finish within {timeout} s")
        await asyncio.sleep(pause)
        waited = time.monotonic() - started
        pause = min(max(POLL_FIRST, waited * POLL_SHARE), POLL_MAX)


def unpublished(run_id: str) -> str:
    """What becomes of the stored run ``run_id`` whose first step could not be published."""
    return (
        f"run {run_id!r} is stored, queued for workers: a worker's sweep publishes it once "
        f"it has been untouched for sweep_after (five leases by default), and "
        f"await clutch.result({run_id!r}) waits for it; await clutch.cancel({run_id!r}) "
        "keeps every worker from running it"
    )


async def publish_first(
    clutch: Clutch, transport: Transport, run: RunRecord, trace: dict[str, str] | None = None
) -> None:
    """Publish the first step of a stored run (to its first agent's channel, or to the
    pipeline's for a SELECTOR), carrying the caller's ``trace`` context."""
    agent = first_route(clutch)
    message = StepMessage(run.run_id, 1, run.fence, agent, trace or {})
    await transport.publish(channel_name(clutch.name, agent), message)


async def run_remote(
    clutch: Clutch,
    book: CheckpointedRuns,
    transport: Transport,
    input_data: Any,
    run_id: str | None,
    listeners: StepListeners,
    progress: RemoteProgress | None = None,
    published: Callable[[], None] | None = None,
) -> Any:
    """Store a new run, publish its first step and wait for its result (hooks included),
    keeping ``progress`` up to date and calling ``published()`` once the first step is
    published.

    A run id that completed gives its stored result and publishes nothing. The transport's
    connection is in use until the run's outcome is known (a RabbitMQ connection that no
    other run, worker or ``async with clutch`` uses is then closed).
    """
    run = await book.queued_record(input_data, run_id)
    if run.status == COMPLETED:
        return run_result(run)
    if progress is None:
        progress = RemoteProgress(clutch.name)
    watched = progress
    plain = to_plain(input_data)

    async def publish_and_wait() -> Any:
        watched.publishing = transport
        try:
            await publish_first(clutch, transport, run, otel.inject_context())
        except TransportError as error:  # the run is stored: say what becomes of it
            raise type(error)(f"{error}; {unpublished(run.run_id)}") from error
        finally:
            watched.publishing = None
        if published is not None:
            published()
        return await wait_result(
            book.store, run.run_id, None, listeners, watched.saw, book.config.clock
        )

    async def work() -> Any:
        # stored once on_request passed: before that, no worker's sweep may take it
        stored = await book.store_queued(run)
        if stored.status == COMPLETED:  # completed with this input since it was read
            return run_result(stored)
        watched.created = stored
        return await publish_and_wait()

    async def refused(error: Exception) -> None:
        await fail_refused(book, run, plain, error)

    async def hooked() -> Any:
        return await clutch.call_with_hooks(run.run_id, plain, work, refused=refused)

    async with using(transport):
        return await tracing.traced_remote_run(clutch, book.store, run, hooked)


async def fail_refused(book: CheckpointedRuns, run: RunRecord, data: Any, error: Exception) -> None:
    """Store the new ``run`` of input ``data`` (plain; not stored yet: the hook is awaited first)
    as failed with the error its ``on_request`` hook raised, so that no worker or sweep
    ever takes it; its resume awaits the hook again. Its events, checkpoint and telemetry
    are a local refused run's: ``run_started`` (with the caller's trace context, as a
    worker's), a checkpoint of its input, ``run_failed``, written by its checkpointer
    (timed, ``on_checkpoint`` called), and the run counted failed in ``nestegg.runs``
    (no worker ever sees it). A run of that id stored meanwhile is left alone.

    Two writes, as a local run's (the store has none that creates a run with its first
    commit): the run, created failed already, then its events; a caller stopped between
    them leaves the run failed with the hook's error, without events."""
    now = book.config.clock()
    failed = dataclasses.replace(run, status=FAILED, error=refusal_body(error), updated_at=now)
    tracing.count_refused(run)
    try:
        await book.store.create_run(failed)
    except NestEggError as failure:  # the caller gets the hook's error all the same
        log.warning(
            "could not record that on_request refused run %r: %s",
            run.run_id,
            failure,
            extra={"run_id": run.run_id},
        )
        return
    start = book.fresh_start(run.run_id, data, StepListeners())
    recorder = book.new_checkpointer(failed, start.base, [])
    recorder.event(RUN_STARTED, now, opening_payload(otel.inject_context()))
    await recorder.request_failed(error)  # logs a store's failure
