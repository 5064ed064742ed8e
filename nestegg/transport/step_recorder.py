"""The checkpointer of a run's steps on a worker (:class:`StepRecorder`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

from nestegg.checkpoint.checkpointer import Checkpointer
from nestegg.checkpoint.heartbeat import heartbeats
from nestegg.checkpoint.records import Commit
from nestegg.constants import OUTCOME_COMPLETED, RUN_INTERRUPTED
from nestegg.errors import NestEggError
from nestegg.recording import StepResult
from nestegg.transport.base import Delivery


class StepRecorder(Checkpointer):
    """The checkpointer of a run's steps on a worker, from the message the worker took:
    every step is checkpointed and committed at once; its heartbeat renews the lease and
    then keeps the message fresh; a step's commit renews the lease when this worker goes
    on with the run (``goes_on()`` says so when asked at the commit), and otherwise
    releases it when the run simply continues from the step."""

    RENEWAL_FAILURES = (NestEggError, OSError)

    def __init__(
        self,
        *args: Any,
        delivery: Delivery,
        goes_on: Callable[[], Awaitable[bool]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.delivery = delivery
        self.goes_on = goes_on
        self.going_on = False
        """Whether the last step's commit kept the lease for this worker's next step."""
        self.renewing = True
        self.renew_lock = asyncio.Lock()
        self._renewed_at = time.monotonic()
        """When the heartbeat last renewed the lease (monotonic; first: now)."""

    def begin(self) -> None:
        """Start the heartbeat without an opening commit."""
        self.heartbeat = heartbeats().beat(self)

    def _renewal_due_in(self) -> float:
        """A renewal every third of the lease from the last one (the first: from the
        recorder's making), whatever the steps commit: each keeps the message fresh too."""
        return self._renewed_at + self.lease_seconds / 3 - time.monotonic()

    async def _renew(self) -> bool:
        """Renew the lease and keep the message fresh once; False once renewing stopped."""
        self._renewed_at = time.monotonic()
        async with self.renew_lock:
            if not self.renewing:
                return False
            lease = self.clock() + self.lease_seconds
            await self.store.commit(Commit(self.run_id, self.fence, lease_until=lease))
            await self.delivery.keep_alive()
            return True

    async def stop_renewing(self) -> None:
        """No renewal from now on (waits for one under way)."""
        async with self.renew_lock:
            self.renewing = False

    async def record_step(self, step: StepResult) -> None:
        """Commit the step. When this worker goes on with the run, the commit renews the
        lease; otherwise a step the run simply continues from releases the lease in the
        same commit (any worker may take the next step at once)."""
        self.going_on = self.goes_on is not None and await self.goes_on()
        if step.outcome == OUTCOME_COMPLETED and not self.going_on:
            await self.stop_renewing()
            self.lease_seconds = 0.0
        await super().record_step(step)

    async def release(
        self, interrupted: dict[str, Any] | None = None, *, set_aside: float | None = None
    ) -> None:
        """Drop the lease now (checkpoint kept): any worker may take the run. With
        ``interrupted`` (a drain giving the step under way back), the same commit writes
        what is pending (the step's start, a new run's opening) and ``run_interrupted``
        with that payload. ``set_aside``: when the run's step was first set aside for a
        model its data does not fit (kept as :func:`~nestegg.transport.lacking.set_aside`
        marks it)."""
        await self.stop_renewing()
        now = self.clock()
        until = now if set_aside is None else set_aside
        commit = Commit(self.run_id, self.fence, lease_until=until, updated_at=now)
        if interrupted is not None:
            with contextlib.suppress(Exception):  # a start that failed stays pending
                await self._settle_start()
            self._take_start(self.pending)
            self.event(RUN_INTERRUPTED, now, interrupted)
            self._opening = False
            commit.events, self.pending = self.pending.events, Commit(self.run_id, self.fence)
            commit.event_seq = self.event_seq
        await self.store.commit(commit)

    async def close(self) -> None:
        """Stop the heartbeat."""
        await self._stop()


__all__ = ["StepRecorder"]
