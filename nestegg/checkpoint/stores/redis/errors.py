"""How redis-py's errors become nestegg's: one table keyed on redis-py's exception classes,
and the one context manager the store wraps its calls in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# The driver: a missing one becomes MissingDependencyError in stores/registry.py.
import redis.exceptions as redis_errors

from nestegg.errors import ConfigurationError, StorageError, StorageUnavailableError

BY_CLASS: tuple[tuple[type[Exception], type[StorageError]], ...] = (
    (redis_errors.ConnectionError, StorageUnavailableError),  # refused, lost, still loading
    (redis_errors.TimeoutError, StorageUnavailableError),  # no answer in time
    (redis_errors.RedisError, StorageError),  # an error reply, a bad response, ...
)
"""redis-py exception class -> nestegg error, first match."""


def error_class(exc: redis_errors.RedisError) -> type[StorageError]:
    """The nestegg error ``exc`` becomes, by :data:`BY_CLASS`."""
    return next(nestegg for driver, nestegg in BY_CLASS if isinstance(exc, driver))


def nestegg_error(exc: redis_errors.RedisError) -> StorageError | ConfigurationError:
    """The nestegg error for ``exc``, redis-py's reason in its text (a URL's database the
    server does not have: ConfigurationError, as the URL is what is wrong)."""
    if isinstance(exc, redis_errors.ResponseError) and "DB index is out of range" in str(exc):
        return ConfigurationError(
            f"the Redis server has no such database ({exc}): check the number at the end of "
            "the store URL (redis://host:6379/0; the server's `databases` setting, 16 by "
            "default, is how many it has)"
        )
    cls = error_class(exc)
    if cls is StorageUnavailableError:
        return StorageUnavailableError(f"Redis is unavailable: {exc}")
    return cls(f"Redis failed: {exc}")


@contextmanager
def driver_errors() -> Iterator[None]:
    """The one place where redis-py's exceptions become nestegg's."""
    try:
        yield
    except redis_errors.RedisError as exc:
        raise nestegg_error(exc) from exc


__all__ = ["BY_CLASS", "driver_errors", "error_class", "nestegg_error"]
