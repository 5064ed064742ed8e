"""What starting, resuming or forking a run meets in the store: an id that exists, a run or
checkpoint of another pipeline, a checkpoint that continues with an agent the pipeline no
longer has or with data that no longer fits the model of the agent it goes to, a fork
that lost its start; the errors say what to do. Each is checked before anything is
written. :func:`resume_start` and :func:`fork_start` are the checks before a resume or a
fork claims or stores a run; the inspector's resume and fork endpoints call them (its
pages through :func:`resume_refusal` and :func:`fork_refusal`), so the page refuses
exactly what the service would."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nestegg.checkpoint.codec import same_stored, unseal_json
from nestegg.checkpoint.formats import REQUEST_HOOK, parse_event, parse_failure
from nestegg.checkpoint.given import GivenData
from nestegg.checkpoint.loader import load_latest, load_state_and_steps
from nestegg.checkpoint.ownership import owner_alive, run_state
from nestegg.checkpoint.records import CheckpointRecord, EventRecord, RunRecord, StepRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.views import CheckpointState, run_result
from nestegg.checkpoint.waiting import log_damaged, still_waiting
from nestegg.constants import (
    CANCELLED,
    COMPLETED,
    FAILED,
    QUEUED,
    RUN_CANCELLED,
    RUN_WAITING,
    RUNNING,
    SIGNAL_RECEIVED,
    STEP_COMPLETED,
    STEP_FAILED,
    STEP_STARTED,
)
from nestegg.errors import (
    CheckpointCorruptedError,
    ConfigurationError,
    IncompatibleCheckpointError,
    IncompatibleDataError,
    NestEggError,
    RunExistsError,
    RunLockedError,
    RunWaiting,
)
from nestegg.strategies import Undecided

if TYPE_CHECKING:
    from nestegg.checkpoint.pipeline import Pipeline
    from nestegg.strategies import Cursor


def existing_run(
    run: RunRecord, sealed_input: bytes, pipeline: str, now: float, *, on_workers: bool = False
) -> Any:
    """What starting a run of ``pipeline`` under an id that exists does: the result of a
    completed run of that pipeline and the same input; otherwise a RunExistsError (or
    RunLockedError) saying what to do. ``on_workers``: the Clutch runs its runs on
    workers, whose running runs with no owner are queued for them or for their sweeps,
    not interrupted."""
    if run.pipeline != pipeline:  # never another pipeline's result, whatever its status
        raise RunExistsError(
            f"run {run.run_id!r} exists and belongs to pipeline {run.pipeline!r}, not "
            f"{pipeline!r}: a run id names one run of one pipeline; pass a new id for this "
            "run (run(input, run_id=...))",
            run.run_id,
        )
    if run.status == COMPLETED:
        if not same_input(run, sealed_input):
            raise RunExistsError(
                f"run {run.run_id!r} completed with a different input: a run id names "
                f"one run of one input; pass a new id for this input "
                f"(run(input, run_id=...)), or delete_run({run.run_id!r}) first to run "
                "it again under this id",
                run.run_id,
            )
        return run_result(run)
    if owner_alive(run, now):
        raise RunLockedError(
            f"run {run.run_id!r} is being executed by another process "
            f"(pid {run.owner.pid if run.owner else '?'})",
            run.run_id,
        )
    if on_workers and run.status == RUNNING:
        raise RunExistsError(
            f"run {run.run_id!r} exists and is the workers' (queued for one, or for their "
            f"sweeps to take over): await clutch.result({run.run_id!r}) for its outcome"
            + ("" if same_input(run, sealed_input) else "; it was started with a different input"),
            run.run_id,
        )
    status = run_state(run, now)
    if same_input(run, sealed_input):
        what = f"continue it with resume_latest({run.run_id!r})"
    else:
        what = (
            f"it was started with a different input; continue it with "
            f"resume_latest({run.run_id!r}), or pass a new id for this input"
        )
    raise RunExistsError(f"run {run.run_id!r} exists with status {status!r}: {what}", run.run_id)


def same_input(run: RunRecord, sealed_input: bytes) -> bool:
    """Whether ``run`` was started with the input sealed as ``sealed_input``: the stored
    bytes compared first, then what they hold as the codec stores values
    (:func:`~nestegg.checkpoint.codec.same_stored`: the keys of a dict or the items of a
    set in another order, a NaN among them)."""
    stored = bytes(run.input)
    if stored == sealed_input:
        return True
    where = f"input of run {run.run_id!r}"
    return same_stored(unseal_json(stored, where), unseal_json(sealed_input, "input"))


def check_pipeline(run: RunRecord, pipeline: str, outcome: str = "") -> None:
    """Refuse to continue a run of another pipeline: a Clutch resumes its own runs only.
    ``outcome``: what the refusal adds (``: it was not cancelled``).

    Raises:
        ConfigurationError: ``run`` belongs to another pipeline than ``pipeline``.
    """
    if run.pipeline != pipeline:
        raise ConfigurationError(
            f"run {run.run_id!r} belongs to pipeline {run.pipeline!r}, not {pipeline!r}{outcome}"
        )


def check_fork_pipeline(run: RunRecord, checkpoint_id: str, pipeline: str) -> None:
    """Refuse to fork from a checkpoint of another pipeline's run: a Clutch forks its own.

    Raises:
        ConfigurationError: ``run`` (the run of checkpoint ``checkpoint_id``) belongs to
            another pipeline than ``pipeline``.
    """
    if run.pipeline != pipeline:
        raise ConfigurationError(
            f"checkpoint {checkpoint_id!r} belongs to pipeline {run.pipeline!r}, not {pipeline!r}"
        )


def check_checkpoint_run(checkpoint: CheckpointRecord, run_id: str) -> None:
    """Refuse to resume run ``run_id`` from a checkpoint of another run: a resume from a
    checkpoint rewinds the run the checkpoint belongs to; a fork continues it on a new one.

    Raises:
        ConfigurationError: ``checkpoint`` belongs to another run than ``run_id``.
    """
    if checkpoint.run_id != run_id:
        raise ConfigurationError(
            f"checkpoint {checkpoint.checkpoint_id!r} belongs to run {checkpoint.run_id!r}, "
            f"not {run_id!r} (fork from it to continue it on a new run)"
        )


def restored_cursor(pipeline: Pipeline, state: CheckpointState, of_run: str) -> Cursor:
    """``pipeline``'s cursor, moved to where ``state`` continues.

    Args:
        of_run: the run ``state``'s checkpoint belongs to, named by the error (a fork's
            is its parent).

    Raises:
        IncompatibleCheckpointError: ``state`` continues with an agent ``pipeline`` no
            longer has (``run 'x': the checkpoint continues with agent ...``).
    """
    cursor = pipeline.new_cursor()
    try:
        if state.position is not None:
            cursor.restore(state.position)
        if state.next_agent is not None and state.next_agent not in pipeline.agent_names:
            raise IncompatibleCheckpointError(
                f"the checkpoint continues with agent {state.next_agent!r}, which this "
                "pipeline no longer has",
                state.next_agent,
            )
    except IncompatibleCheckpointError as lost:
        raise IncompatibleCheckpointError(f"run {of_run!r}: {lost}", lost.agent) from None
    return cursor


def check_data(
    pipeline: Pipeline, cursor: Cursor, state: CheckpointState, fork: ForkData | None = None
) -> None:
    """Refuse to continue from ``state`` when its data no longer fits the model of the
    agent it goes to next (``cursor``, restored to ``state``, names it; of the selector
    when it picks that agent), as that agent's step would be failed for it. The one
    check of a resume and of a fork (``fork``: the checkpoint it starts from and the data
    it was given), so both refuse alike before anything is stored.

    Raises:
        IncompatibleDataError: naming the run, the step that stored the data (or the
            run's input; for a fork, its checkpoint and whether its data was given), the
            agent, the model and pydantic's reason.
    """
    upcoming = state.next_agent if state.next_agent is not None else cursor.upcoming()
    if upcoming is None or state.turn >= pipeline.max_turns:
        return  # nothing runs: the data is the run's result
    from nestegg.agents import misfit  # and pydantic: a resume's, not a reader's of the run

    agent = None if upcoming is Undecided.SELECTOR else upcoming
    model = pipeline.input_type(agent)
    reason = misfit(state.data if fork is None else fork.data, model)
    if reason is not None:
        name = getattr(model, "__name__", repr(model))
        raise IncompatibleDataError(
            state.run_id,
            state.data_seq,
            agent,
            name,
            reason,
            fork_of=None if fork is None else fork.checkpoint_id,
            given=fork is not None and fork.given,
        )


@dataclass(frozen=True)
class ForkData:
    """What a fork from checkpoint ``checkpoint_id`` continues with: ``data``, the data
    given (``given``) or else the checkpoint's."""

    checkpoint_id: str
    given: bool
    data: Any


def fork_without_start(run: RunRecord) -> CheckpointCorruptedError:
    """The error of a fork with no valid checkpoint: its starting point is lost."""
    why = (
        "its writing stopped before its first checkpoint was stored"
        if run.step_seq == 0
        else "every checkpoint it has is damaged"
    )
    return CheckpointCorruptedError(
        f"run {run.run_id!r} is a fork of run {run.parent_run!r} at checkpoint "
        f"{run.parent_checkpoint!r} and has no valid checkpoint to start from ({why}): "
        f"delete_run({run.run_id!r}) and fork again"
    )


async def resume_point(
    store: CheckpointStorage, run: RunRecord
) -> tuple[CheckpointState, list[CheckpointRecord]]:
    """Where a resume of ``run`` continues: its newest valid state and the checkpoints it
    keeps (:func:`~nestegg.checkpoint.loader.load_latest`).

    Raises:
        CheckpointCorruptedError: ``run`` is a fork without a valid checkpoint (it has no
            input to fall back to), or even its input is damaged.
    """
    state, checkpoints = await load_latest(store, run)
    if state.checkpoint is None and run.parent_run is not None:
        raise fork_without_start(run)
    return state, checkpoints


REFUSALS = (
    ConfigurationError,
    RunLockedError,
    RunWaiting,
    IncompatibleCheckpointError,
    CheckpointCorruptedError,
)
"""The errors of the checks before a claim: what refuses a resume or a fork before it
starts (the store's own errors, such as StorageUnavailableError, are not refusals)."""


def check_not_owned(run: RunRecord, now: float) -> None:
    """Refuse to take ``run`` from the live process that executes it.

    Raises:
        RunLockedError: ``run``'s owner is alive (its lease runs at ``now``).
    """
    if owner_alive(run, now):
        raise executed_by(run.run_id, run.owner.pid if run.owner else "?")


def executed_by(run_id: str, pid: int | str) -> RunLockedError:
    """The refusal of a resume of ``run_id``, which the live process ``pid`` executes."""
    return RunLockedError(
        f"run {run_id!r} is being executed by a live process (pid {pid}); it cannot be resumed now",
        run_id,
    )


async def resume_start(
    store: CheckpointStorage, pipeline: Pipeline, run: RunRecord, now: float
) -> tuple[CheckpointState, list[CheckpointRecord]]:
    """The checks before a resume of ``run`` (not completed) by ``pipeline`` claims it,
    and where it continues: its newest valid state and the checkpoints it keeps. Reads,
    writes nothing.

    Raises:
        RunLockedError: a live process executes ``run``.
        ConfigurationError: ``run`` belongs to another pipeline, or ``pipeline``'s
            definition does not hold.
        RunWaiting: ``run`` waits and its wait is not over (its signal not stored, its
            deadline or timer not passed): its step would only run again to wait again.
        EventLogDamagedError: ``run`` waits, its deadline has not passed, and its event
            log is torn: what it waits for is unknown.
        CheckpointCorruptedError: ``run`` has no valid state to continue from (a fork
            without a valid checkpoint, a damaged input).
        IncompatibleCheckpointError: that state continues with an agent ``pipeline`` no
            longer has, or (IncompatibleDataError) its data no longer fits the model of
            the agent it goes to.
    """
    check_not_owned(run, now)
    check_pipeline(run, pipeline.name)
    pipeline.validate()
    if (waiting := await still_waiting(store, run, now)) is not None:
        raise waiting
    state, checkpoints = await resume_point(store, run)
    cursor = restored_cursor(pipeline, state, run.run_id)
    check_data(pipeline, cursor, state)
    return state, checkpoints


STEP_EVENTS = frozenset({STEP_STARTED, STEP_COMPLETED, STEP_FAILED, RUN_WAITING, SIGNAL_RECEIVED})
"""The events only a step writes: one in a run's log says that a step began, so its
``on_request`` hook had passed."""


async def request_pending(store: CheckpointStorage, run: RunRecord, state: CheckpointState) -> bool:
    """Whether :meth:`resume_latest` of ``run`` from ``state`` awaits the pipeline's
    ``on_request`` hook again, decided from what is stored: the run starts from its input
    (``state`` is before its first step; a fork never) and either failed with the hook's
    error (``"hook": "on_request"``) or, running or cancelled, has no step recorded, not
    even the start of one in its event log (its process died, or it was cancelled, before
    a step began: in the hook, or before the hook was awaited). The event log is read only
    in that last case. A running run no process ever claimed passed it: a caller on
    workers stores its run only once the hook passed (a local run is stored claimed); so
    did such a run cancelled from outside while queued (its ``run_cancelled`` says so).

    Raises:
        EventLogDamagedError: the event log has to be read and is torn: whether the hook
            passed is unknown.
    """
    if state.seq != 0 or run.parent_run is not None or run.step_seq != 0:
        return False
    if run.status == RUNNING and run.owner is None:
        return False
    if run.status == FAILED and run.error is not None:
        try:
            return parse_failure(run.error, "error").get("hook") == REQUEST_HOOK
        except CheckpointCorruptedError:  # unreadable: what its events say decides
            pass
    elif run.status not in (RUNNING, CANCELLED):
        return False
    try:
        events = await store.read_events(run.run_id)
    except CheckpointCorruptedError as error:
        raise log_damaged(run.run_id, error, "whether its on_request hook passed") from None
    if any(event.kind in STEP_EVENTS for event in events):
        return False
    return not any(_cancelled_queued(event) for event in events if event.kind == RUN_CANCELLED)


def _cancelled_queued(event: EventRecord) -> bool:
    """Whether a ``run_cancelled`` event says the run was queued for workers (stored by a
    caller once its hook passed, no worker had taken it): a damaged one says not."""
    try:
        return (
            parse_event(event.body, f"event {event.seq} of run {event.run_id!r}").get("previous")
            == QUEUED
        )
    except CheckpointCorruptedError:
        return False


async def resume_refusal(
    store: CheckpointStorage, pipeline: Pipeline, run: RunRecord, now: float
) -> NestEggError | None:
    """Why a resume of ``run`` by ``pipeline`` would be refused now (None: it would
    claim the run): for a completed run, a ConfigurationError (another pipeline's run, or
    nothing to resume: the service returns its result instead), else the error of
    :func:`resume_start`, or of :func:`request_pending` (a torn event log)."""
    try:
        if run.status == COMPLETED:
            check_pipeline(run, pipeline.name)
            return ConfigurationError(
                f"run {run.run_id!r} is completed: there is nothing to resume (fork it from "
                "a checkpoint to run its steps again)"
            )
        state, _ = await resume_start(store, pipeline, run, now)
        await request_pending(store, run, state)
    except REFUSALS as error:
        return error
    return None


def check_fork(
    pipeline: Pipeline, run: RunRecord, checkpoint_id: str, state: CheckpointState
) -> None:
    """The checks before a fork by ``pipeline`` from checkpoint ``checkpoint_id`` of
    ``run`` (loaded as ``state``) stores its new run.

    Raises:
        ConfigurationError: ``run`` belongs to another pipeline, or ``pipeline``'s
            definition does not hold.
        IncompatibleCheckpointError: the checkpoint continues with an agent ``pipeline``
            no longer has.
    """
    check_fork_pipeline(run, checkpoint_id, pipeline.name)
    _check_fork_state(pipeline, run, state)


def _check_fork_state(pipeline: Pipeline, run: RunRecord, state: CheckpointState) -> Cursor:
    """The checks of :func:`check_fork` after the pipeline's: its definition, its agents;
    the cursor restored to where the fork continues."""
    pipeline.validate()
    return restored_cursor(pipeline, state, run.run_id)


async def fork_start(
    store: CheckpointStorage,
    pipeline: Pipeline,
    run: RunRecord,
    checkpoint: CheckpointRecord,
    data: Any = None,
) -> tuple[CheckpointState, list[StepRecord]]:
    """The checks of :func:`check_fork` before a fork by ``pipeline`` from ``checkpoint``
    of ``run`` stores its new run, then that the data it continues with (``data``, as
    ``Clutch.fork`` takes it; None: the checkpoint's) fits the model of the agent it goes
    to (:func:`check_data`, as a resume checks it; a
    :class:`~nestegg.checkpoint.given.GivenData`, data someone gave, by its value); and
    where it starts: the state the checkpoint restores and the step records up to it. The
    pipeline is checked before anything of the checkpoint is read: another pipeline's
    state is refused unread. Reads, writes nothing.

    Raises:
        ConfigurationError: ``run`` belongs to another pipeline, or ``pipeline``'s
            definition does not hold.
        CheckpointCorruptedError: the checkpoint or a step record it needs is damaged.
        IncompatibleCheckpointError: the checkpoint continues with an agent ``pipeline``
            no longer has, or (IncompatibleDataError) the data does not fit the model of
            the agent it goes to.
    """
    from nestegg.agents import to_plain  # and pydantic, as in check_data

    check_fork_pipeline(run, checkpoint.checkpoint_id, pipeline.name)
    state, steps = await load_state_and_steps(store, run, checkpoint)
    given = data is not None
    continued = (
        to_plain(data.value if isinstance(data, GivenData) else data) if given else state.data
    )
    cursor = _check_fork_state(pipeline, run, state)
    check_data(pipeline, cursor, state, ForkData(checkpoint.checkpoint_id, given, continued))
    return state, steps


def fork_refusal(
    pipeline: Pipeline, run: RunRecord, checkpoint_id: str, state: CheckpointState
) -> NestEggError | None:
    """Why a fork by ``pipeline`` from checkpoint ``checkpoint_id`` of ``run`` (loaded as
    ``state``) would be refused (None: it would start): the error of :func:`check_fork`."""
    try:
        check_fork(pipeline, run, checkpoint_id, state)
    except REFUSALS as error:
        return error
    return None
