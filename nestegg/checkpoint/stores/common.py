"""What every store says and means the same way, written once: the errors of the store
contract, and what a :class:`~nestegg.checkpoint.records.Commit` does to a run.

Each store raises these errors (``raise run_not_found(run_id)``) instead of writing the text
out, and applies the :class:`ChangeSet` that :func:`change_set` makes of a commit instead of
working out the commit's meaning itself.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    RunRecord,
    StepRecord,
)
from nestegg.constants import COMMIT_MAX_BYTES, FINISHED, STATUSES
from nestegg.errors import (
    ConfigurationError,
    RecordTooLargeError,
    RunExistsError,
    RunFinishedError,
    RunLockedError,
    RunNotFoundError,
    StaleOwnerError,
    StorageError,
)

RUN_FIELDS = ("status", "result", "error", "lease_until", "step_seq", "event_seq")
"""The run-row fields a commit sets when it carries them (``updated_at`` aside)."""


@dataclass(slots=True)
class ChangeSet:
    """What one commit does to a run, spelled out: a store checks that the stored run's
    fence is ``fence`` (else ``stale_fence``; ``run_not_found`` without the run), then
    applies the rest in the order of the fields, atomically.

    ``truncate_after`` and ``journal_after`` are both None or both set: delete the step
    records and checkpoints whose seq is past ``truncate_after`` and the journal entries of
    the steps past ``journal_after``; events are never deleted. Then insert ``steps``,
    ``events``, ``journal``, ``checkpoints``; delete the checkpoints in ``prune``; then set
    the run fields in ``run_fields`` (name -> value; the run's other fields keep theirs).

    Not frozen: every commit makes one, and a frozen dataclass sets each of its fields
    through ``object.__setattr__``.
    """

    run_id: str
    fence: int
    truncate_after: int | None
    journal_after: int | None
    steps: Sequence[StepRecord]
    events: Sequence[EventRecord]
    journal: Sequence[JournalRecord]
    checkpoints: Sequence[CheckpointRecord]
    prune: Sequence[str]
    run_fields: dict[str, Any]


def change_set(commit: Commit) -> ChangeSet:
    """The literal changes ``commit`` makes: the journal kept by a truncation resolved, and
    the run fields it sets (those it carries: not None; ``updated_at`` unless 0.0, unset).
    """
    after = commit.truncate_after
    fields = {name: value for name in RUN_FIELDS if (value := getattr(commit, name)) is not None}
    if commit.updated_at:
        fields["updated_at"] = commit.updated_at
    return ChangeSet(
        commit.run_id,
        commit.fence,
        after,
        None if after is None else commit.journal_kept_through(after),
        commit.steps,
        commit.events,
        commit.journal,
        commit.checkpoints,
        commit.prune,
        fields,
    )


def check_size(commit: Commit) -> None:
    """Refuse ``commit`` if its records add up past COMMIT_MAX_BYTES, before a store writes
    any of it: RecordTooLargeError naming its run and the steps it carries."""
    size = commit.size()
    if size <= COMMIT_MAX_BYTES:
        return
    where = f"the commit of {_steps_of(commit)}run {commit.run_id!r}"
    raise RecordTooLargeError(where, type(commit).__name__, size, COMMIT_MAX_BYTES)


def _steps_of(commit: Commit) -> str:
    """``step 3 of ``, ``steps 1 to 4 of ``: the steps whose records ``commit`` carries."""
    seqs = sorted({*(step.seq for step in commit.steps), *(j.step for j in commit.journal)})
    if not seqs:
        return ""
    return f"step {seqs[0]} of " if len(seqs) == 1 else f"steps {seqs[0]} to {seqs[-1]} of "


def set_run_fields(run: RunRecord, changes: ChangeSet) -> None:
    """Set the run fields of ``changes`` on ``run`` (the stores that keep records whole)."""
    for name, value in changes.run_fields.items():
        setattr(run, name, value)


def commit_outcome(commit: Commit, stored: int | None) -> StaleOwnerError | RunNotFoundError | None:
    """The error of a commit whose run's fence was ``stored`` (None: no run), if any: what
    a server store's fenced write answers, the fence it carried when it was applied."""
    if stored == commit.fence:
        return None
    if stored is None:
        return run_not_found(commit.run_id)
    return stale_fence(commit.run_id, stored, commit.fence)


def store_path(path: object, store: str, needs: Literal["file", "directory"]) -> Path:
    """``path`` (a str or an os.PathLike of one, ``~`` expanded) for a store of a database
    ``file`` or of a ``directory``, checked when the store is built rather than at its first
    use: a value of another type, an empty path, or a path that exists as the other kind.

    Raises:
        ConfigurationError: naming the store, the value and what it needs.
    """
    named = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(named, str):
        raise ConfigurationError(
            f"{store} needs the path of its {needs} (a str or a pathlib.Path), got {path!r}"
        )
    if not named:  # Path("") is the current directory: a path left out, not that one
        example = "such as 'nestegg.db'" if needs == "file" else "'.' for the current one"
        raise ConfigurationError(
            f"{store} path is empty: it needs the path of a "
            f"{'database file' if needs == 'file' else 'directory'} ({example})"
        )
    checked = Path(named).expanduser()
    if needs == "file" and checked.is_dir():
        raise ConfigurationError(
            f"{store} path {named!r} is a directory: it needs the path of a database file "
            f"(such as {str(checked / 'nestegg.db')!r})"
        )
    if needs == "directory" and checked.exists() and not checked.is_dir():
        raise ConfigurationError(
            f"{store} path {named!r} is a file: it needs the path of a directory"
        )
    return checked


def run_not_found(run_id: str) -> RunNotFoundError:
    """A writer or a reader named a run the store does not have: the one text of it, which
    commands and the web inspector show as it is."""
    return RunNotFoundError(f"no run {run_id!r} in the store", run_id)


def check_status(
    status: object, accepted: Sequence[str] = STATUSES, shown: Callable[[object], str] = repr
) -> None:
    """Refuse a status to list runs by that is not one of ``accepted``, naming them all:
    the one text of it, for the library, the commands and the web inspector (``shown``
    writes the status given: JSON for a JSON body's).

    Raises:
        ConfigurationError: ``unknown status 'bogus'; one of running, completed, ...``.
    """
    if status not in accepted:
        raise ConfigurationError(f"unknown status {shown(status)}; one of {', '.join(accepted)}")


def run_exists(run_id: str) -> RunExistsError:
    """``create_run`` with an id that is taken."""
    return RunExistsError(f"run {run_id!r} exists", run_id)


def run_claimed(run_id: str) -> RunLockedError:
    """``claim_run`` lost: the fence moved on."""
    return RunLockedError(f"run {run_id!r} was claimed by another owner", run_id)


def claim_refusal(
    run_id: str, fence: int, status: str, expected_fence: int, reopen: bool
) -> RunLockedError | None:
    """Why ``claim_run`` at ``expected_fence`` (``reopen`` or not) of a run stored at
    ``fence`` with ``status`` is refused: the fence moved on, or the run is finished and
    not to be reopened; None when it is not."""
    if fence != expected_fence:
        return run_claimed(run_id)
    if status in FINISHED and not reopen:
        return run_finished(run_id, status)
    return None


def run_finished(run_id: str, status: str) -> RunFinishedError:
    """``claim_run`` without ``reopen`` found the run ``status`` (finished)."""
    return RunFinishedError(run_id, status)


def stale_fence(run_id: str, stored: int, carried: int) -> StaleOwnerError:
    """``commit`` carries fence ``carried`` but the run is at ``stored``."""
    return StaleOwnerError(
        f"run {run_id!r} is owned by a newer owner (fence {stored}, this write carries {carried})",
        run_id,
    )


def older_than_read(
    what: str, version: int, readable_from: int, who: str, url: str
) -> StorageError:
    """A store opened for a reader is of schema ``version``, older than the oldest it reads
    as it is (``readable_from``): refused, not migrated. ``what`` names the store (``the
    SQLite database PATH``), ``who`` who may upgrade it (``as a role that may alter its
    tables``), ``url`` where the command that upgrades it finds it (no password)."""
    return StorageError(
        f"{what} has schema version {version}, which a reader does not upgrade (it reads "
        f"version {readable_from} and newer); nothing was changed: upgrade it {who}, with a "
        f"command that writes (nestegg prune --keep 1 --dry-run --store {shlex.quote(url)} "
        "upgrades it and deletes nothing) or a store's setup()"
    )


def newer_than_known(what: str, version: int, known: int) -> StorageError:
    """A store opened for a reader is of schema ``version``, newer than this nestegg's
    ``known``: refused (a newer nestegg may keep what it reads elsewhere)."""
    return StorageError(
        f"{what} has schema version {version}; this nestegg knows up to {known}: upgrade nestegg"
    )


__all__ = [
    "RUN_FIELDS",
    "ChangeSet",
    "change_set",
    "check_status",
    "check_size",
    "claim_refusal",
    "commit_outcome",
    "newer_than_known",
    "older_than_read",
    "run_claimed",
    "run_exists",
    "run_finished",
    "run_not_found",
    "set_run_fields",
    "stale_fence",
]
