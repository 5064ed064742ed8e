"""The one exception tree of nestegg.

Every error nestegg raises on purpose is a :class:`NestEggError`; each names the culprit
(the agent, the run, the checkpoint, the path of a value) in its message::

    NestEggError
    ├── ConfigurationError              a Clutch, policy or store defined wrongly
    │   └── MissingDependencyError      an optional driver is not installed (names the extra)
    ├── InvalidIdentifierError          a run id, agent name or prefix that is not allowed
    ├── NoActiveContextError            get_context() outside an agent (also a RuntimeError)
    ├── NoActiveRunError                checkpoint() while no run of the Clutch executes
    ├── RunError                        about a run as a whole
    │   ├── RunNotFoundError            no run with that id
    │   ├── RunExistsError              the id is taken: unfinished (resume it), other input
    │   ├── RunLockedError              another live process owns the run
    │   ├── StaleOwnerError             this process lost ownership (fencing token moved on)
    │   └── RunFailedError              a run awaited by result() failed (names agent and error)
    ├── CheckpointError                 about one checkpoint
    │   ├── CheckpointNotFoundError     no checkpoint with that id
    │   ├── CheckpointCorruptedError    a torn or altered record (checksum mismatch)
    │   ├── CheckpointSerializationError  a value that cannot be stored (names its path and type)
    │   └── IncompatibleCheckpointError the pipeline changed: what the checkpoint needs is gone
    ├── StorageError                    a store failed
    │   └── StorageUnavailableError     the store cannot be reached
    ├── TransportError                  a broker failed, or sent what is not a step message
    └── JournalError                    about journaled calls
        ├── NonDeterminismError         a re-executed step made different calls
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
    """A run id, agent name or table/key prefix is not allowed."""


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
    """A run with that id exists: unfinished (resume it instead), or completed with another
    input (use a new run id, or delete that run)."""


class RunLockedError(RunError):
    """Another live process owns the run."""


class StaleOwnerError(RunError):
    """This process no longer owns the run: another one took it over."""


class RunFailedError(RunError):
    """A run failed; raised to whoever awaits its result (any process).

    Attributes:
        run_id: the run.
        agent: the agent whose step failed (None when not known).
        error_type: the original exception's type name (``ValueError``).
        error_message: the original exception's message.
    """

    def __init__(self, run_id: str, agent: str | None, error_type: str, error_message: str) -> None:
        where = f" in agent {agent!r}" if agent else ""
        super().__init__(f"run {run_id!r} failed{where}: {error_type}: {error_message}", run_id)
        self.agent = agent
        self.error_type = error_type
        self.error_message = error_message


class CheckpointError(NestEggError):
    """About one checkpoint."""


class CheckpointNotFoundError(CheckpointError, LookupError):
    """No checkpoint with that id exists."""


class CheckpointCorruptedError(CheckpointError):
    """A stored record is torn or altered: its checksum does not match."""


class CheckpointSerializationError(CheckpointError, TypeError):
    """A value cannot be stored; the message names its path and type."""

    def __init__(self, path: str, type_name: str, detail: str = "") -> None:
        message = f"cannot store the value at {path}: type {type_name} is not serializable"
        if detail:
            message = f"{message} ({detail})"
        super().__init__(message)
        self.path = path
        self.type_name = type_name


class IncompatibleCheckpointError(CheckpointError):
    """The pipeline changed since the checkpoint; the message names what is missing."""


class StorageError(NestEggError):
    """A store failed."""


class StorageUnavailableError(StorageError, ConnectionError):
    """The store cannot be reached."""


class TransportError(NestEggError):
    """A message broker failed, or a message is not a nestegg step message."""


class JournalError(NestEggError):
    """About journaled calls inside a step."""


class NonDeterminismError(JournalError):
    """A re-executed step made a different call than the journal recorded, or the journal
    holds a result that does not fit the called function's return annotation."""


class JournaledCallError(JournalError):
    """A journaled call failed for good; replaying it raises this with the original error."""

    def __init__(self, function: str, error_type: str, message: str) -> None:
        super().__init__(f"{function} failed: {error_type}: {message}")
        self.function = function
        self.error_type = error_type
        self.error_message = message


class CheckpointFallbackWarning(UserWarning):
    """A damaged checkpoint was skipped; the run resumes from an older one."""
