"""The verdict on a delivered step message, read against the run as stored now.

A message only points at a run and a step; the run's stored status, step, fence and
lease decide whether a worker takes it, drops it, waits for a holder's lease or points
the pipeline at the run's current step again, and whether taking it is a takeover of an
interrupted step.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from nestegg.checkpoint.formats import parse_event
from nestegg.checkpoint.ownership import resumption
from nestegg.checkpoint.records import EventRecord, RunRecord
from nestegg.constants import FAILED, RUN_INTERRUPTED, RUN_RESUMED, RUNNING, WAITING
from nestegg.errors import CheckpointCorruptedError
from nestegg.transport.base import StepMessage

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage


class Verdict(enum.Enum):
    """What to do with a delivered message."""

    TAKE = "take"
    DROP = "drop"
    WAIT = "wait"
    REPOINT = "repoint"


def judge(run: RunRecord | None, message: StepMessage, redelivered: bool, now: float) -> Verdict:
    """The verdict on ``message`` given the run as stored now.

    DROP: no such run, finished, step committed, or (a fresh message) the run is held by a
    live worker. REPOINT: a redelivered message for a committed step of an unheld run (its
    worker died between commit and ack, perhaps before publishing the next step, or after
    going on with the run past it): publish the run's current step again. WAIT: a
    redelivered message for a run still held (the holder, perhaps the dead worker that
    took the message and went on with the run, has a lease that has not run out yet):
    look again when it does (a worker stops waiting once a later claim holds the run).
    TAKE: claim the run (a waiting run too, for its waiting step: a sweeper points at it
    when its signal or its time came).
    """
    if run is None or run.status not in (RUNNING, WAITING) or message.seq > run.step_seq + 1:
        return Verdict.DROP
    if run.status == WAITING:  # its lease_until is when its wait ends, not a holder's lease
        return Verdict.TAKE if message.seq == run.step_seq + 1 else Verdict.DROP
    held = run.lease_until is not None and run.lease_until > now
    if held:
        return Verdict.WAIT if redelivered else Verdict.DROP
    if message.seq <= run.step_seq:
        return Verdict.REPOINT if redelivered else Verdict.DROP
    return Verdict.TAKE


def not_here(
    message: StepMessage, run: RunRecord | None, pipeline: str, store: Callable[[], str]
) -> str | None:
    """Why ``message`` points at no run of ``pipeline`` in the worker's store (named as
    ``store()`` says, asked only then), which drops it: the run is not there, or is another
    pipeline's (deleted, or the process that sent the message uses another store than this
    worker); None when it points at one."""
    if run is not None and run.pipeline == pipeline:
        return None
    what = (
        "no such run"
        if run is None
        else f"a run of pipeline {run.pipeline!r}, not {pipeline!r}, of that id"
    )
    return (
        f"step {message.seq} of run {message.run_id!r}: the store of this worker ({store()}) "
        f"has {what}; the message is dropped (the run was deleted, or the process that sent "
        "the message uses another store than this worker)"
    )


def interrupted(run: RunRecord) -> bool:
    """Whether ``run``'s last claim ended neither in a commit that released the run nor in
    a release: its owner died (or lost the store) during a step, or between steps of a
    run it went on with, and its lease runs out instead of being given back.

    A release, and the commit of a step after which the run goes back to the broker, leave
    ``lease_until`` at ``updated_at``; a claim, a renewal and the commit of a step that
    its worker goes on from leave it above. So a run held by a live worker counts as
    interrupted too: ask only once its lease ran out (:func:`judge` takes no held run).
    """
    return (
        run.status == RUNNING and run.lease_until is not None and run.lease_until > run.updated_at
    )


def pointer_fence(run: RunRecord) -> int:
    """The fence of a message that points at ``run``'s next step again (a sweep's, or a
    repoint of a redelivered message): after an interrupted claim, one below the run's,
    as the message that claim took carried, so that the worker claiming it sees a takeover;
    otherwise the run's. :func:`repoint_fence` tells a run a drain gave back too."""
    return run.fence - 1 if interrupted(run) else run.fence


async def repoint_fence(store: CheckpointStorage, run: RunRecord) -> int:
    """:func:`pointer_fence`, and one below the run's for a run whose last claim a drain
    gave back (its log ends with the ``run_interrupted`` of that release, which nothing
    follows until a claim resumes the run): the message that points at it again is then
    the drain's own, lost when its worker died between the release and the publish, and
    the worker claiming it writes ``run_resumed`` as after a drain. Reads the run's last
    event only for a running run that nobody holds; a torn last event counts as no release
    (the run is pointed at as before: its claim goes on from its last commit)."""
    fence = pointer_fence(run)
    if fence < run.fence or run.status != RUNNING:
        return fence
    last = await last_event(store, run)
    return run.fence - 1 if last is not None and last.kind == RUN_INTERRUPTED else fence


async def last_event(store: CheckpointStorage, run: RunRecord) -> EventRecord | None:
    """The last event of ``run`` (as read), None when it has none or its log is torn there:
    what a sweep or a claim asks of it is then not known, and it goes on as without."""
    if run.event_seq == 0:
        return None
    try:
        last = await store.read_events(run.run_id, since_seq=run.event_seq - 1, limit=1)
    except CheckpointCorruptedError:  # a torn log: not a reason to stop a sweep or a claim
        return None
    return last[0] if last else None


class Resumes(enum.Enum):
    """How a claim continues a run that did not simply go on from its last commit."""

    WAITING = "waiting"
    """The run waited (a sweep or its signal points at it once its wait is over)."""
    TAKEOVER = "takeover"
    """The claim's step was cut short by its owner's death: its lease ran out."""
    RELEASED = "released"
    """Its owner gave the claim's step back (a worker's drain)."""


def resumes(run: RunRecord, message: StepMessage) -> Resumes | None:
    """How a claim for ``message`` that :func:`judge` takes continues ``run`` (as read
    before the claim); None: the run goes on from its last commit.

    Claimed after the message was sent (its fence is below the run's) without a commit of
    the message's step since, the run's step under way was interrupted (see
    :func:`interrupted`): a takeover; or it was released, by a worker's drain, which
    publishes the step again with the fence of the message it had taken.
    """
    if run.status == WAITING:
        return Resumes.WAITING
    if run.fence <= message.fence:
        return None
    return Resumes.TAKEOVER if interrupted(run) else Resumes.RELEASED


async def handed_back(store: CheckpointStorage, run: RunRecord, seq: int) -> bool:
    """Whether ``run`` (as read before a claim) was handed back by a resume on workers
    from step ``seq`` and no claim took it since: its log ends with the hand-back's
    ``run_resumed`` from that step, which said what the claim resumes (the steps past
    ``seq``, when its newest valid checkpoint is older than its last step, are dropped by
    the claim's opening commit). A torn last event counts as no hand-back (the claim
    says what it resumes)."""
    resumed = await _hand_back(store, run)
    return resumed is not None and resumed.get("seq") == seq


async def _hand_back(store: CheckpointStorage, run: RunRecord) -> dict[str, Any] | None:
    """The payload of the ``run_resumed`` that ends ``run``'s log (as read), if it does and
    it can be read: a hand-back's, that no claim took since."""
    last = await last_event(store, run)
    if last is None or last.kind != RUN_RESUMED:
        return None
    try:
        return parse_event(last.body, "a hand-back")
    except CheckpointCorruptedError:
        return None


async def failed_step(store: CheckpointStorage, claim: Claim) -> int | None:
    """The step a claim takes up again in a failed run handed back by a resume on workers
    (its last step's next), whose journal then replays up to its first failure (see
    :meth:`~nestegg.checkpoint.checkpointer.Checkpointer.journal_entry`), as a local
    resume of a failed run does; None for any other claim. Its log is read only for a run
    that holds an error, as a failed run reopened does."""
    read = claim.read
    if claim.resumes is not None or read.error is None:
        return None
    resumed = await _hand_back(store, read)
    if resumed is None or resumed.get("previous") != FAILED:
        return None
    return claim.run.step_seq + 1


class Claim(NamedTuple):
    """A run claimed for a delivery, the run as read before the claim (its owner, the
    steps it had committed, its status) and how the claim continues it."""

    run: RunRecord
    read: RunRecord
    resumes: Resumes | None


async def resumed_by(
    store: CheckpointStorage,
    claim: Claim,
    checkpoint_id: str | None,
    seq: int,
    trace: dict[str, str] | None,
) -> list[tuple[str, dict[str, Any]]]:
    """The events that open a claim that resumes its run from checkpoint ``checkpoint_id``
    at step ``seq`` (see :func:`~nestegg.checkpoint.ownership.resumption`): none after a
    hand-back that said it already (:func:`handed_back`), whether the claim is the
    hand-back's message's or an older one's, redelivered from a worker that died in the
    run before it was cancelled (a release to that message, as after a drain)."""
    how = claim.resumes
    if how in (None, Resumes.RELEASED) and await handed_back(store, claim.read, seq):
        return []
    return resumption(
        claim.read,
        checkpoint_id,
        seq,
        interrupted=how is Resumes.TAKEOVER,
        released=how is Resumes.RELEASED,
        trace=trace,
    )
