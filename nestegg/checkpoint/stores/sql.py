"""One name for the SQL stores: :func:`SQLCheckpointStorage` picks PostgreSQL or SQLite by URL."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.registry import BY_NAME, store_class
from nestegg.constants import DEFAULT_TABLE_PREFIX
from nestegg.errors import ConfigurationError

_POSTGRES_SCHEMES = BY_NAME["PostgresCheckpointStorage"].schemes


def SQLCheckpointStorage(  # named like the store classes it stands for
    url: str,
    *,
    table_prefix: str = DEFAULT_TABLE_PREFIX,
    pool: Any = None,
    **options: Any,
) -> CheckpointStorage:
    """A SQL store for ``url``: PostgreSQL for ``postgresql://…``, SQLite for
    ``sqlite:///path``.

    Args:
        url: ``postgresql://user@host:5432/db`` (psycopg 3 with a connection pool) or
            ``sqlite:///relative.db`` / ``sqlite:////absolute.db``.
        table_prefix: prefix of the PostgreSQL tables (an SQL identifier).
        pool: an open ``psycopg_pool.AsyncConnectionPool`` to use instead of building
            one from ``url`` (PostgreSQL only).
        **options: further PostgreSQL options (``min_size``, ``max_size``,
            ``prepare_threshold``, ``connect_timeout``, ``retries``), see
            :class:`~nestegg.checkpoint.stores.postgres.PostgresCheckpointStorage`.

    Returns:
        A PostgresCheckpointStorage or a SQLiteCheckpointStorage.

    Raises:
        ConfigurationError: another scheme, or PostgreSQL options with a SQLite URL.
        MissingDependencyError: a PostgreSQL URL without psycopg installed.
        InvalidIdentifierError: a bad ``table_prefix``.

    Example:
        >>> store = SQLCheckpointStorage("postgresql://app@db/app", max_size=20)
        >>> local = SQLCheckpointStorage("sqlite:///runs.db")
    """
    scheme = urlsplit(url).scheme
    if scheme in _POSTGRES_SCHEMES:
        postgres = store_class(scheme)
        store: CheckpointStorage = postgres(url, pool=pool, table_prefix=table_prefix, **options)
        return store
    if scheme == "sqlite":
        extra = sorted(options) + (["pool"] if pool is not None else [])
        if table_prefix != DEFAULT_TABLE_PREFIX:
            extra.append("table_prefix")
        if extra:
            raise ConfigurationError(
                f"SQLCheckpointStorage: {', '.join(extra)} apply to PostgreSQL only, "
                f"not to the SQLite URL {url!r}"
            )
        from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

        return SQLiteCheckpointStorage.from_url(url)
    raise ConfigurationError(
        f"SQLCheckpointStorage needs a postgresql:// or sqlite:/// URL, got {url!r}"
    )


__all__ = ["SQLCheckpointStorage"]
