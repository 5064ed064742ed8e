"""How sqlite3's errors become nestegg's: one table keyed on SQLite's result codes, one on
sqlite3's error classes, never on message text.

An error SQLite reports carries its result code (``sqlite3.Error.sqlite_errorcode``,
Python 3.11); :data:`BY_CODE` decides it by the primary code (the low byte, so
``SQLITE_IOERR_SHORT_READ`` is ``SQLITE_IOERR``). An error without one (sqlite3's own
misuse errors, such as a closed connection) or with a code the table does not name is
decided by its class in :data:`BY_CLASS`. A file-system failure before SQLite is reached
(``OSError``) leaves the database unavailable.
"""

from __future__ import annotations

import sqlite3

from nestegg.constants import SQLITE_BUSY_TIMEOUT_MS
from nestegg.errors import StorageError, StorageUnavailableError

LOCKED = (
    "the SQLite database {path} stayed locked by another connection for more than "
    f"{SQLITE_BUSY_TIMEOUT_MS} ms ({{reason}})"
)
UNAVAILABLE = "the SQLite database {path} cannot be used: {reason}"
NOT_USABLE = "the SQLite store {path} is not usable: {reason}"
FAILED = "the SQLite database {path} failed: {reason}"

Mapping = tuple[type[StorageError], str]
"""A nestegg error class and its message, formatted with ``path`` and ``reason``."""

BY_CODE: dict[int, Mapping] = {
    sqlite3.SQLITE_BUSY: (StorageError, LOCKED),  # another connection holds the write lock
    sqlite3.SQLITE_LOCKED: (StorageError, LOCKED),  # a table locked within the connection
    sqlite3.SQLITE_CANTOPEN: (StorageUnavailableError, UNAVAILABLE),  # no such dir, a dir
    sqlite3.SQLITE_IOERR: (StorageUnavailableError, UNAVAILABLE),  # disk I/O
    sqlite3.SQLITE_PERM: (StorageUnavailableError, UNAVAILABLE),  # access denied
    sqlite3.SQLITE_READONLY: (StorageUnavailableError, UNAVAILABLE),  # read-only file, mount
}
"""SQLite primary result code -> nestegg error; other codes (corrupt, not a database,
constraint, ...) are decided by :data:`BY_CLASS`."""

BY_CLASS: tuple[tuple[type[Exception], Mapping], ...] = (
    (sqlite3.ProgrammingError, (StorageError, NOT_USABLE)),  # closed, used from elsewhere
    (sqlite3.Error, (StorageError, FAILED)),
)
"""sqlite3 error class -> nestegg error, first match, for errors no code decides."""


def primary_code(exc: sqlite3.Error) -> int | None:
    """SQLite's primary result code of ``exc`` (None: sqlite3 raised it without one)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else int(code) & 0xFF


def is_busy(exc: sqlite3.Error) -> bool:
    """Whether ``exc`` says another connection holds a lock (``SQLITE_BUSY``/``_LOCKED``)."""
    return primary_code(exc) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def mapping_of(exc: sqlite3.Error) -> Mapping:
    """The nestegg error class and message ``exc`` becomes, by the tables above."""
    code = primary_code(exc)
    if code is not None and code in BY_CODE:
        return BY_CODE[code]
    return next(mapping for driver, mapping in BY_CLASS if isinstance(exc, driver))


def storage_error(exc: sqlite3.Error | OSError, path: str) -> StorageError:
    """The nestegg error for a driver or file-system failure on the database at ``path``."""
    if isinstance(exc, OSError):
        return StorageUnavailableError(f"cannot open the SQLite database {path}: {exc}")
    cls, message = mapping_of(exc)
    return cls(message.format(path=path, reason=exc))


__all__ = ["BY_CLASS", "BY_CODE", "is_busy", "mapping_of", "primary_code", "storage_error"]
