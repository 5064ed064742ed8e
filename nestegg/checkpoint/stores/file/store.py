"""A store of plain, readable files: one directory per run.

Layout under the root (directories 0700, files 0600)::

    runs/<run_id>/run.json          the run row, replaced atomically
    runs/<run_id>/input.json        the run's input, written once
    runs/<run_id>/steps.log         step records, JSON lines, append-only
    runs/<run_id>/events.log        events, JSON lines, append-only
    runs/<run_id>/journal.log       journal entries, JSON lines, append-only
    runs/<run_id>/signals.log       signals sent to the run, JSON lines (the last of a
                                    name counts)
    runs/<run_id>/checkpoints/<seq>-<id>.json
                                    one checkpoint, replaced atomically; its name holds
                                    the step it covers (zero-padded) and its id
    runs/<run_id>/run.lock          flock'ed by claims and commits
    runs/<run_id>/pending-commit.json  the commit being applied (see commit.py)
    checkpoint-index/<id>           symlink to the checkpoint's file: id -> run
    staging/, trash/                runs being created or deleted (a crash's leftovers
                                    there are removed after FILE_LEFTOVER_SECONDS)

Claims and commits hold an exclusive ``flock`` on the run's lock file and re-read the
fence under it, so several processes can share a root. A commit is atomic: it is written
whole before it is applied, and redone if a crash cut it short (:mod:`.commit`).
Every write is fsynced before the call returns. :mod:`.format` describes the
records and how torn and damaged ones are read. POSIX only (``fcntl.flock``).
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from urllib.parse import unquote, urlsplit

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.common import (
    check_size,
    claim_refusal,
    run_exists,
    run_not_found,
    stale_fence,
    store_path,
)
from nestegg.checkpoint.stores.file.commit import (
    commit_durably,
    remove_checkpoints,
    write_run,
)
from nestegg.checkpoint.stores.file.format import (
    checkpoint_files,
    damaged_run,
    decode_run,
    encode_run,
    file_name_id,
    holds_a_run,
    read_checkpoint_file,
    read_log,
    read_signals,
    record_seq,
    signal_line,
)
from nestegg.checkpoint.stores.file.io import (
    append_durably,
    create_file,
    sync_directory,
)
from nestegg.checkpoint.stores.file.threads import FileThreadRows
from nestegg.constants import (
    FILE_CHECKPOINT_INDEX_DIR,
    FILE_CHECKPOINTS_DIR,
    FILE_EVENTS_LOG,
    FILE_INPUT,
    FILE_JOURNAL_LOG,
    FILE_LOCK,
    FILE_RUN,
    FILE_RUNS_DIR,
    FILE_SIGNALS_LOG,
    FILE_STAGING_DIR,
    FILE_STEPS_LOG,
    FILE_TRASH_DIR,
    RUNNING,
)
from nestegg.errors import (
    CheckpointCorruptedError,
    ConfigurationError,
    InvalidIdentifierError,
    RunNotFoundError,
    StorageError,
)
from nestegg.urls import query_problem, slashes_problem, without_password


def _run_id(run_id: str) -> str:
    return file_name_id(run_id, "run id")


def _checkpoint_id(checkpoint_id: str) -> str:
    return file_name_id(checkpoint_id, "checkpoint id")


def _host_problem(url: str) -> str | None:
    """What is wrong with a file URL's host (None: nothing): one other than none,
    ``localhost``, or ``.`` and ``..`` (a path relative to the current directory)."""
    shown = without_password(url)
    host = urlsplit(shown).netloc
    if host in ("", "localhost", ".", ".."):
        return None
    relative = shown.partition("//")[2].partition("?")[0]
    return (
        f"{host!r} would be read as a host, which a file URL has none of: "
        f"file:///absolute/dir, or file://./{relative} for {relative!r} in the current "
        "directory"
    )


class FileCheckpointStorage(FileThreadRows):
    """Keeps each run in its own directory of readable JSON files.

    Args:
        path: the root directory; created (0700) on first use.

    Raises:
        InvalidIdentifierError: a run or checkpoint id with a path separator, ``..``, a
            NUL or a line break, or too long (checked before the disk is touched);
            ``get_checkpoint`` returns None for such an id instead, as every store does
            for an id it does not hold.
        StorageUnavailableError: the root cannot be read or written.
        StorageError: another file-system failure (a full disk, for one).

    Example:
        >>> store = FileCheckpointStorage(Path("./checkpoints"))
        >>> clutch = Clutch("p", checkpoint=CheckpointConfig(storage=store))
    """

    def __init__(self, path: str | Path) -> None:
        self.root = store_path(path, "FileCheckpointStorage", "directory")
        self._runs = self.root / FILE_RUNS_DIR
        self._index = self.root / FILE_CHECKPOINT_INDEX_DIR
        self._ready = False

    @classmethod
    def from_url(cls, url: str) -> FileCheckpointStorage:
        """A store for ``file:///absolute/dir`` (or ``file://./relative/dir``).

        Raises:
            ConfigurationError: not a ``file`` URL, or no directory in it, no ``//`` after
                ``file:`` (``file:dir``), a host other than ``localhost`` (``file://dir``
                would read ``dir`` as one), or a query (the store takes no options there).
        """
        parts = urlsplit(url)
        netloc = "" if parts.netloc == "localhost" else parts.netloc
        path = unquote(netloc + parts.path)
        if parts.scheme != "file" or not path:
            raise ConfigurationError(f"not a file store URL: {url!r} (expected file:///dir)")
        problem = (
            slashes_problem(url, "file://./{}", "file:///{}")
            or query_problem(url)
            or _host_problem(url)
        )
        if problem is not None:
            raise ConfigurationError(f"file store URL {without_password(url)!r}: {problem}")
        return cls(path)

    def __repr__(self) -> str:
        return f"FileCheckpointStorage({str(self.root)!r})"

    # -- runs ----------------------------------------------------------------------------

    async def setup(self) -> None:
        """Create the root directory and its layout (idempotent; also done lazily)."""
        await self._io(self._ensure_root)

    async def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""

    async def create_run(self, run: RunRecord) -> None:
        _run_id(run.run_id)
        await self._io(self._create_run, run)

    def _create_run(self, run: RunRecord) -> None:
        self._ensure_root()
        staging = Path(tempfile.mkdtemp(dir=self.root / FILE_STAGING_DIR))
        try:
            create_file(staging / FILE_RUN, encode_run(run))
            create_file(staging / FILE_INPUT, run.input)
            for name in (FILE_STEPS_LOG, FILE_EVENTS_LOG, FILE_JOURNAL_LOG, FILE_LOCK):
                create_file(staging / name)
            (staging / FILE_CHECKPOINTS_DIR).mkdir(mode=0o700)
            sync_directory(staging)
            try:
                staging.rename(self._run_dir(run.run_id))
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    raise run_exists(run.run_id) from None
                raise
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        sync_directory(self._runs)

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._io(self._get_run, _run_id(run_id))

    def _get_run(self, run_id: str) -> RunRecord | None:
        run_dir = self._settled(run_id)
        try:
            row, input_bytes = (
                (run_dir / FILE_RUN).read_bytes(),
                (run_dir / FILE_INPUT).read_bytes(),
            )
        except (FileNotFoundError, NotADirectoryError) as exc:
            if isinstance(exc, NotADirectoryError) and not self._runs.is_dir():
                raise  # the store's root is unusable, not the run
            if not holds_a_run(run_dir):
                return None  # no such run (or deleted meanwhile: the whole directory goes)
            what = f"has no {Path(str(exc.filename)).name}" if run_dir.is_dir() else "is a file"
            raise StorageError(
                f"run {run_id!r} is damaged: its directory {run_dir} {what}"
            ) from None
        return decode_run(row, input_bytes, run_dir / FILE_RUN)

    def _read_row(self, run_dir: Path, run_id: str) -> RunRecord:
        """The run row without its input (for fenced updates)."""
        try:
            row = (run_dir / FILE_RUN).read_bytes()
        except FileNotFoundError:
            raise run_not_found(run_id) from None
        return decode_run(row, b"", run_dir / FILE_RUN)

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        return await self._io(self._list_runs, pipeline, statuses, limit, before)

    def _list_runs(
        self,
        pipeline: str | None,
        statuses: Sequence[str] | None,
        limit: int | None,
        before: tuple[float, str] | None,
    ) -> list[RunRecord]:
        runs = [
            run
            for run in self._all_runs()
            if (pipeline is None or run.pipeline == pipeline)
            and (statuses is None or run.status in statuses)
            and (before is None or (run.created_at, run.run_id) < before)
        ]
        runs.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return runs[:limit] if limit is not None else runs

    def _run_names(self) -> list[str]:
        try:
            return [entry.name for entry in os.scandir(self._runs) if entry.is_dir()]
        except FileNotFoundError:
            return []

    def _all_runs(self) -> Iterator[RunRecord]:
        for name in self._run_names():
            try:
                run = self._get_run(name)
            except StorageError as exc:  # listed as damaged; reading it says why
                run = damaged_run(self._runs / name, str(exc))
            if run is not None:  # None: deleted meanwhile
                yield run

    async def list_forks(self, run_id: str, limit: int | None = None) -> list[RunRecord]:
        """The runs forked from ``run_id``, newest first: a scan of every run's row (the
        input read only of those listed), no index; a damaged run, whose parent cannot be
        read, is left out."""
        return await self._io(self._list_forks, run_id, limit)

    def _list_forks(self, run_id: str, limit: int | None) -> list[RunRecord]:
        forks = []
        for name in self._run_names():
            try:
                if self._read_row(self._runs / name, name).parent_run != run_id:
                    continue
                fork = self._get_run(name)
            except (StorageError, RunNotFoundError):  # damaged, or deleted meanwhile
                continue
            if fork is not None:
                forks.append(fork)
        forks.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
        return forks[:limit] if limit is not None else forks

    async def claim_run(
        self,
        run_id: str,
        expected_fence: int,
        owner: Owner,
        lease_until: float,
        now: float,
        *,
        reopen: bool = False,
    ) -> RunRecord:
        _run_id(run_id)
        claim = (run_id, expected_fence, owner, lease_until, now, reopen)
        return await self._io(self._claim_run, *claim)

    def _claim_run(
        self,
        run_id: str,
        expected_fence: int,
        owner: Owner,
        lease_until: float,
        now: float,
        reopen: bool,
    ) -> RunRecord:
        with self._locked(run_id) as run_dir:
            run = self._read_row(run_dir, run_id)
            refusal = claim_refusal(run_id, run.fence, run.status, expected_fence, reopen)
            if refusal is not None:
                raise refusal
            run.fence += 1
            run.owner = owner
            run.lease_until = lease_until
            run.status = RUNNING
            run.updated_at = now
            write_run(run_dir, run)
            run.input = (run_dir / FILE_INPUT).read_bytes()
            return run

    # -- commits -------------------------------------------------------------------------

    async def commit(self, commit: Commit) -> None:
        _run_id(commit.run_id)
        check_size(commit)
        for checkpoint_id in (*(c.checkpoint_id for c in commit.checkpoints), *commit.prune):
            _checkpoint_id(checkpoint_id)
        await self._io(self._commit, commit)

    def _commit(self, commit: Commit) -> None:
        with self._locked(commit.run_id) as run_dir:
            run = self._read_row(run_dir, commit.run_id)
            if run.fence != commit.fence:
                raise stale_fence(commit.run_id, run.fence, commit.fence)
            commit_durably(run_dir, self._index, commit, run)

    # -- reading -------------------------------------------------------------------------

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        return await self._io(self._load_steps, _run_id(run_id), after, upto)

    def _load_steps(self, run_id: str, after: int, upto: int | None) -> list[StepRecord]:
        steps: dict[int, StepRecord] = {}
        for header, body in read_log(self._settled(run_id) / FILE_STEPS_LOG):
            seq = record_seq(header)
            if seq > after and (upto is None or seq <= upto):
                steps[seq] = StepRecord(run_id, seq, str(header.get("agent")), body)
        return [steps[seq] for seq in sorted(steps)]

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        return await self._io(lambda: self._read_checkpoints(self._settled(_run_id(run_id))))

    def _read_checkpoints(self, run_dir: Path) -> list[CheckpointRecord]:
        folder = run_dir / FILE_CHECKPOINTS_DIR
        records = [
            read_checkpoint_file(folder / name, run_dir.name)
            for name in checkpoint_files(run_dir / FILE_CHECKPOINTS_DIR)
        ]
        return sorted((r for r in records if r is not None), key=lambda c: (c.seq, c.checkpoint_id))

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        try:
            checked = _checkpoint_id(checkpoint_id)
        except InvalidIdentifierError:
            return None  # never stored: commit refuses such an id (and the disk is not touched)
        return await self._io(self._get_checkpoint, checked)

    def _get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        try:
            target = Path(os.readlink(self._index / checkpoint_id))
        except FileNotFoundError:
            return None
        if len(target.parts) != 5:
            return None
        run_id, name = target.parts[2], target.parts[4]
        return read_checkpoint_file(self._settled(run_id) / FILE_CHECKPOINTS_DIR / name, run_id)

    async def read_events(
        self, run_id: str, since_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        return await self._io(self._read_events, _run_id(run_id), since_seq, limit)

    def _read_events(self, run_id: str, since_seq: int, limit: int | None) -> list[EventRecord]:
        events: dict[int, EventRecord] = {}
        for header, body in read_log(self._settled(run_id) / FILE_EVENTS_LOG):
            seq = record_seq(header)
            if seq > since_seq:
                at = header.get("at")
                at = float(at) if isinstance(at, int | float) else 0.0
                kind = str(header.get("kind"))
                events[seq] = EventRecord(run_id, seq, at, kind, body)
        ordered = [events[seq] for seq in sorted(events)]
        return ordered[:limit] if limit is not None else ordered

    async def read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        return await self._io(self._read_journal, _run_id(run_id), step)

    def _read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        entries: dict[int, JournalRecord] = {}
        run_dir = self._settled(run_id)
        path = run_dir / FILE_JOURNAL_LOG
        if not path.exists() and (run_dir / FILE_RUN).exists():  # every run has one
            raise CheckpointCorruptedError(
                f"the journal of run {run_id!r} is missing ({path}): its journaled calls "
                "cannot be replayed, and running them again would pay for them twice"
            )
        for header, body in read_log(path):
            if header.get("step") == step and isinstance(header.get("position"), int):
                position = header["position"]
                entries[position] = JournalRecord(run_id, step, position, body)
        return [entries[position] for position in sorted(entries)]

    async def put_signal(self, signal: SignalRecord, replace: bool = False) -> bool:
        return await self._io(self._put_signal, _run_id(signal.run_id), signal, replace)

    def _put_signal(self, run_id: str, signal: SignalRecord, replace: bool) -> bool:
        with self._locked(run_id) as run_dir:
            log_path = run_dir / FILE_SIGNALS_LOG
            if not replace and signal.name in read_signals(log_path, run_id):
                return False
            append_durably(log_path, signal_line(signal))
            return True

    async def read_signals(self, run_id: str) -> list[SignalRecord]:
        path = self._run_dir(_run_id(run_id)) / FILE_SIGNALS_LOG
        signals = await self._io(read_signals, path, run_id)
        return [signals[name] for name in sorted(signals)]

    # -- deleting ------------------------------------------------------------------------

    async def delete_run(self, run_id: str) -> bool:
        return await self._io(self._delete_run, _run_id(run_id))

    def _delete_run(self, run_id: str, still: Callable[[RunRecord], bool] | None = None) -> bool:
        """Move the run's directory to the trash under its lock, then remove it; with
        ``still``, only if the run read under the lock still passes it."""
        try:
            with self._locked(run_id, redo=still is not None) as run_dir:
                if still is not None and not still(self._read_row(run_dir, run_id)):
                    return False
                checkpoint_ids = [
                    cid for _, cid in checkpoint_files(run_dir / FILE_CHECKPOINTS_DIR).values()
                ]
                self._ensure_root()
                trash = Path(tempfile.mkdtemp(dir=self.root / FILE_TRASH_DIR))
                run_dir.rename(trash / run_id)
                sync_directory(self._runs)
        except RunNotFoundError:
            return False
        for checkpoint_id in checkpoint_ids:
            (self._index / checkpoint_id).unlink(missing_ok=True)
        shutil.rmtree(trash, ignore_errors=True)
        return True

    async def delete_checkpoints(self, run_id: str, checkpoint_ids: Sequence[str]) -> int:
        _run_id(run_id)
        for checkpoint_id in checkpoint_ids:
            _checkpoint_id(checkpoint_id)
        if not checkpoint_ids:
            return 0
        return await self._io(self._delete_checkpoints, run_id, list(checkpoint_ids))

    def _delete_checkpoints(self, run_id: str, checkpoint_ids: list[str]) -> int:
        try:
            with self._locked(run_id) as run_dir:
                return remove_checkpoints(run_dir, self._index, checkpoint_ids)
        except RunNotFoundError:
            return 0

    async def expire_runs(
        self, statuses: Sequence[str], updated_before: float, pipeline: str | None = None
    ) -> list[str]:
        return await self._io(self._expire_runs, list(statuses), updated_before, pipeline)

    def _expire_runs(
        self, statuses: list[str], updated_before: float, pipeline: str | None
    ) -> list[str]:
        def expires(run: RunRecord) -> bool:
            return (
                run.status in statuses
                and run.updated_at < updated_before
                and (pipeline is None or run.pipeline == pipeline)
            )

        # Checked again under each run's lock: a run claimed meanwhile is running now.
        expired = [run.run_id for run in self._all_runs() if expires(run)]
        return [run_id for run_id in expired if self._delete_run(run_id, expires)]


__all__ = ["FileCheckpointStorage"]
