"""The one exception tree of nestegg.

Every error nestegg raises on purpose is a :class:`NestEggError`; each names the culprit
(the agent, the run, the checkpoint, the path of a value) in its message::

    NestEggError
    ├── ConfigurationError              a Clutch, policy or store defined wrongly
    │   └── MissingDependencyError      an optional driver is not installed (names the extra)
    ├── InvalidIdentifierError          a run, thread or agent id or prefix that is not allowed
    ├── NoActiveContextError            get_context() outside an agent (also a RuntimeError)
    ├── NoActiveRunError                checkpoint() while no run of the Clutch executes
    ├── RunError                        about a run as a whole
    │   ├── RunNotFoundError            no run with that id
    │   ├── RunExistsError              the id is taken: unfinished (resume it), other input
    │   ├── RunLockedError              another live process owns the run
    │   │   └── RunFinishedError        a claim found the run finished: it is not reopened
    │   ├── StaleOwnerError             this process lost ownership (fencing token moved on)
    │   ├── RunFailedError              a run awaited by result() failed (names agent and error)
    │   ├── RunWaiting                  the run waits for a signal or a timer (not a failure)
    │   └── SignalError                 a signal to the run was not stored
    │       ├── SignalExistsError       a signal of that name was sent to the run already
    │       └── SignalRefusedError      a signal to a run that completed: nothing would read it
    ├── SignalTimeoutError              wait_for's deadline passed before its signal came
    ├── SignalValueError                a signal's value does not fit wait_for's type=
    ├── CheckpointError                 about one checkpoint
    │   ├── CheckpointNotFoundError     no checkpoint with that id
    │   ├── CheckpointExistsError       the id is taken in the store (an import): names its run
    │   ├── CheckpointCorruptedError    a torn or altered record (checksum mismatch)
    │   │   └── EventLogDamagedError    a run refused: what is needed of its event log is torn
    │   ├── CheckpointSerializationError  a value that cannot be stored (names its path and type)
    │   │   └── RecordTooLargeError     a value or a commit over the size a store takes at once
    │   └── IncompatibleCheckpointError the pipeline changed: what the checkpoint needs is gone
    │       └── IncompatibleDataError   its data no longer fits the model of the agent it goes to
    ├── StorageError                    a store failed
    │   ├── StorageUnavailableError     the store cannot be reached
    │   └── StoreRefusedError           its server refused its settings (a ConfigurationError too)
    ├── TransportError                  a broker failed, or sent what is not a step message
    │   └── BrokerRefusedError          the broker refused the settings: login, vhost, database
    └── JournalError                    about journaled calls
        ├── NonDeterminismError         a re-executed step made different calls
        │   └── ModuleNameMismatchError the same function, its module imported by another name
        └── JournaledCallError          a journaled call that failed for good, replayed

Stores wrap their driver's exceptions into this tree in one place each. One warning,
:class:`CheckpointFallbackWarning`, says that a damaged checkpoint was skipped.
"""

from __future__ import annotations


class NestEggError(Exception):
    """Root of every error nestegg raises."""


class ConfigurationError(NestEggError, ValueError):
    """A Clutch, a checkpoint policy or a store was defined wrongly."""


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional dependency is missing; the message says what to install."""


class InvalidIdentifierError(NestEggError, ValueError):
    """A run id, LangGraph thread id, agent name or table/key prefix is not allowed."""


class NoActiveContextError(NestEggError, RuntimeError):
    """get_context() was called outside a running agent."""


class NoActiveRunError(NestEggError, RuntimeError):
    """An operation needs an executing run of this Clutch and there is none (or several)."""


class RunError(NestEggError):
    """About a run as a whole."""

    def __init__(self, message: str, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunNotFoundError(RunError, LookupError):
    """No run with that id exists in the store."""


class RunExistsError(RunError):
    """A run with that id exists: unfinished (resume it instead), completed with another
    input (use a new run id, or delete that run), or of another pipeline (use a new run
    id)."""


class RunLockedError(RunError):
    """Another live process owns the run."""


class RunFinishedError(RunLockedError):
    """A claim found the run finished (completed, failed or cancelled) and did not reopen
    it: another process ended it after it was read as unfinished. A lost claim, as its
    base class says, so that whoever drops a run another process took drops it too;
    :meth:`nestegg.Clutch.resume_latest` of a finished run reopens it on purpose.

    Attributes:
        run_id: the run.
        status: the status it was found in.
    """

    def __init__(self, run_id: str, status: str, message: str | None = None) -> None:
        super().__init__(
            message or f"run {run_id!r} is {status}: a claim does not reopen it", run_id
        )
        self.status = status


class StaleOwnerError(RunError):
    """This process no longer owns the run: another one took it over."""


class RunFailedError(RunError):
    """A run failed; raised to whoever awaits its result (any process).

    Attributes:
        run_id: the run.
        agent: the agent whose step failed (None when not known, or no agent raised).
        error_type: the original exception's type name (``ValueError``).
        error_message: the original exception's message.
        hook: what raised instead of an agent (``"selector"``, ``"on_request"``), else None.
    """

    def __init__(
        self,
        run_id: str,
        agent: str | None,
        error_type: str,
        error_message: str,
        hook: str | None = None,
    ) -> None:
        where = f" in agent {agent!r}" if agent else f" in {hook}" if hook else ""
        super().__init__(f"run {run_id!r} failed{where}: {error_type}: {error_message}", run_id)
        self.agent = agent
        self.error_type = error_type
        self.error_message = error_message
        self.hook = hook


class RunWaiting(RunError):
    """The run waits, without a process, for a signal (:func:`nestegg.wait_for`) or a
    durable timer (:func:`nestegg.sleep`); it is stored with status ``waiting``.

    Attributes:
        run_id: the run.
        signal: the signal's name (None for a timer).
        deadline: when the wait ends (UNIX seconds): wait_for's timeout, or when the timer
            is due; None when it waits for its signal without a deadline.
        on_workers: whether the run is the workers' (a worker's sweep resumes it when its
            timer is due), not this process's (``recover()`` does).
        over: whether its wait is over (its signal stored, its deadline or timer passed)
            and the run waits only for a process to continue it.
        unreadable: why what the run waits for cannot be read (its event log is
            damaged: ``signal`` is None, and only its deadline is known); None when it
            can.
    """

    def __init__(
        self,
        run_id: str,
        signal: str | None,
        deadline: float | None,
        *,
        on_workers: bool = False,
        over: bool = False,
        unreadable: str | None = None,
    ) -> None:
        what = f"for signal {signal!r}" if signal is not None else "for its timer"
        until = f" until {_when(deadline)}" if deadline is not None else ""
        if unreadable is not None:  # no timer: what it waits for is unknown
            what = "for something unknown"
            until += f" (its event log is damaged: {unreadable})"
        if over:
            message = (
                f"run {run_id!r} waited {what}{until} and its wait is over: recover() or "
                f"resume_latest({run_id!r}) continues it (unless a signal() with its resume, "
                "or a recover() elsewhere, is doing so now)"
            )
        elif signal is not None:
            how = f"send it with signal({run_id!r}, {signal!r}, value)"
        elif on_workers:
            how = "a worker's sweep resumes it when due"
        else:
            how = "recover() resumes it when due"
        if not over:
            message = f"run {run_id!r} waits {what}{until}: {how}"
        super().__init__(message, run_id)
        self.signal = signal
        self.deadline = deadline
        self.on_workers = on_workers
        self.over = over
        self.unreadable = unreadable


REPLACE_OPTION = "replace=True"
"""How the advice in signal errors names the option that sends another value; the
command's texts (:meth:`SignalExistsError.advice` and its kin) name ``--replace``."""


class SignalError(RunError):
    """A signal to a run that was not stored; its message (:meth:`advice`) names
    ``replace=True`` as the option that stores it.

    Attributes:
        run_id: the run.
        signal: the signal's name.
    """

    def __init__(self, run_id: str, signal: str) -> None:
        self.run_id, self.signal = run_id, signal
        super().__init__(self.advice(REPLACE_OPTION), run_id)

    def advice(self, replace: str) -> str:
        """The message, naming ``replace`` as the option that stores the signal."""
        raise NotImplementedError


class SignalExistsError(SignalError):
    """A signal of that name was already sent to the run (pass ``replace=True`` to send
    another value).

    Attributes:
        awaited: the run waits for that signal, so no step has received it yet.
        late: it came after the deadline of that wait, which times out when the run is
            resumed (a replacement keeps the time the first came).
    """

    def __init__(
        self, run_id: str, signal: str, *, awaited: bool = False, late: bool = False
    ) -> None:
        self.awaited, self.late = awaited, late
        super().__init__(run_id, signal)

    def advice(self, replace: str) -> str:
        """The message, naming ``replace`` as the way to send another value."""
        head = f"run {self.run_id!r} has a signal {self.signal!r} already"
        if self.awaited and self.late:
            return (
                f"{head}, which no step has received: it came after the deadline of the "
                "run's wait for it, so that wait times out when the run is resumed (a new "
                f"value keeps the time the first came); pass {replace} to send another value"
            )
        if self.awaited:
            return (
                f"{head}, which no step has received yet: the run waits for it and receives "
                f"it when resumed; pass {replace} to send another value instead"
            )
        return (
            f"{head}; a signal is sent once per run and name: pass {replace} to send another "
            "value (a step that received the first one keeps it; a wait that has not "
            "received it yet gets the new one)"
        )


class SignalRefusedError(SignalError):
    """A signal to a run that completed: no step would ever read it, so it is not stored
    (``replace=True`` stores it, for a resume from an earlier checkpoint)."""

    def advice(self, replace: str) -> str:
        """The message, naming ``replace`` as the way to store it all the same."""
        return (
            f"run {self.run_id!r} completed: no step would read signal "
            f"{self.signal!r}, it was not stored ({replace} stores it for a resume from an "
            "earlier checkpoint)"
        )


def _when(at: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


class SignalTimeoutError(NestEggError, TimeoutError):
    """Raised inside the agent by :func:`nestegg.wait_for` when its deadline passed before
    the signal came (the agent may catch it).

    Attributes:
        signal: the signal's name.
        deadline: the deadline that passed (UNIX seconds).
    """

    def __init__(self, signal: str, deadline: float) -> None:
        super().__init__(f"signal {signal!r} did not come before {_when(deadline)}")
        self.signal = signal
        self.deadline = deadline


class SignalValueError(NestEggError, ValueError):
    """The value of a signal does not fit the ``type=`` of the ``wait_for`` receiving it
    (nothing is journaled: send a fitting one with ``replace=True`` and resume the run).

    Attributes:
        signal: the signal's name.
        type_name: the type it does not fit.
        reason: why, as the validator says it.
    """

    def __init__(self, signal: str, type_name: str, reason: str) -> None:
        self.signal = signal
        self.type_name = type_name
        self.reason = reason
        super().__init__(self.advice(REPLACE_OPTION))

    def advice(self, replace: str) -> str:
        """The message, naming ``replace`` as the way to send a fitting value."""
        return (
            f"the value of signal {self.signal!r} does not fit {self.type_name}: "
            f"{self.reason} (send another with {replace}, then resume the run)"
        )


class CheckpointError(NestEggError):
    """About one checkpoint."""


class CheckpointNotFoundError(CheckpointError, LookupError):
    """No checkpoint with that id exists."""


class CheckpointExistsError(CheckpointError):
    """A checkpoint id is taken in the store already (checkpoint ids are unique in a store,
    not in a run): an import carrying it would take the checkpoint from its run.

    Attributes:
        checkpoint_id: the id that is taken.
        run_id: the run of the store that has it.
    """

    def __init__(self, message: str, checkpoint_id: str, run_id: str) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id
        self.run_id = run_id


class CheckpointCorruptedError(CheckpointError):
    """A stored record is torn or altered: its checksum does not match."""


class EventLogDamagedError(CheckpointCorruptedError):
    """A run is refused because its event log cannot be read (a torn batch) and what is
    asked of the run needs it: a resume that decides from it what a waiting run waits for,
    or whether the run's ``on_request`` hook passed; an export, which copies it whole.
    Nothing of the run is changed.

    Attributes:
        run_id: the run refused.
    """

    def __init__(self, message: str, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class CheckpointSerializationError(CheckpointError, TypeError):
    """A value cannot be stored; the message names its path and type."""

    def __init__(self, path: str, type_name: str, detail: str = "") -> None:
        message = f"cannot store the value at {path}: type {type_name} is not serializable"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)
        self.path = path
        self.type_name = type_name


class RecordTooLargeError(CheckpointSerializationError):
    """A value or a commit is larger than a store takes at once (``RECORD_MAX_BYTES`` for
    one value, ``COMMIT_MAX_BYTES`` for a commit, in :mod:`nestegg.constants`); the message
    names it, its size and the limit. Not a StorageError: the same value is as large on
    every try, so its step fails instead of waiting for the store.

    Attributes:
        path: what is too large (``input``, ``data``, ``result of fetch``, the commit of a
            step of a run).
        type_name: the type of the value (``Commit`` for a commit).
        size: its size in bytes, encoded.
        limit: the most bytes it may have.
    """

    def __init__(self, path: str, type_name: str, size: int, limit: int) -> None:
        CheckpointError.__init__(
            self,
            f"cannot store {path}: it is {size:,} bytes encoded, over the {limit:,} bytes "
            "a store takes at once",
        )
        self.path = path
        self.type_name = type_name
        self.size = size
        self.limit = limit


class IncompatibleCheckpointError(CheckpointError):
    """The pipeline changed since the checkpoint; the message names what is missing.

    Attributes:
        agent: the agent the checkpoint continues with that the pipeline lacks (None when
            something else is missing; an IncompatibleDataError's agent is there).
    """

    def __init__(self, message: str, agent: str | None = None) -> None:
        super().__init__(message)
        self.agent = agent


class IncompatibleDataError(IncompatibleCheckpointError):
    """The data a resume continues with (a step's output, or the run's input) no longer
    fits the pydantic model of the agent it goes to (or of the selector): the model
    changed since it was stored. Raised before the run is claimed, so nothing stored
    changes; the run resumes once the model fits the data again. A fork whose data (given,
    or its checkpoint's) does not fit is refused so too, before its run is stored.

    Attributes:
        run_id: the run (of a fork: the run of its checkpoint).
        step: the step that stored the data (0: the run's input).
        agent: the agent whose model it no longer fits (None: the selector's). The agent
            is there: unlike the base class's, it is not missing.
        model: the model's name.
        reason: why, as pydantic says it (``pages: Field required``).
        waited: on workers, the seconds the step was set aside for a worker whose model
            fits it before the run was failed for it (None: nothing was changed).
        fork_of: the checkpoint of a refused fork (None: a resume's refusal).
        given: a fork's data was given (``data=``, ``--data``), not its checkpoint's.
    """

    def __init__(
        self,
        run_id: str,
        step: int,
        agent: str | None,
        model: str,
        reason: str,
        waited: float | None = None,
        *,
        fork_of: str | None = None,
        given: bool = False,
    ) -> None:
        data = f"the stored data of step {step}" if step else "the run's input"
        whose = f"agent {agent!r}" if agent is not None else "the selector"
        outcome = (
            "nothing was changed"
            if waited is None
            else f"no worker whose model fits took the step within {waited:.0f} s, so the "
            "run failed"
        )
        if fork_of is None:
            message = (
                f"run {run_id!r}: {data} no longer fits the model {model} of {whose} "
                f"({reason}); {outcome}: resume it once the model fits the data again"
            )
        elif given:
            message = (
                f"fork of checkpoint {fork_of!r} of run {run_id!r}: the data given does not "
                f"fit the model {model} of {whose} ({reason}); nothing was stored: give "
                "data that fits it"
            )
        else:
            message = (
                f"fork of checkpoint {fork_of!r} of run {run_id!r}: {data} no longer fits "
                f"the model {model} of {whose} ({reason}); nothing was stored: give data "
                "that fits it, or fork once the model fits the data again"
            )
        super().__init__(message, agent)
        self.run_id = run_id
        self.step = step
        self.model = model
        self.reason = reason
        self.waited = waited
        self.fork_of = fork_of
        self.given = given


class StorageError(NestEggError):
    """A store failed."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The store cannot be reached."""


class StoreRefusedError(StorageError, ConfigurationError):
    """The store's server refused the store's settings: a login (user, password), a
    database it does not have, an ACL that denies the user. Retrying with the same
    settings will not mend it, so it is a :class:`ConfigurationError` (the command exits
    2); and a store failed, so it is a :class:`StorageError` too: a worker gives the step
    back, as for any store failure, rather than failing the run (the settings may be
    mended on the server, as in a password rotation, while the worker runs). The message
    names the server (its URL without the password)."""


class TransportError(NestEggError):
    """A message broker failed, or a message is not a nestegg step message."""


class BrokerRefusedError(TransportError):
    """The broker refused this client's settings, which retrying will not mend: a login
    refused (user, password), a RabbitMQ vhost or a Redis database that does not exist,
    no permission. The message names the broker's URL (without the password)."""


class JournalError(NestEggError):
    """About journaled calls inside a step."""


class NonDeterminismError(JournalError):
    """A re-executed step made a different call than the journal recorded, or the journal
    holds a result that does not fit the called function's return annotation."""


class ModuleNameMismatchError(NonDeterminismError):
    """A re-executed step called the function the journal recorded, but named by another
    module path: the pipeline's module is imported as ``imported_module`` while the run
    journaled it as ``journaled_module`` (another current directory or PYTHONPATH, or
    another ``--app``). The run fails as for any NonDeterminismError; resumed with the
    module imported as the journal names it, it replays the journaled calls."""

    def __init__(self, message: str, journaled_module: str, imported_module: str) -> None:
        super().__init__(message)
        self.journaled_module = journaled_module
        self.imported_module = imported_module


class JournaledCallError(JournalError):
    """A journaled call failed for good; replaying it raises this with the original error.

    The replay is also an instance of the original exception class when this process has
    it loaded (see :mod:`nestegg.journal_failures`), so the ``except`` clauses that caught
    the call's failure catch its replay.

    Attributes:
        function: the journaled function's name.
        error_type: the original exception's type name (``ValueError``).
        error_message: the original exception's message.
    """

    def __init__(self, function: str, error_type: str, message: str) -> None:
        # Not super().__init__: a replay's class has the original class among its bases,
        # whose __init__ takes arguments of its own.
        Exception.__init__(self, f"{function} failed: {error_type}: {message}")
        self.function = function
        self.error_type = error_type
        self.error_message = message


class CheckpointFallbackWarning(UserWarning):
    """A damaged checkpoint was skipped; the run resumes from an older one."""
