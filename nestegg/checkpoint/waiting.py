"""Runs that wait: what a waiting run waits for, storing signals, and when a wait is over.

A waiting run is stored with status ``waiting``; its ``lease_until`` holds when the wait
ends (wait_for's deadline, a timer's due time, or ``NO_DEADLINE``), and the last event of
the commit that suspended it, ``run_waiting``, names the signal (None for a timer). A
resume that has to read that event refuses a run whose event log is torn
(:func:`log_damaged`): what it would wait for is unknown, and nothing of it changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nestegg.checkpoint.codec import encode_value
from nestegg.checkpoint.formats import parse_event, signal_body
from nestegg.checkpoint.records import EventRecord, RunRecord, SignalRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.common import run_not_found
from nestegg.checkpoint.views import to_datetime
from nestegg.constants import COMPLETED, NO_DEADLINE, RUN_WAITING, WAITING
from nestegg.errors import (
    CheckpointCorruptedError,
    ConfigurationError,
    EventLogDamagedError,
    RunWaiting,
    SignalExistsError,
    SignalRefusedError,
)
from nestegg.identifiers import check_name

log = logging.getLogger("nestegg")


@dataclass(frozen=True, slots=True)
class Wait:
    """What a waiting run waits for: a signal (None for a timer), until ``deadline``
    (None: no deadline); ``unreadable``: why that cannot be read (its ``run_waiting``
    event, or its event log, is damaged, or it has no ``run_waiting`` event), None when
    it can. An unreadable wait is no
    timer: its ``signal`` is None because its name is unknown, and only its deadline
    (the run's ``lease_until``) is known."""

    signal: str | None
    deadline: float | None
    unreadable: str | None = None


def wait_due(run: RunRecord, now: float) -> bool:
    """Whether a waiting run's deadline (or timer) has passed."""
    return run.status == WAITING and run.lease_until is not None and run.lease_until <= now


def _deadline(run: RunRecord) -> float | None:
    return None if run.lease_until in (None, NO_DEADLINE) else run.lease_until


async def wait_of(store: CheckpointStorage, run: RunRecord) -> Wait | None:
    """What the waiting ``run`` waits for (None when it does not wait); a ``run_waiting``
    event that cannot be parsed, or none in its log, gives a wait whose ``unreadable`` says
    why.

    Raises:
        CheckpointCorruptedError: the run's event log is torn (:func:`wait_known` gives
            that as an unreadable wait too).
    """
    if run.status != WAITING:
        return None
    deadline = _deadline(run)
    since = max(run.event_seq - 8, 0)  # it is the waiting commit's last event
    record = await _last_waiting(store, run.run_id, since)
    if record is None and since > 0:  # events came after it: the whole log
        record = await _last_waiting(store, run.run_id, 0)
    if record is None:
        return Wait(None, deadline, f"run {run.run_id!r} has no {RUN_WAITING} event")
    where = f"event {record.seq} of run {run.run_id!r}"
    try:
        signal = parse_event(record.body, where).get("signal")
    except CheckpointCorruptedError as error:
        return Wait(None, deadline, str(error))
    return Wait(signal if isinstance(signal, str) else None, deadline)


async def _last_waiting(store: CheckpointStorage, run_id: str, since: int) -> EventRecord | None:
    """The last ``run_waiting`` event of ``run_id`` after event ``since``, if any."""
    for record in reversed(await store.read_events(run_id, since)):
        if record.kind == RUN_WAITING:
            return record
    return None


def log_damaged(
    run_id: str, error: CheckpointCorruptedError, unknown: str, outcome: str = ""
) -> EventLogDamagedError:
    """The refusal of a resume of ``run_id`` whose event log cannot be read (``error``),
    so that ``unknown`` is (what it waits for, say); ``outcome``: what else was not done
    (``its signal 'x' not stored``)."""
    if isinstance(error, EventLogDamagedError):
        return error
    done = ", ".join(["it was not resumed", *([outcome] if outcome else [])])
    return EventLogDamagedError(
        f"run {run_id!r} is refused: {error}, so {unknown} is unknown; {done} and nothing "
        "of it was changed (fork it from a checkpoint to go on in a new run, or delete it)",
        run_id,
    )


async def wait_to_resume(
    store: CheckpointStorage, run: RunRecord, outcome: str = ""
) -> Wait | None:
    """:func:`wait_of`, for a resume: a torn event log refuses the run.

    Raises:
        EventLogDamagedError: what the run waits for cannot be read (``outcome``: what
            else the refusal did not do, as :func:`log_damaged` says it).
    """
    try:
        return await wait_of(store, run)
    except CheckpointCorruptedError as error:
        raise log_damaged(run.run_id, error, "what it waits for", outcome) from None


async def signal_resumes(
    store: CheckpointStorage, run: RunRecord, name: str, now: float, outcome: str = ""
) -> bool:
    """Whether the signal ``name``, sent with ``resume``, resumes ``run``: the run waits for
    it, or its deadline has passed and what it waits for cannot be read (its event log is
    torn, or its ``run_waiting`` event damaged): its wait is over whatever it was, and the
    resume goes on as ``recover()``'s would, as it does for a run whose log is whole (the
    signal's :class:`SignalNote` says that its name could not be checked).

    Raises:
        EventLogDamagedError: what the run waits for cannot be read and its deadline has
            not passed (``outcome``: what else the refusal did not do).
    """
    try:
        wait = await wait_of(store, run)
    except CheckpointCorruptedError as error:
        if wait_due(run, now):
            return True
        raise log_damaged(run.run_id, error, "what it waits for", outcome) from None
    if wait is not None and wait.unreadable is not None:  # its run_waiting event damaged
        return wait_due(run, now)
    return wait is not None and wait.signal == name


async def wait_known(store: CheckpointStorage, run: RunRecord | None) -> Wait | None:
    """What ``run`` waits for (:func:`wait_of`), a torn event log given as a wait that
    cannot be read (its ``unreadable`` saying why, its deadline the run's); None when it
    does not wait or there is no run."""
    if run is None:
        return None
    try:
        return await wait_of(store, run)
    except CheckpointCorruptedError as error:
        return Wait(None, _deadline(run), str(error))


@dataclass(frozen=True, slots=True)
class SignalNote:
    """What a signal meant to its run when it was stored: what the run waited for then
    (``wait``, None: it did not wait) and whether the signal came past that wait's
    deadline (``late``), judged when it matters: for a wait for this very signal (the
    signal came too late to end the wait, which times out when the run is resumed:
    :attr:`timed_out`), and for a wait that cannot be read, its event log torn or its
    ``run_waiting`` event damaged (its wait was over, whatever it waited for)."""

    run_id: str
    name: str
    wait: Wait | None
    late: bool

    @property
    def awaited(self) -> bool:
        """Whether the run waited for this signal."""
        return self.wait is not None and self.wait.signal == self.name

    @property
    def timed_out(self) -> bool:
        """Whether the run waited for this signal past the wait's deadline."""
        return self.awaited and self.late

    def warning(self) -> str | None:
        """What an operator should hear: the run waits for something else (the signal is
        kept for a wait for it), its wait for this one had timed out, or what it waits
        for cannot be read, so that the signal's name could not be checked; None when the
        signal meets a wait or is stored before the run waits."""
        wait, name = self.wait, self.name
        if wait is None or (self.awaited and not self.timed_out):
            return None
        if wait.unreadable is not None:
            return self._unchecked(wait)
        if self.awaited and wait.deadline is not None:
            return (
                f"run {self.run_id!r} waited for signal {name!r} until {_iso(wait.deadline)}, "
                "which passed before the signal was stored: its wait timed out, and the step "
                "goes on as on a timeout (wait_for raises SignalTimeoutError)"
            )
        what = f"signal {wait.signal!r}" if wait.signal is not None else "a timer"
        return (
            f"run {self.run_id!r} waits for {what}, not {name!r}: {name!r} is stored and read "
            "only by a wait for it"
        )

    def _unchecked(self, wait: Wait) -> str:
        """The warning of a signal to a run whose wait cannot be read."""
        name = self.name
        head = (
            f"what run {self.run_id!r} waits for cannot be read (its event log is damaged: "
            f"{wait.unreadable}), so whether it waits for signal {name!r} could not be checked"
        )
        if self.late and wait.deadline is not None:
            return (
                f"{head}; its deadline, {_iso(wait.deadline)}, passed before the signal was "
                "stored: its wait is over whatever it was, and a resume goes on (a wait for a "
                "signal times out)"
            )
        return f"{head}: {name!r} is stored and read only by a wait for it"

    def summary(self) -> dict[str, Any]:
        """Its facts for a command's ``--json``: what the run waits for (``waits_for``,
        as ``nestegg runs`` gives it; None: it did not wait; ``{"unreadable": why,
        "deadline": …}`` when that cannot be read) and ``timed_out``."""
        wait = self.wait
        waits_for: dict[str, Any] | None = None
        if wait is not None:
            what = (
                {"signal": wait.signal}
                if wait.unreadable is None
                else {"unreadable": wait.unreadable}
            )
            waits_for = what | {"deadline": to_datetime(wait.deadline)}
        return {"waits_for": waits_for, "timed_out": self.timed_out}


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


async def signal_note(
    store: CheckpointStorage, run_id: str, name: str, wait: Wait | None
) -> SignalNote:
    """The :class:`SignalNote` of the signal ``name`` just stored for ``run_id``, whose run
    waited for ``wait`` (:func:`wait_known`, read before the signal was stored): the
    signal's stored time (its name's first, for a replacement) against that wait's
    deadline, as ``wait_for`` judges it, for a wait for this signal or one that cannot be
    read."""
    late = False
    if (
        wait is not None
        and (wait.signal == name or wait.unreadable is not None)
        and wait.deadline is not None
    ):
        late = not await signal_in_time(store, run_id, name, wait.deadline)
    return SignalNote(run_id, name, wait, late)


async def signal_stored(store: CheckpointStorage, run_id: str, name: str) -> bool:
    """Whether a signal ``name`` is stored for the run."""
    return any(signal.name == name for signal in await store.read_signals(run_id))


async def signal_in_time(
    store: CheckpointStorage, run_id: str, name: str, deadline: float | None
) -> bool:
    """Whether a signal ``name`` is stored for the run by ``deadline`` (None: none), so
    that a wait for it with that deadline receives it: one stored later does not end the
    wait (its time is when its name first came, a replacement keeping it)."""
    return any(
        signal.name == name and signal.came_by(deadline)
        for signal in await store.read_signals(run_id)
    )


async def signal_came(store: CheckpointStorage, waiting: RunWaiting) -> bool:
    """Whether the signal a run just started to wait for is stored already."""
    return waiting.signal is not None and await signal_stored(
        store, waiting.run_id or "", waiting.signal
    )


async def resumable_now(store: CheckpointStorage, run: RunRecord, now: float) -> bool:
    """Whether a waiting run can go on now: its deadline passed, or its signal is stored.

    Raises:
        EventLogDamagedError: its deadline has not passed and what it waits for cannot be
            read (its event log is torn).
    """
    if wait_due(run, now):
        return True
    wait = await wait_to_resume(store, run)
    return bool(wait and wait.signal and await signal_stored(store, run.run_id, wait.signal))


async def resumable_or_torn(store: CheckpointStorage, run: RunRecord, now: float) -> bool:
    """Whether a waiting ``run`` can go on now (:func:`resumable_now`), or its event log is
    torn: what :meth:`recover` tries, which refuses the latter, saying so."""
    try:
        return await resumable_now(store, run, now)
    except EventLogDamagedError:
        return True


async def still_waiting(
    store: CheckpointStorage, run: RunRecord, now: float, *, on_workers: bool = False
) -> RunWaiting | None:
    """What a resume of ``run`` would end in at once when the run waits and cannot go on
    now (its deadline not passed, its signal not stored): the RunWaiting its step raises
    again (``on_workers``: saying that a worker's sweep resumes it). None when the run
    does not wait or can go on, or when what it waits for cannot be read (its
    ``run_waiting`` event damaged or missing, and no deadline): its step then finds out.
    A damaged ``run_waiting`` event with a deadline gives a RunWaiting that says what the
    run waits for is unknown (its ``unreadable``), not that it waits for a timer.

    Raises:
        EventLogDamagedError: the run waits, its deadline has not passed, and its event log
            is torn (what it waits for cannot be read).
    """
    if run.status != WAITING or await resumable_now(store, run, now):
        return None
    wait = await wait_to_resume(store, run) or Wait(None, None)
    if wait.signal is None and wait.deadline is None:  # a timer always has its due time
        return None
    return RunWaiting(
        run.run_id, wait.signal, wait.deadline, on_workers=on_workers, unreadable=wait.unreadable
    )


async def wait_over(store: CheckpointStorage, run: RunRecord) -> RunWaiting:
    """The RunWaiting of a waiting ``run`` whose wait is over, for a process that has no
    sweep to continue it: it says ``recover()`` or ``resume_latest`` does.

    Raises:
        EventLogDamagedError: its event log is torn (what it waited for cannot be read).
    """
    wait = await wait_to_resume(store, run) or Wait(None, None)
    return RunWaiting(run.run_id, wait.signal, wait.deadline, over=True, unreadable=wait.unreadable)


async def store_signal(
    store: CheckpointStorage,
    run_id: str,
    name: str,
    value: Any,
    *,
    replace: bool,
    clock: Callable[[], float],
    pipeline: str | None = None,
) -> SignalNote:
    """Store a signal for a run, checked and encoded like step data; nothing is stored
    when a check fails. A replacement keeps the time its name first came.

    Returns:
        What the signal meant to the run (:class:`SignalNote`), its warning logged through
        the ``nestegg`` logger: a run that waits for something else, or whose wait for this
        signal had timed out, is not resumed by it, and a silent store would let the
        operator believe it is.

    Raises:
        InvalidIdentifierError: a bad signal name.
        CheckpointSerializationError: a value that cannot be stored.
        RunNotFoundError: no such run.
        ConfigurationError: the run is not of ``pipeline`` (when given).
        SignalRefusedError: the run completed (and not ``replace``): nothing would read
            the signal. The check and the write are two calls: a run that completes
            between them keeps the signal, unread.
        SignalExistsError: a signal of that name was sent already (and not ``replace``),
            saying whether the run waits for it (so no step received it).
    """
    from nestegg.agents import to_plain  # and pydantic: a signal's, not a reader's of waits

    check_name(name, "signal name")
    body = signal_body(encode_value(to_plain(value), f"signal {name!r}"))
    run = await store.get_run(check_name(run_id, "run id"))
    if run is None:
        raise run_not_found(run_id)
    if pipeline is not None and run.pipeline != pipeline:
        raise ConfigurationError(
            f"run {run_id!r} belongs to pipeline {run.pipeline!r}, not {pipeline!r}: "
            "the signal was not stored"
        )
    if run.status == COMPLETED and not replace:  # replace: for a resume from a checkpoint
        raise SignalRefusedError(run_id, name)
    wait = await wait_known(store, run)
    stored = await _put_signal(store, SignalRecord(run_id, name, clock(), body), replace)
    note = await signal_note(store, run_id, name, wait)
    if not stored:
        raise SignalExistsError(run_id, name, awaited=note.awaited, late=note.timed_out)
    if (words := note.warning()) is not None:
        log.warning(words)
    return note


async def _put_signal(store: CheckpointStorage, signal: SignalRecord, replace: bool) -> bool:
    """Store ``signal``; a replacement keeps the time its name first came (the deadline
    rule reads it: a wait a signal reached in time stays met, one it missed stays timed
    out). A signal, once stored, is only ever replaced, so that time never changes."""
    if await store.put_signal(signal):
        return True
    if not replace:
        return False
    stored = await store.read_signals(signal.run_id)  # a run deleted since: put_signal says so
    first = next((s.at for s in stored if s.name == signal.name), signal.at)
    return await store.put_signal(
        SignalRecord(signal.run_id, signal.name, first, signal.body), replace=True
    )


__all__ = [
    "SignalNote",
    "Wait",
    "log_damaged",
    "resumable_now",
    "resumable_or_torn",
    "signal_came",
    "signal_in_time",
    "signal_note",
    "signal_resumes",
    "signal_stored",
    "still_waiting",
    "store_signal",
    "wait_due",
    "wait_known",
    "wait_of",
    "wait_to_resume",
]
