"""Durable waits: :func:`wait_for` a signal and :func:`sleep` on a durable timer.

Both work inside an agent (or a selector) of a checkpointed run. A wait that cannot end
now suspends the step: what the step journaled so far is kept, the run is stored with
status ``waiting`` and its process is released (``run()`` raises
:class:`~nestegg.errors.RunWaiting`). When the run is resumed (by a signal, by
``recover()`` once due) the step runs again from its start, its journaled calls replay,
and the wait returns.

Each wait takes journal positions like a durable call: the first records when it ends (the
deadline, or the timer's due time), the second what ``wait_for`` received (the signal's
value, or that the deadline passed), so a step run again gets the same outcome.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import PydanticUserError, TypeAdapter, ValidationError

from nestegg.agents import validation_problems
from nestegg.context import current_context
from nestegg.durations import seconds, seconds_or_none
from nestegg.errors import ConfigurationError, SignalTimeoutError, SignalValueError
from nestegg.identifiers import check_name
from nestegg.journal import argument_hash
from nestegg.signals import WaitSuspended

if TYPE_CHECKING:
    from nestegg.execution import RunExecution

WAIT_DEADLINE = "nestegg.wait_for:deadline"
WAIT_RECEIVED = "nestegg.wait_for"
SLEEP_DUE = "nestegg.sleep"
_NO_ARGUMENTS = argument_hash((), {})


class WaitingRecorder(Protocol):
    """What a wait needs of the run's recorder (the checkpointer)."""

    clock: Callable[[], float]

    async def read_signal(self, name: str, by: float | None = None) -> tuple[bool, Any]:
        """Whether a signal of that name is stored for the run (by ``by``, if given), and
        its value."""

    def signal_received(self, name: str, timed_out: bool) -> None:
        """Note in the timeline that the wait for ``name`` ended."""


def _waiting_execution(what: str) -> tuple[RunExecution, WaitingRecorder]:
    ctx = current_context()
    execution = ctx._execution if ctx is not None else None
    if execution is None or not execution.journaling:
        raise ConfigurationError(
            f"{what}() waits durably: call it inside an agent (or the selector) of a Clutch "
            "with checkpointing (checkpoint=CheckpointConfig(...))"
        )
    recorder: WaitingRecorder = execution.recorder  # type: ignore[assignment]
    return execution, recorder


async def _recorded(
    execution: RunExecution, function: str, digest: str, make: Callable[[], Awaitable[Any]]
) -> Any:
    return await execution.journaled(function, digest, "record", make)


async def wait_for(name: str, *, timeout: timedelta | float | None = None, type: Any = None) -> Any:
    """Wait, without holding a process, for the signal ``name`` sent to this run.

    If the signal is stored for the run, its value comes back at once (journaled: a step
    run again gets the same value). Otherwise the step suspends and the run is stored as
    ``waiting``; ``clutch.signal(run_id, name, value)`` resumes it, and the step runs again
    from its start with its journaled calls replayed (do paid work in journaled calls).

    Args:
        name: the signal's name (one per run: a second wait for it gets the same value).
        timeout: how long to wait; once it passed, ``recover()`` resumes the run and this
            raises SignalTimeoutError. None: no deadline.
        type: what to validate the value as (a pydantic model, a dataclass, ``list[int]``...).

    Returns:
        The signal's value (validated as ``type`` when given).

    Raises:
        SignalTimeoutError: the deadline passed before the signal came (catch it to go on).
        SignalValueError: the value does not fit ``type`` (nothing is journaled).
        ConfigurationError: not inside an agent of a checkpointed run, a bad timeout, or
            a ``type`` pydantic cannot validate a value as (before the run waits).
        InvalidIdentifierError: a bad signal name.

    Example:
        >>> approval = await nestegg.wait_for("approval", timeout=timedelta(days=2))
    """
    check_name(name, "signal name")
    limit = seconds_or_none(timeout, "timeout")
    adapter = _adapter(name, type)
    execution, recorder = _waiting_execution("wait_for")
    digest = argument_hash((name,), {})

    async def deadline_now() -> float | None:
        return None if limit is None else recorder.clock() + limit

    deadline = await _recorded(execution, WAIT_DEADLINE, digest, deadline_now)

    async def receive() -> dict[str, Any]:
        found, value = await recorder.read_signal(name, deadline)  # the deadline came first
        if found:
            try:  # checked before it is journaled: a fitting one may replace it
                _check(name, value, type, adapter)
            except SignalValueError as error:
                raise _Unfit(error) from None
            recorder.signal_received(name, timed_out=False)
            return {"value": value}
        if deadline is not None and recorder.clock() >= deadline:
            recorder.signal_received(name, timed_out=True)
            return {"timed_out": True}
        raise WaitSuspended(name, deadline)

    try:
        outcome = await _recorded(execution, WAIT_RECEIVED, digest, receive)
    except _Unfit as unfit:
        raise unfit.error from None
    if outcome.get("timed_out"):
        raise SignalTimeoutError(name, float(deadline))
    value = outcome.get("value")
    return value if type is None else _check(name, value, type, adapter)


class _Unfit(BaseException):
    """Carries a SignalValueError past the journal (which records an Exception)."""

    def __init__(self, error: SignalValueError) -> None:
        super().__init__(error)
        self.error = error


def _adapter(name: str, type: Any) -> TypeAdapter[Any] | None:
    """The validator of ``type`` (None: no type), built before the step waits."""
    if type is None:
        return None
    try:
        return TypeAdapter(type)
    except (PydanticUserError, TypeError) as error:
        first = str(error).partition(".")[0]
        raise ConfigurationError(
            f"wait_for({name!r}, type={type!r}) cannot validate a value as that type: {first} "
            "(give a pydantic model, a dataclass or a type such as list[int])"
        ) from None


def _check(name: str, value: Any, type: Any, adapter: TypeAdapter[Any] | None) -> Any:
    """``value`` validated by ``adapter`` of ``type`` (None: as it is)."""
    if adapter is None:
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        type_name = str(getattr(type, "__name__", type))
        raise SignalValueError(name, type_name, validation_problems(error)) from None


async def sleep(duration: timedelta | float) -> None:
    """Sleep durably: the run waits, without a process, until ``duration`` from the first
    time the step got here; ``recover()`` (or a worker's sweeper, or
    ``nestegg recover --app ...``) resumes it once due, and the step runs again from its
    start with its journaled calls replayed.

    Args:
        duration: how long (a timedelta, or seconds).

    Raises:
        ConfigurationError: not inside an agent of a checkpointed run, or a bad duration.

    Example:
        >>> await nestegg.sleep(timedelta(hours=6))
    """
    length = seconds(duration, "duration")
    execution, recorder = _waiting_execution("sleep")

    async def due_now() -> float:
        return recorder.clock() + length

    due = float(await _recorded(execution, SLEEP_DUE, _NO_ARGUMENTS, due_now))
    if recorder.clock() < due:
        raise WaitSuspended(None, due)


__all__ = ["sleep", "wait_for"]
