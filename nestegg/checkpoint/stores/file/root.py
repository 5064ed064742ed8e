"""A file store's root directory: the layout under it, each run's directory and its lock,
and the file-system errors of work done there.

Claims and commits hold an exclusive ``flock`` on the run's lock file (:meth:`FileRoot._locked`),
after redoing a commit a crash cut short (:mod:`.commit`); the creations and deletions a
crash cut short leave directories under ``staging/`` and ``trash/``, removed once older than
FILE_LEFTOVER_SECONDS.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from nestegg.checkpoint.stores.common import run_not_found
from nestegg.checkpoint.stores.file.commit import redo_pending_commit
from nestegg.checkpoint.stores.file.io import make_private_dirs, same_file
from nestegg.constants import (
    FILE_CHECKPOINT_INDEX_DIR,
    FILE_LEFTOVER_SECONDS,
    FILE_LOCK,
    FILE_PENDING_COMMIT,
    FILE_RUNS_DIR,
    FILE_STAGING_DIR,
    FILE_TRASH_DIR,
)
from nestegg.errors import RunNotFoundError, StorageError, StorageUnavailableError

T = TypeVar("T")

_UNAVAILABLE_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO, errno.ENOENT, errno.ENOTDIR}
)


def storage_error(exc: OSError, root: Path) -> StorageError:
    """The nestegg error for a file-system failure under ``root``."""
    if exc.errno in _UNAVAILABLE_ERRNOS:
        return StorageUnavailableError(f"the file store at {root} cannot be used: {exc}")
    return StorageError(f"the file store at {root} failed: {exc}")


class FileRoot:
    """A file store's root directory: its layout, its runs' directories and their locks,
    and the threads its file work runs on (the store and its thread rows share it)."""

    root: Path
    _runs: Path
    _index: Path
    _ready: bool

    async def _io(self, work: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(work, *args)
        except OSError as exc:
            raise storage_error(exc, self.root) from exc

    def _ensure_root(self) -> None:
        if not self._ready:
            for name in (FILE_RUNS_DIR, FILE_CHECKPOINT_INDEX_DIR, FILE_STAGING_DIR):
                make_private_dirs(self.root / name)
            make_private_dirs(self.root / FILE_TRASH_DIR)
            self._remove_leftovers()
            self._ready = True

    def _remove_leftovers(self) -> None:
        """Remove what creations and deletions cut short by a crash left behind."""
        # Compared with the files' st_mtime: the file system's wall clock, not a run's.
        cutoff = time.time() - FILE_LEFTOVER_SECONDS
        for name in (FILE_STAGING_DIR, FILE_TRASH_DIR):
            for entry in os.scandir(self.root / name):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    shutil.rmtree(entry.path, ignore_errors=True)

    def _run_dir(self, run_id: str) -> Path:
        return self._runs / run_id

    @contextmanager
    def _locked(self, run_id: str, *, redo: bool = True) -> Iterator[Path]:
        """Hold the run's lock file exclusively, after redoing a commit a crash cut short
        (unless ``redo`` is False); RunNotFoundError if there is no run."""
        run_dir = self._run_dir(run_id)
        lock_path = run_dir / FILE_LOCK
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR)
            except FileNotFoundError:
                raise run_not_found(run_id) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if same_file(fd, lock_path):
                    break
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # the run was deleted (and maybe created anew) meanwhile: retry
        try:
            if redo:
                redo_pending_commit(run_dir, self._index)
            yield run_dir
        finally:
            os.close(fd)

    def _settled(self, run_id: str) -> Path:
        """The run's directory, once a pending commit (in flight, or cut short by a crash)
        is done."""
        run_dir = self._run_dir(run_id)
        if (run_dir / FILE_PENDING_COMMIT).exists():
            try:
                with self._locked(run_id):
                    pass
            except RunNotFoundError:
                pass
        return run_dir


__all__ = ["FileRoot", "storage_error"]
