"""How redis-py's errors become nestegg's: one table keyed on redis-py's exception classes,
the refusals of the store's settings, the one context manager the store wraps its calls
in, and the error replies of scripts sent in a pipeline."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
import redis.exceptions as redis_errors

from nestegg.errors import StorageError, StorageUnavailableError, StoreRefusedError

T = TypeVar("T")

BY_CLASS: tuple[tuple[type[Exception], type[StorageError]], ...] = (
    (redis_errors.ConnectionError, StorageUnavailableError),  # refused, lost, still loading
    (redis_errors.TimeoutError, StorageUnavailableError),  # no answer in time
    (redis_errors.RedisError, StorageError),  # an error reply, a bad response, ...
)
"""redis-py exception class -> nestegg error, first match (after :data:`REFUSALS`)."""

REFUSALS: tuple[type[Exception], ...] = (
    redis_errors.AuthenticationError,  # a user or password the server refuses
    redis_errors.AuthenticationWrongNumberOfArgsError,  # a user name for a server without ACLs
    redis_errors.AuthorizationError,
    redis_errors.NoPermissionError,  # an ACL that denies the user a command or a key
)
"""redis-py exception classes of a server refusing the store's settings: a
StoreRefusedError (a ConfigurationError, as the URL or the server's ACL is what is wrong,
and a StorageError), which retrying will not mend."""


def error_class(exc: redis_errors.RedisError) -> type[StorageError]:
    """The nestegg error ``exc`` becomes, by :data:`BY_CLASS`, when it is no refusal."""
    return next(nestegg for driver, nestegg in BY_CLASS if isinstance(exc, driver))


def refusal(exc: redis_errors.RedisError, where: str | None) -> StoreRefusedError | None:
    """The StoreRefusedError of ``exc`` when the server refuses the store's settings (a
    login, a database it does not have, an ACL), naming the server ``where`` (its URL
    without the password); None for any other error."""
    server = f"Redis at {where}" if where else "the Redis server"
    if isinstance(exc, redis_errors.ResponseError) and "DB index is out of range" in str(exc):
        return StoreRefusedError(
            f"{server} has no such database ({exc}): check the number at the end of the store "
            "URL (redis://host:6379/0; the server's `databases` setting, 16 by default, is "
            "how many it has)"
        )
    if isinstance(exc, REFUSALS):
        return StoreRefusedError(
            f"{server} refused the store's settings: {exc} (check the user and password of "
            "the store URL, and what the server's ACL allows the user)"
        )
    return None


def nestegg_error(exc: redis_errors.RedisError, where: str | None = None) -> StorageError:
    """The nestegg error for ``exc`` on the server ``where`` (its URL without the
    password; None: not known here), redis-py's reason in its text."""
    refused = refusal(exc, where)
    if refused is not None:
        return refused
    server = f"Redis at {where}" if where else "Redis"
    cls = error_class(exc)
    if cls is StorageUnavailableError:
        return StorageUnavailableError(f"{server} is unavailable: {exc}")
    return cls(f"{server} failed: {exc}")


@contextmanager
def driver_errors(where: str | None = None) -> Iterator[None]:
    """The one place where redis-py's exceptions become nestegg's (``where``: the server's
    URL without the password)."""
    try:
        yield
    except redis_errors.RedisError as exc:
        raise nestegg_error(exc, where) from exc


def outcome_of_reply(parse: Callable[[Any], T], reply: Any, where: str | None) -> T | BaseException:
    """What ``parse`` makes of a script's reply in a pipeline, or the error (its own, or
    the reply's, as :func:`error_of_reply` says it)."""
    if isinstance(reply, BaseException):
        return error_of_reply(reply, where)
    try:
        return parse(reply)
    except Exception as error:
        return error


def error_of_reply(error: BaseException, where: str | None) -> BaseException:
    """A reply's error as nestegg's: a driver's error reply mapped as the store's other
    calls map theirs, naming the server ``where`` (its URL without the password)."""
    return nestegg_error(error, where) if isinstance(error, redis_errors.RedisError) else error


__all__ = [
    "BY_CLASS",
    "REFUSALS",
    "driver_errors",
    "error_class",
    "error_of_reply",
    "nestegg_error",
    "outcome_of_reply",
    "refusal",
]
