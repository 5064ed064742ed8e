"""Steps whose agent this worker's Clutch lacks (a Clutch of another version checkpointed
the run): the worker releases the run and sends the step on to that agent's channel, where
it waits for a worker whose Clutch has the agent, as a step whose agent no running worker
hosts does; the run stays running, its state untouched. A step whose stored data no longer
fits the model of its agent here (IncompatibleDataError) is released the same way and its
message acked: a sweep points at it again, for a worker whose model fits it.

A sweep points at such a step again and again; the worker remembers the steps it warned
about (the oldest forgotten first), so that the warning is logged once and its repeats at
debug level.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from nestegg.checkpoint.records import Commit, RunRecord
from nestegg.errors import IncompatibleDataError, StaleOwnerError
from nestegg.transport.base import Delivery, StepMessage, channel_name

if TYPE_CHECKING:
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.clutch import Clutch

log = logging.getLogger("nestegg")

LACKING_KEPT = 4096
"""Runs' steps set aside (an agent this worker's Clutch lacks, a model their data does not
fit) that a worker remembers having warned about."""


class LackingAgents:
    """Sends on the steps whose agent ``clutch`` lacks, and sets aside those whose data no
    longer fits its agent's model, warning once per step."""

    def __init__(self, clutch: Clutch, book: CheckpointedRuns) -> None:
        self.clutch = clutch
        self.book = book
        self.warned: OrderedDict[tuple[str, int, str], None] = OrderedDict()
        """(run id, step_seq, why) of the steps set aside: an agent the Clutch lacks, a
        model."""

    async def send_on(self, claimed: RunRecord, delivery: Delivery, agent: str) -> Delivery | None:
        """Release ``claimed`` and send its next step on to ``agent``'s channel (the
        delivery the broker handed over with the ack, if any)."""
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
        if not await self.released(claimed, delivery):
            return None
        trace = delivery.message.trace
        message = StepMessage(claimed.run_id, claimed.step_seq + 1, claimed.fence, agent, trace)
        return await delivery.forward(channel, message)

    async def set_aside(
        self, claimed: RunRecord, delivery: Delivery, error: IncompatibleDataError
    ) -> None:
        """Release ``claimed``, whose data no longer fits the model of the agent it goes to
        here, and ack its message: the run stays running, untouched, and a sweep points at
        it again (for a worker whose model fits)."""
        log.log(
            self.level(claimed, f"model {error.model}"),
            "%s; the run stays as it is, for a worker whose model fits it",
            error,
            extra={"run_id": claimed.run_id, "agent": error.agent},
        )
        if await self.released(claimed, delivery):
            await delivery.ack()

    async def released(self, claimed: RunRecord, delivery: Delivery) -> bool:
        """Drop the lease of ``claimed``; False (its message acked) when another process
        took it over meanwhile: its new holder has a message."""
        now = self.book.config.clock()
        try:
            release = Commit(claimed.run_id, claimed.fence, lease_until=now, updated_at=now)
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


__all__ = ["LACKING_KEPT", "LackingAgents"]
