"""A resume on workers: ``resume_latest`` of a Clutch with a transport hands the run back
to the workers instead of running it in the resuming process, then waits for its outcome
as ``run`` does (``nestegg resume --here`` runs it in that process instead).

The checks are a local resume's (:func:`~nestegg.checkpoint.admission.resume_start`: the
pipeline, no live owner, a wait that is over, data that fits the model of the agent it
goes to), made before anything is written, so a refusal leaves the run as it was.

A failed or cancelled run is reopened: claimed at its fence (``reopen``), then, in one
fenced commit, its ``run_resumed`` (``previous`` its status) is written and the claim is
released (its lease ends at once), so the run is running and held by nobody. Its next
step is then published with the fence of that claim: the worker that takes it continues
the run from its last commit without a second ``run_resumed``, and replays the journaled
calls of the step that failed (none is paid twice). A process stopped between the claim
and the commit leaves the run held until its lease runs out: a worker's sweep then takes
it over (``run_interrupted``, ``run_resumed``). A process stopped between the commit and
the publish leaves it running and held by nobody: a sweep points a worker at it.

An interrupted run still leased to its owner, a process of this host found dead, is
claimed and released so too, with the ``run_interrupted`` and ``run_resumed`` of a
takeover: a worker would not take it from that lease before it ran out. Any other
running run nobody holds (interrupted, or queued for workers) and a waiting run whose
wait is over are not claimed: their step is published as a sweep would publish it, now
instead of once the run has been untouched for ``sweep_after``; the worker that claims it
writes what it resumes (a takeover's ``run_interrupted`` and ``run_resumed``, a waiting
run's ``run_resumed``).

Between the hand-back and a worker's claim the run is stored as one between two steps on
workers: running, its lease over, its owner the process that handed it back.

Whoever needs to know when the hand-back is done, before the run's outcome, sets
:data:`HANDED_BACK` around the call (the web inspector's resume answers 202 then: the
run's own outcome, a failure on a worker within a moment, shows on its page).

The run's ``on_request`` hook is awaited first, in the resuming process, when a local
resume would await it (:func:`~nestegg.checkpoint.admission.request_pending`: its run
starts from its input and the hook never passed), before anything is written: a hook
that raises leaves the run as it was. ``on_response`` is awaited with its result.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from nestegg import otel
from nestegg.agents import to_plain
from nestegg.checkpoint.admission import check_pipeline, request_pending, resume_start
from nestegg.checkpoint.cancels import cancelled_since_read, claim_to_resume
from nestegg.checkpoint.formats import ending_commit
from nestegg.checkpoint.ownership import resumption
from nestegg.checkpoint.views import run_input, run_result
from nestegg.constants import CANCELLED, COMPLETED, FAILED, RUNNING
from nestegg.transport import tracing
from nestegg.transport.base import StepMessage, Transport, channel_name, using
from nestegg.transport.caller import wait_result
from nestegg.transport.routes import first_route
from nestegg.transport.verdicts import repoint_fence

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.checkpoint.views import CheckpointState
    from nestegg.clutch import Clutch
    from nestegg.task import StepListeners

HANDED_BACK: ContextVar[asyncio.Event | None] = ContextVar("nestegg_handed_back", default=None)
"""An event a hand-back started in this context sets once it published the run's next
step (nothing is refused after that: what the resume then raises is the run's outcome)."""


async def resume_on_workers(
    clutch: Clutch,
    book: CheckpointedRuns,
    transport: Transport,
    run_id: str | None,
    listeners: StepListeners,
    *,
    reopen_cancelled: bool = True,
) -> Any:
    """Hand run ``run_id`` (None: the configured one) back to the workers and wait for
    its result; a completed run's stored result at once (see the module's docstring). A
    cancelled run is reopened only with ``reopen_cancelled``; one cancelled after it was
    read never is (as a local resume).

    Raises:
        As :meth:`~nestegg.Clutch.resume_latest`, before anything is written; then as
        :meth:`~nestegg.Clutch.result` (RunFailedError: the run failed again).
    """
    store = await book.ready()
    run = await book.get_run_record(book.resumed_id(run_id))
    if run.status == COMPLETED:
        check_pipeline(run, clutch.name)  # another pipeline's result is not ours
        return run_result(run)
    if run.status == CANCELLED and not reopen_cancelled:  # before any hook runs
        raise await cancelled_since_read(store, run.run_id)
    state, _ = await resume_start(store, clutch, run, book.config.clock())
    request_again = await request_pending(store, run, state)

    async def work() -> Any:
        await hand_back(clutch, book, transport, run, state, reopen_cancelled=reopen_cancelled)
        return await wait_result(
            store, run.run_id, None, listeners, clock=book.config.clock, on_workers=True
        )

    async def hooked() -> Any:
        plain = to_plain(run_input(run))
        return await clutch.call_with_hooks(run.run_id, plain, work, fresh=request_again)

    async with using(transport):
        return await tracing.traced_remote_run(clutch, store, run, hooked)


async def hand_back(
    clutch: Clutch,
    book: CheckpointedRuns,
    transport: Transport,
    run: RunRecord,
    state: CheckpointState,
    *,
    reopen_cancelled: bool = True,
) -> None:
    """Reopen ``run`` (as read and checked) for the workers, if it is finished (a cancelled
    one only with ``reopen_cancelled``), and publish
    its next step to the pipeline's channel (to its first agent's before its first step),
    with the run's trace context."""
    store = book.store
    trace = await tracing.trace_of(store, run.run_id) or otel.inject_context()
    if run.status in (FAILED, CANCELLED) or _dead_holder(run, book.config.clock()):
        fence = await reopen(book, run, state, trace, reopen_cancelled=reopen_cancelled)
    else:  # running and held by nobody, or waiting with its wait over: as a sweep does
        fence = await repoint_fence(store, run)
    agent = first_route(clutch) if run.step_seq == 0 else None
    message = StepMessage(run.run_id, run.step_seq + 1, fence, agent, trace)
    await transport.publish(channel_name(clutch.name, agent), message)
    if (handed_back := HANDED_BACK.get()) is not None:
        handed_back.set()


def _dead_holder(run: RunRecord, now: float) -> bool:
    """Whether ``run`` is running and leased to an owner that is gone before its lease ran
    out (a process of this host that died: the checks found it dead), which a worker
    would not take from it before the lease ran out."""
    return run.status == RUNNING and run.lease_until is not None and run.lease_until > now


async def reopen(
    book: CheckpointedRuns,
    run: RunRecord,
    state: CheckpointState,
    trace: dict[str, str],
    *,
    reopen_cancelled: bool = True,
) -> int:
    """Claim the finished ``run`` again (``reopen``; a cancelled one only with
    ``reopen_cancelled``, see :func:`~nestegg.checkpoint.cancels.claim_to_resume`), or an
    interrupted one still leased to its dead owner, then write its ``run_resumed`` (after
    the ``run_interrupted`` of a takeover) and release it in one fenced commit; the fence
    of that claim."""
    now = book.config.clock()
    claimed = await claim_to_resume(
        book.store, run, now + book.lease, now, reopen_cancelled=reopen_cancelled
    )
    checkpoint_id = state.checkpoint.checkpoint_id if state.checkpoint else None
    events = resumption(
        run, checkpoint_id, state.seq, interrupted=run.status == RUNNING, trace=trace
    )
    at = book.config.clock()
    release = ending_commit(claimed, at, RUNNING, events, lease_until=at)
    await book.store.commit(release)
    return claimed.fence


__all__ = ["HANDED_BACK", "hand_back", "reopen", "resume_on_workers"]
