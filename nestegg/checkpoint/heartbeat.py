"""A run's heartbeat: the task that renews the lease of a run while a process executes it
(the checkpointer's; the step recorder's on a worker keeps the run's message fresh too)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from nestegg.cancellation import CancelWatch
from nestegg.errors import StaleOwnerError

log = logging.getLogger("nestegg")


async def keep_leased(
    run_id: str,
    due_in: Callable[[], float],
    renew: Callable[[], Awaitable[bool]],
    failures: tuple[type[Exception], ...],
    cancelled: Callable[[], Awaitable[str | None]] | None = None,
) -> None:
    """Renew the lease of run ``run_id`` with ``renew()`` whenever ``due_in()`` (the
    seconds until a renewal is due) is not above 0, until the task is stopped (also if a
    library lost its cancellation), ``renew()`` returns False (no renewal any more) or
    the run was taken over (StaleOwnerError, logged: as ``cancelled()`` says, when it
    says the run was cancelled from outside). A renewal that fails with one of
    ``failures`` is logged, and the next one made when due."""
    stop = CancelWatch()
    while not stop.requested():
        if (wait := due_in()) > 0:
            await asyncio.sleep(wait)
            continue
        try:
            if not await renew():
                return
        except StaleOwnerError:
            note = await cancelled() if cancelled is not None else None
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
            return
        except failures as error:
            log.warning("heartbeat of run %r failed: %s", run_id, error, extra={"run_id": run_id})
