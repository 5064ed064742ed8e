"""The runs' heartbeats: one timer of each event loop renews the leases of all its runs.

A process executing a run renews its lease a third of it after it was last set (the
checkpointer's; the step recorder's on a worker keeps the run's message fresh too). A task
a run for that would keep, for every run in flight, a task, its coroutines, a future, a
timer and a context alive for as long as the run: with thousands of runs at once, a good
share of a run's memory and of what the garbage collector visits
(``bench/concurrent_runs.py``). Here each run's next renewal waits in one heap of the loop,
and one timer wakes up for the earliest; a renewal due runs as a task of its own, the
only one while it is under way.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import logging
from typing import Protocol

from nestegg.cancellation import cancel_and_wait
from nestegg.checkpoint.per_loop import PerLoop
from nestegg.errors import StaleOwnerError

log = logging.getLogger("nestegg")


class Renewer(Protocol):
    """What a heartbeat renews: a run's writer, which knows when a renewal is due."""

    run_id: str

    @property
    def RENEWAL_FAILURES(self) -> tuple[type[Exception], ...]:
        """What a failed renewal raises that the heartbeat logs and outlives (the next
        renewal is made when due)."""
        ...

    def _renewal_due_in(self) -> float:
        """Seconds until a renewal is due (not above 0: now)."""
        ...

    async def _renew(self) -> bool:
        """Renew once; True: renew again when due."""
        ...

    async def _cancel_note(self) -> str | None:
        """Once a renewal found the run another owner's: what a cancel from outside noted
        (None: it was taken over)."""
        ...


class Heartbeat:
    """The lease renewals of one run, made by its loop's :class:`Heartbeats` until
    :meth:`stop`."""

    __slots__ = ("_beats", "context", "renewal", "renewer")

    def __init__(self, beats: Heartbeats, renewer: Renewer) -> None:
        self._beats = beats
        self.renewer: Renewer | None = renewer
        """None once stopped (a stopped heartbeat left in the heap holds no run)."""
        self.context: contextvars.Context | None = contextvars.copy_context()
        """The run's context, which its renewals run in, as its own task's did."""
        self.renewal: asyncio.Task[None] | None = None
        """The renewal under way."""

    async def stop(self) -> None:
        """No renewal from now on; a renewal under way is cancelled and waited for."""
        self._end()
        renewal, self.renewal = self.renewal, None
        if renewal is not None and renewal is not asyncio.current_task():
            await cancel_and_wait(renewal)

    def _end(self) -> None:
        if self.renewer is not None:
            self.renewer = self.context = None
            self._beats.ended()

    async def _renew(self, renewer: Renewer) -> None:
        run_id = renewer.run_id
        goes_on = False
        try:
            goes_on = await renewer._renew()
        except StaleOwnerError:
            note = await renewer._cancel_note()
            if note is not None:
                log.info(
                    "%s; it stops at its next commit or step boundary",
                    note,
                    extra={"run_id": run_id},
                )
            else:
                log.warning(
                    "run %r was taken over by another owner", run_id, extra={"run_id": run_id}
                )
        except renewer.RENEWAL_FAILURES as error:
            log.warning("heartbeat of run %r failed: %s", run_id, error, extra={"run_id": run_id})
            goes_on = True
        except Exception:  # not one it outlives: no renewal any more, and it says so
            log.exception("heartbeat of run %r stopped", run_id, extra={"run_id": run_id})
        finally:
            if self.renewal is asyncio.current_task():
                self.renewal = None
        if self.renewer is not renewer:  # stopped meanwhile
            return
        if goes_on:
            self._beats.due(self, renewer._renewal_due_in())
        else:
            self._end()


class Heartbeats:
    """The heartbeats of one event loop's runs, each waiting for its next renewal. The
    timer runs in an empty context of its own: one copied from the run that set it would
    keep that run's context alive and hand it to the others' renewals (each runs in its
    own run's)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Heartbeat]] = []
        self._order = itertools.count()  # heartbeats due at the same time never compared
        self._timer: asyncio.TimerHandle | None = None
        self._beating = 0
        self._ended = 0  # stopped heartbeats still in the heap

    def beat(self, renewer: Renewer) -> Heartbeat:
        """Renew ``renewer``'s lease whenever a renewal is due, from now on."""
        heartbeat = Heartbeat(self, renewer)
        self._beating += 1
        self.due(heartbeat, renewer._renewal_due_in())
        return heartbeat

    @property
    def beating(self) -> int:
        """How many runs' leases are renewed (their heartbeats not stopped)."""
        return self._beating

    def ended(self) -> None:
        """A heartbeat stopped: once most of the heap is stopped heartbeats (runs that
        ended within a third of a lease), it is rebuilt without them."""
        self._beating -= 1
        self._ended += 1
        if self._ended > max(64, len(self._heap) // 2):
            self._heap = [entry for entry in self._heap if entry[2].renewer is not None]
            heapq.heapify(self._heap)
            self._ended = 0

    def due(self, heartbeat: Heartbeat, seconds: float) -> None:
        """Look at ``heartbeat`` again in ``seconds``."""
        at = self._loop.time() + max(seconds, 0.0)
        heapq.heappush(self._heap, (at, next(self._order), heartbeat))
        timer = self._timer
        if timer is None or at < timer.when():
            if timer is not None:
                timer.cancel()
            self._arm(at)

    def _arm(self, at: float) -> None:
        """Set the timer for ``at``, in an empty context (see the class)."""
        self._timer = self._loop.call_at(at, self._fire, context=contextvars.Context())

    def _fire(self) -> None:
        self._timer = None
        heap, now = self._heap, self._loop.time()
        while heap and heap[0][0] <= now:
            heartbeat = heapq.heappop(heap)[2]
            renewer = heartbeat.renewer
            if renewer is None:  # stopped
                self._ended = max(0, self._ended - 1)
                continue
            wait = renewer._renewal_due_in()  # later if a step's commit set the lease since
            if wait > 0:  # back in the heap, after now: not popped again in this loop
                heapq.heappush(heap, (now + wait, next(self._order), heartbeat))
            else:
                renewal = heartbeat._renew(renewer)
                heartbeat.renewal = self._loop.create_task(renewal, context=heartbeat.context)
        if heap:  # for the earliest of all
            self._arm(heap[0][0])


heartbeats = PerLoop(Heartbeats)
"""The running loop's :class:`Heartbeats`."""


__all__ = ["Heartbeat", "Heartbeats", "Renewer", "heartbeats"]
