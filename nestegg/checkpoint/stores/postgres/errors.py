"""How psycopg's errors become nestegg's: one table, keyed on SQLSTATE classes and on
psycopg's error classes, and the one context manager the store wraps its calls in.

An error the server reports carries a SQLSTATE, and :data:`BY_SQLSTATE` decides it (by
the code's class, its first two characters; anything else the server reports is a
:class:`~nestegg.errors.StorageError`). An error without one (a lost or refused
connection, a pool that hands out no connection in time) is decided by its class in
:data:`BY_CLASS`, except a first connection the server refuses for good (:func:`is_final`,
an allow-list of texts: an unknown role or database, a failed authentication, a password
the server asks for and the URL lacks): that is a
:class:`~nestegg.errors.StoreRefusedError` (a ConfigurationError, as the store's URL is
what is wrong, and a StorageError); and a connection libpq refuses to try with an option's
value it does not take (:func:`bad_option`: ``?sslmode=bogus``): a
:class:`~nestegg.errors.ConfigurationError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
import psycopg

from nestegg.errors import (
    ConfigurationError,
    StorageError,
    StorageUnavailableError,
    StoreRefusedError,
)

BY_SQLSTATE: dict[str, type[StorageError]] = {
    "08": StorageUnavailableError,  # connection exception
    "40": StorageUnavailableError,  # transaction rolled back (serialization, deadlock): again
    "53": StorageUnavailableError,  # insufficient resources: too many connections, disk full
    "57": StorageUnavailableError,  # operator intervention: shutting down, cannot connect now
    "58": StorageUnavailableError,  # system error: I/O
}
"""SQLSTATE class -> nestegg error, for errors the server reports (others: StorageError)."""

BY_CODE: dict[str, type[StorageError]] = {
    "53200": StorageError,  # out of memory: the same statement runs out again
    "57014": StorageError,  # query canceled (statement_timeout): the same statement again
}
"""SQLSTATE codes decided apart from their class: a statement the server gives up on for
its own size or length is no outage, and trying it again gives the same error (a step
whose commit it is fails, rather than being given back again and again)."""

BY_CLASS: tuple[tuple[type[Exception], type[StorageError]], ...] = (
    (psycopg.OperationalError, StorageUnavailableError),  # lost, refused, pool timeout
    (psycopg.Error, StorageError),
)
"""psycopg error class -> nestegg error, first match, for errors without a SQLSTATE."""

FINAL_REFUSALS = (
    "authentication failed",  # password, SASL, peer, ident, SCRAM, certificate
    "does not exist",  # role "x", database "x"
    "no such database",  # PgBouncer's words for a database it does not know
    "no such user",  # PgBouncer's
    "login rejected",  # PgBouncer's
    "permission denied for database",  # CONNECT not granted
    "no pg_hba.conf entry",
    "pg_hba.conf rejects connection",  # a reject line
    "is not permitted to log in",
    "fe_sendauth: no password supplied",  # libpq: the server asks for one the URL lacks
)
"""What a server (or PgBouncer, or libpq itself) says when it refuses a connection for
good, by the store's settings: the same settings will be refused again. Any other refusal
(a server starting up, shutting down or full; PgBouncer that cannot reach its server or
takes no more clients; a connection cut by an administrator) may pass, and is retried."""

PASSING_REFUSALS = ("server login has been failing",)
"""Refusals that may pass although they quote a final one: PgBouncer's cached error of
its own login to the server (``..., cached error: password authentication failed ...``),
which ends when the server lets PgBouncer in again."""


_BAD_VALUES = (
    re.compile(r'invalid integer value "[^"]*" for connection option "(?P<option>\w+)"'),
    re.compile(r'invalid "?(?P<option>\w+)"? value: "'),
    re.compile(r'invalid (?P<option>port) number: "'),
    re.compile(r'invalid value "[^"]*" for (?P<option>minimum|maximum) SSL protocol version'),
    re.compile(r'(?P<option>require_auth) method "'),
    re.compile(r'weak (?P<option>sslmode) "'),
)
"""What libpq says, before it connects, of a connection option's value it does not take
(a value its ``conninfo_to_dict`` lets through): each names the option."""

_SSL_PROTOCOL_BOUNDS = {
    "minimum": "ssl_min_protocol_version",
    "maximum": "ssl_max_protocol_version",
}


def one_line(exc: psycopg.Error) -> str:
    """libpq's message in one line: its lines (``Connection refused`` then ``Is the server
    running ...``, indented) joined with semicolons."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def bad_option(exc: psycopg.Error) -> str | None:
    """The connection option whose value libpq refused in ``exc`` (``sslmode`` for
    ``invalid sslmode value: "bogus"``), else None. libpq's text is all there is: psycopg
    gives the error no SQLSTATE, as for a refused connection."""
    if exc.sqlstate:
        return None
    for pattern in _BAD_VALUES:
        if found := pattern.search(str(exc)):
            option = found["option"]
            return _SSL_PROTOCOL_BOUNDS.get(option, option)
    return None


def error_class(exc: psycopg.Error) -> type[StorageError]:
    """The nestegg error ``exc`` becomes, by the tables above."""
    if exc.sqlstate:
        found = BY_CODE.get(exc.sqlstate) or BY_SQLSTATE.get(exc.sqlstate[:2])
        return found or StorageError
    return next(nestegg for driver, nestegg in BY_CLASS if isinstance(exc, driver))


def nestegg_error(
    exc: psycopg.Error, where: str, *, connecting: bool = False
) -> StorageError | ConfigurationError:
    """The nestegg error for ``exc`` on the server ``where`` (its URL without the
    password), psycopg's reason in its text; ``connecting``: ``exc`` refused the store's
    first connection (:func:`~nestegg.checkpoint.stores.postgres.connection.probe`), where
    a refusal for good (:func:`is_final`) is a StoreRefusedError. An error inside a session
    goes by the tables alone, whatever its text says."""
    reason = one_line(exc)
    if option := bad_option(exc):
        return ConfigurationError(
            f"PostgreSQL store URL {where!r}: libpq does not take the value of the connection "
            f"option {option!r}: {reason}"
        )
    if connecting and is_final(exc):
        return StoreRefusedError(
            f"PostgreSQL at {where} refused the store's settings: {reason} (check the user, "
            "password and database of the store URL)"
        )
    cls = error_class(exc)
    if cls is StorageUnavailableError:
        return StorageUnavailableError(f"PostgreSQL at {where} is unavailable: {reason}")
    return cls(f"PostgreSQL at {where} failed: {reason}")


@contextmanager
def driver_errors(where: str) -> Iterator[None]:
    """The one place where psycopg's exceptions become nestegg's."""
    try:
        yield
    except psycopg.Error as exc:
        raise nestegg_error(exc, where) from exc


def is_final(exc: psycopg.Error) -> bool:
    """Whether a failed connection is refused for good: libpq refused an option's value
    (:func:`bad_option`), or the refusal says one of :data:`FINAL_REFUSALS` (no such role
    or database, a failed authentication, no pg_hba.conf entry, a role that may not log
    in, a password the server asks for and the URL lacks). Read only of a connection being
    made: the same words inside a session say something else.

    This reads libpq's message: psycopg gives a refused connection no SQLSTATE (its
    ``sqlstate`` and ``diag`` are empty; psycopg 3.3), so there is no code to key on.
    """
    if exc.sqlstate:
        return False
    text = str(exc)
    if bad_option(exc) is not None:
        return True
    if any(words in text for words in PASSING_REFUSALS):
        return False
    return any(words in text for words in FINAL_REFUSALS)


__all__ = [
    "BY_CLASS",
    "BY_CODE",
    "BY_SQLSTATE",
    "FINAL_REFUSALS",
    "PASSING_REFUSALS",
    "bad_option",
    "driver_errors",
    "error_class",
    "is_final",
    "nestegg_error",
]
