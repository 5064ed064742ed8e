"""Steps whose agent this worker's Clutch lacks (a Clutch of another version checkpointed the
run): the worker releases the run and sends the step on to that agent's channel, where it
waits for a worker whose Clutch has the agent, as a step whose agent no running worker
hosts does; the run stays running, its state untouched (a claim that took it over or
resumed it writes what it resumed with the release: the worker that runs the step only goes
on). A step whose stored data no longer fits the model of its agent here
(IncompatibleDataError) is released the same way and its message acked: a sweep points at
it again, for a worker whose model fits it (a rolling deploy). The release leaves the run's
``lease_until`` at the time the step was first set aside, below its ``updated_at`` (a mark
no other write leaves on a running run; a worker that only sends the step on to its agent's
channel keeps it), and once the step has been set aside for the misfit grace
(``MISFIT_GRACE_LEASES`` leases by default) the worker that gets it fails the run with the
IncompatibleDataError instead: the caller's ``result()`` raises then, as in a run without
workers, rather than waiting for a worker that may never come.

A sweep points at such a step again and again; the worker remembers the steps it warned
about (the oldest forgotten first), so that the warning is logged once and its repeats at
debug level.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nestegg.checkpoint.admission import resume_point
from nestegg.checkpoint.formats import ending_commit
from nestegg.checkpoint.records import RunRecord
from nestegg.constants import RUNNING
from nestegg.errors import IncompatibleDataError, StaleOwnerError
from nestegg.transport.base import Delivery, StepMessage, channel_name
from nestegg.transport.verdicts import Claim, resumed_by

if TYPE_CHECKING:
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.clutch import Clutch

log = logging.getLogger("nestegg")

LACKING_KEPT = 4096
"""Runs' steps set aside (an agent this worker's Clutch lacks, a model their data does not
fit) that a worker remembers having warned about."""
MISFIT_GRACE_LEASES = 10
"""Leases a step whose data does not fit its agent's model may stay set aside, for a
worker whose model fits, before the worker that gets it fails the run (a worker's
``misfit_grace``, in seconds, by default: five minutes with the default lease of 30 s)."""
SET_ASIDE_MARK_GAP = 1e-3
"""Seconds a set-aside's mark (its ``lease_until``) stays below the release's
``updated_at`` at least, so that the mark is told apart from a plain release's
``lease_until``, equal to it, also when the clock did not move in between."""


class LackingAgents:
    """Sends on the steps whose agent ``clutch`` lacks, and sets aside those whose data no
    longer fits its agent's model, warning once per step."""

    def __init__(self, clutch: Clutch, book: CheckpointedRuns, misfit_grace: float) -> None:
        self.clutch = clutch
        self.book = book
        self.misfit_grace = misfit_grace
        """Seconds a step may stay set aside for a model before its run is failed."""
        self.warned: OrderedDict[tuple[str, int, str], None] = OrderedDict()
        """(run id, step_seq, why) of the steps set aside: an agent the Clutch lacks, a
        model."""

    async def send_on(self, claim: Claim, delivery: Delivery, agent: str) -> Delivery | None:
        """Release the run of ``claim`` and send its next step on to ``agent``'s channel
        (the delivery the broker handed over with the ack, if any); a step set aside for a
        model keeps its mark (:func:`set_aside_since`), so its misfit grace goes on. A
        claim that resumed the run writes what it resumed with the release, as
        :meth:`set_aside` does: the worker that runs the step only goes on."""
        claimed = claim.run
        channel = channel_name(self.clutch.name, agent)
        log.log(
            self.level(claimed, f"agent {agent}"),
            "run %r continues with agent %r, which Clutch %r of this worker does not have: "
            "its step waits in %s for a worker whose Clutch has it",
            claimed.run_id,
            agent,
            self.clutch.name,
            channel,
            extra={"run_id": claimed.run_id, "agent": agent},
        )
        trace = delivery.message.trace
        events = await self.resumed(claim, trace)
        if not await self.released(claimed, delivery, set_aside_since(claim.read), events):
            return None
        message = StepMessage(claimed.run_id, claimed.step_seq + 1, claimed.fence, agent, trace)
        return await delivery.forward(channel, message)

    def misfit(self, claim: Claim, error: IncompatibleDataError) -> IncompatibleDataError | None:
        """The error to fail the run of ``claim`` with, its data set aside for
        ``misfit_grace`` seconds already (None: set it aside, see :meth:`set_aside`)."""
        now = self.book.config.clock()
        if now - due_since(claim, now) < self.misfit_grace:
            return None
        return IncompatibleDataError(
            error.run_id, error.step, error.agent, error.model, error.reason, self.misfit_grace
        )

    async def set_aside(
        self, claim: Claim, delivery: Delivery, error: IncompatibleDataError
    ) -> None:
        """Release the run of ``claim``, whose data no longer fits the model of the agent
        it goes to here, and ack its message: the run stays running, untouched (its
        ``lease_until`` marks when its step became due, see :func:`set_aside_since`), and
        a sweep points at it again (for a worker whose model fits). A claim that resumed
        the run (a takeover, a release, a waiting run) writes what it resumed with the
        release (``run_interrupted``, ``run_resumed``): the claims after it only go on."""
        claimed = claim.run
        log.log(
            self.level(claimed, f"model {error.model}"),
            "%s; the run stays as it is, for a worker whose model fits it (it fails if "
            "none takes it within %g s)",
            error,
            self.misfit_grace,
            extra={"run_id": claimed.run_id, "agent": error.agent},
        )
        since = due_since(claim, self.book.config.clock())
        events = await self.resumed(claim, delivery.message.trace)
        if await self.released(claimed, delivery, since, events):
            await delivery.ack()

    async def resumed(self, claim: Claim, trace: dict[str, str]) -> list[tuple[str, Any]]:
        """The events that say what ``claim`` resumed: none when it simply goes on, or when
        a release before it said so already (:func:`resumed_by`)."""
        if claim.resumes is None:
            return []
        state, _ = await resume_point(self.book.store, claim.run)
        checkpoint_id = state.checkpoint.checkpoint_id if state.checkpoint else None
        return await resumed_by(self.book.store, claim, checkpoint_id, state.seq, trace)

    async def released(
        self,
        claimed: RunRecord,
        delivery: Delivery,
        since: float | None = None,
        events: Sequence[tuple[str, Any]] = (),
    ) -> bool:
        """Drop the lease of ``claimed`` (``since``: set aside since then), writing
        ``events`` with it; False (its message acked) when another process took it over
        meanwhile: its new holder has a message."""
        now = self.book.config.clock()
        # A mark below the release's updated_at, also when the clock has not moved since.
        until = now if since is None else min(since, now - SET_ASIDE_MARK_GAP)
        try:
            release = ending_commit(claimed, now, RUNNING, events, lease_until=until)
            await self.book.store.commit(release)
        except StaleOwnerError:
            await delivery.ack()
            return False
        return True

    def level(self, claimed: RunRecord, what: str) -> int:
        """WARNING the first time this worker sets a run's step aside for ``what`` (an
        agent it lacks, a model the data does not fit), DEBUG when a sweep brought the
        same step back (each claim raises the fence: not in the key)."""
        key = (claimed.run_id, claimed.step_seq, what)
        if key in self.warned:
            self.warned.move_to_end(key)
            return logging.DEBUG
        self.warned[key] = None
        if len(self.warned) > LACKING_KEPT:
            self.warned.popitem(last=False)
        return logging.WARNING


def set_aside_since(run: RunRecord) -> float | None:
    """When the step of ``run`` (as read) was first set aside for a model its data does
    not fit (None: it is not): a set-aside's release leaves ``lease_until`` there, below
    ``updated_at``, where a claim, a renewal or another release leaves it at or above."""
    until = run.lease_until
    return until if run.status == RUNNING and until is not None and until < run.updated_at else None


def due_since(claim: Claim, now: float) -> float:
    """When the step of ``claim`` was first set aside for a model its data does not fit:
    as its run's mark says (:func:`set_aside_since`), or ``now`` when this is the first
    time. Not when the step became due: a step that waited in the broker longer than the
    misfit grace (a backlog, every worker down during a deploy) still gets its grace."""
    since = set_aside_since(claim.read)
    return now if since is None else since


__all__ = ["LACKING_KEPT", "MISFIT_GRACE_LEASES", "LackingAgents", "due_since", "set_aside_since"]
