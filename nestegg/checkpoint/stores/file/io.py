"""Durable file operations of the file store: appends, atomic replacements, fsyncs, locks.

Files are created 0600 and directories 0700. An append first cuts off a torn last line
(a crash mid-append) so the new record never glues onto it; a replacement goes through
a temp file that is fsynced and renamed; the caller fsyncs the directory once for
several names.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_TAIL_CHUNK = 64 * 1024


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _cut_torn_tail(fd: int) -> None:
    """Truncate a last line that lacks its newline (a crash mid-append)."""
    end = os.fstat(fd).st_size
    if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
        return
    position = end
    while position > 0:
        start = max(0, position - _TAIL_CHUNK)
        chunk = os.pread(fd, position - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            os.ftruncate(fd, start + newline + 1)
            return
        position = start
    os.ftruncate(fd, 0)


def append_durably(path: Path, data: bytes) -> None:
    """Append ``data`` (whole lines) to a log, cutting off a torn tail first; fsync it."""
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        _cut_torn_tail(fd)
        _write_all(fd, data)
        sync_data(fd)
    finally:
        os.close(fd)


def make_private_dirs(path: Path) -> None:
    """``path`` and each missing parent, created 0700."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)


def sync_data(fd: int) -> None:
    """fdatasync where there is one, else fsync."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


def sync_directory(path: Path) -> None:
    """fsync a directory, making the names created, renamed or removed in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file (0600), fsync, rename. The caller fsyncs
    the directory (once for several files)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def create_file(path: Path, data: bytes = b"") -> None:
    """A new file (0600) holding ``data``, fsynced."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, data)
        if data:
            os.fsync(fd)
    finally:
        os.close(fd)


def same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is still the file at ``path`` (not removed or replaced)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)
