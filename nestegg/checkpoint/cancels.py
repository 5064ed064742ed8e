"""Cancelling a stored run from outside the process that runs it (``clutch.cancel``,
``nestegg cancel``).

The canceller claims the run as any process taking it does (fence + 1, the store's
compare-and-set), then stores it cancelled with a ``run_cancelled`` event that names the
canceller. The claim takes the run from a live owner too: its next commit (a step's end,
a journaled call's result, a lease renewal) fails with StaleOwnerError, and it stops (a
renewal's failure, at its next step boundary);
:func:`ownership_lost` makes that error say the run was cancelled. A cancelled run is
left alone by sweeps, ``recover()`` and timers; ``resume_latest`` continues it on
purpose. A resume that read the run unfinished and finds it cancelled when it claims it
(a cancel came first) does not reopen it: :func:`cancelled_since_read` says so.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from nestegg.checkpoint.formats import ending_commit, opening_payload, parse_event
from nestegg.checkpoint.ownership import current_owner, owner_payload, run_state
from nestegg.checkpoint.records import Commit, RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.common import run_not_found
from nestegg.constants import (
    CANCEL_CLAIM_TRIES,
    CANCEL_LOOK_SECONDS,
    CANCEL_SETTLE_POLL_SECONDS,
    CANCEL_SETTLE_SECONDS,
    CANCELLED,
    COMPLETED,
    FAILED,
    FINISHED,
    RUN_CANCELLED,
    RUN_STARTED,
    RUNNING,
)
from nestegg.errors import (
    NestEggError,
    RunFinishedError,
    RunLockedError,
    StaleOwnerError,
)


@dataclass(frozen=True, slots=True)
class Cancellation:
    """What :func:`cancel_run` did.

    Attributes:
        run: the run as stored after it.
        previous: what the run was before: ``running`` (a live owner executed it),
            ``interrupted``, ``queued`` (for workers), ``waiting``, or ``cancelled``
            (nothing was done).
        previous_owner: the owner it was taken from (host, pid, started), if any.
    """

    run: RunRecord
    previous: str
    previous_owner: dict[str, Any] | None

    @property
    def done(self) -> bool:
        """Whether the run was cancelled now (False: it was cancelled already)."""
        return self.previous != CANCELLED


def _refuse(run: RunRecord, pipeline: str | None) -> None:
    """Refuse to cancel a completed or failed run, or a run of another pipeline."""
    if pipeline is not None:  # a Clutch's cancel (admission: a resume's, not a reader's)
        from nestegg.checkpoint.admission import check_pipeline

        check_pipeline(run, pipeline, ": it was not cancelled")
    if run.status in (COMPLETED, FAILED):
        raise RunFinishedError(
            run.run_id,
            run.status,
            f"run {run.run_id!r} is {run.status}: only a running or waiting run can be "
            "cancelled; nothing was changed",
        )


def _cancel_commit(claimed: RunRecord, previous: str, taken_from: RunRecord, now: float) -> Commit:
    """The commit that stores the ``claimed`` run cancelled: its ``run_started`` first
    when its log is empty (a queued run no worker took yet), then ``run_cancelled``."""
    payload = {
        "steps": claimed.step_seq,
        "outside": True,
        "by": owner_payload(current_owner()),
        "previous": previous,
        "previous_owner": owner_payload(taken_from.owner),
    }
    kinds = [(RUN_STARTED, opening_payload())] if claimed.event_seq == 0 else []
    kinds.append((RUN_CANCELLED, payload))
    return ending_commit(claimed, now, CANCELLED, kinds, lease_until=now)


async def cancel_run(
    store: CheckpointStorage,
    run_id: str,
    now: float,
    *,
    lease_seconds: float,
    pipeline: str | None = None,
) -> Cancellation:
    """Cancel run ``run_id`` from outside: claim it (fence + 1), then store it cancelled
    with a ``run_cancelled`` event naming this process. A run claimed by another process
    between the read and the claim is read and claimed again.

    Args:
        now: the time of the claim and the event.
        lease_seconds: how long the claim holds the run before it is stored cancelled.
        pipeline: refuse a run of another pipeline (None: any).

    Raises:
        RunNotFoundError: no such run (nothing changes).
        RunFinishedError: the run completed or failed (nothing changes).
        ConfigurationError: the run belongs to another pipeline (nothing changes).
        RunLockedError: other processes claimed it again and again meanwhile.
    """
    for _ in range(CANCEL_CLAIM_TRIES):
        run = await store.get_run(run_id)
        if run is None:
            raise run_not_found(run_id)
        _refuse(run, pipeline)
        if run.status == CANCELLED:
            return Cancellation(run, CANCELLED, None)
        previous = run_state(run, now)
        try:
            claimed = await store.claim_run(
                run_id, run.fence, current_owner(), now + lease_seconds, now
            )
        except RunLockedError:  # taken (or ended) at the same moment: look again
            continue
        await store.commit(_cancel_commit(claimed, previous, run, now))
        stored = await store.get_run(run_id)
        return Cancellation(stored or claimed, previous, owner_payload(run.owner))
    raise RunLockedError(
        f"run {run_id!r} was claimed by other processes meanwhile; try again", run_id
    )


async def cancelled_by(store: CheckpointStorage, run: RunRecord) -> dict[str, Any] | None:
    """The ``run_cancelled`` event of a run cancelled from outside (its payload), None when
    ``run`` is not cancelled or its last event says nothing of who cancelled it.

    Raises:
        CheckpointCorruptedError: the run's last events are damaged (who cancelled it is
            unknown).
    """
    if run.status != CANCELLED or run.event_seq == 0:
        return None
    for record in await store.read_events(run.run_id, run.event_seq - 1):
        if record.kind != RUN_CANCELLED:
            continue
        payload = parse_event(record.body, f"event {record.seq} of run {run.run_id!r}")
        return payload if payload.get("outside") else None
    return None


async def cancel_requested(store: CheckpointStorage, run_id: str) -> bool:
    """Whether a cancel of ``run_id`` was requested from outside while this process runs
    it: the run is stored cancelled, which its owner here learns at its next commit. One
    read, of CANCEL_LOOK_SECONDS at most; False when the store does not answer so."""
    try:
        async with asyncio.timeout(CANCEL_LOOK_SECONDS):
            run = await store.get_run(run_id)
    except (NestEggError, TimeoutError):  # the caller's own error stands
        return False
    return run is not None and run.status == CANCELLED


async def cancel_note(store: CheckpointStorage, run_id: str, *, settle: bool = False) -> str | None:
    """``run 'x' was cancelled from outside (by pid P on H)`` when the store says so;
    None otherwise, or when the store cannot be read. With ``settle``, a run found running
    (claimed by another process) is read again for up to CANCEL_SETTLE_SECONDS: a cancel
    stores the run cancelled just after its claim. A run its new owner writes to meanwhile
    (another event, another claim) and leaves running was not claimed by a cancel: the
    reads stop there, so a resume that lost to another resume says so at once."""
    deadline = time.monotonic() + (CANCEL_SETTLE_SECONDS if settle else 0.0)
    first: tuple[int, int] | None = None  # the fence and event seq of the first read
    try:
        while True:
            run = await store.get_run(run_id)
            cancel = await cancelled_by(store, run) if run is not None else None
            if cancel is not None or run is None or run.status != RUNNING:
                break
            if first is None:
                first = (run.fence, run.event_seq)
            elif (run.fence, run.event_seq) != first:  # its new owner wrote, running on:
                break  # a resume's or a worker's claim, not a cancel's
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(CANCEL_SETTLE_POLL_SECONDS)
    except NestEggError:  # the store's own failure: the caller's error stands
        return None
    if cancel is None:
        return None
    by = cancel.get("by") or {}
    return (
        f"run {run_id!r} was cancelled from outside (by pid {by.get('pid', '?')} on "
        f"{by.get('host', '?')})"
    )


async def cancelled_since_read(store: CheckpointStorage, run_id: str) -> RunFinishedError:
    """The refusal of a resume that read run ``run_id`` unfinished, or was not told to
    reopen a cancelled run, and found it cancelled: nothing was resumed."""
    note = await cancel_note(store, run_id, settle=True) or f"run {run_id!r} was cancelled"
    return RunFinishedError(
        run_id,
        CANCELLED,
        f"{note} before this resume claimed it; nothing was resumed: resume it again to "
        "continue it on purpose",
    )


async def claim_to_resume(
    store: CheckpointStorage,
    run: RunRecord,
    lease_until: float,
    now: float,
    *,
    reopen_cancelled: bool,
) -> RunRecord:
    """Claim ``run`` (as read) for a resume by this process: a finished run is reopened on
    purpose, a cancelled one only with ``reopen_cancelled``.

    Raises:
        RunFinishedError: ``run`` is cancelled and not to be reopened, or was cancelled
            since it was read (:func:`cancelled_since_read`); or another process ended it
            since (status completed or failed).
        RunLockedError: another process claimed it since it was read.
    """
    if run.status == CANCELLED and not reopen_cancelled:
        raise await cancelled_since_read(store, run.run_id)
    try:
        return await store.claim_run(
            run.run_id, run.fence, current_owner(), lease_until, now, reopen=run.status in FINISHED
        )
    except RunLockedError:  # another claim came first: a cancel's, perhaps
        if run.status == CANCELLED or await cancel_note(store, run.run_id, settle=True) is None:
            raise
        raise await cancelled_since_read(store, run.run_id) from None


async def ownership_lost(
    store: CheckpointStorage, lost: StaleOwnerError, *, settle: bool = False
) -> StaleOwnerError:
    """The error an owner that lost its run raises: one saying that the run was cancelled
    from outside (by whom, how to continue it) when the store says so (``settle``: as
    :func:`cancel_note`), else ``lost``."""
    run_id = lost.run_id
    note = await cancel_note(store, run_id, settle=settle) if run_id is not None else None
    if note is None:
        return lost
    return StaleOwnerError(
        f"{note}; this process stopped it, the step under way not recorded: "
        f"resume_latest({run_id!r}) continues it",
        run_id,
    )
