"""Checkpoint stores, a package each (``memory`` is one module); :func:`open_store` picks
one by URL scheme.

Each store's driver is imported only in its own package, and only when that store is
used: ``import nestegg`` never imports psycopg or redis. Which package holds which store is
said once, in :mod:`nestegg.checkpoint.stores.registry`.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.registry import store_class
from nestegg.constants import DEFAULT_DB_NAME, DEFAULT_HOME, HOME_ENV
from nestegg.errors import ConfigurationError, StorageUnavailableError
from nestegg.urls import host_problem, without_password

URL_OPTIONS = {
    "postgresql": "table_prefix",
    "postgres": "table_prefix",
    "redis": "prefix",
    "rediss": "prefix",
}
"""The store option a URL may carry in its query, by scheme (``?table_prefix=app_``), so
that a command reaches a store built with a prefix of its own."""

READ_ONLY_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "redis", "rediss"})
"""The schemes of the stores that take ``read_only``, which :func:`open_store` passes on."""

NO_SCHEME = "it has no scheme (sqlite:///file.db, file:///dir, postgresql://..., redis://...)"
"""Why a string with no scheme (``runs.db``, PostgreSQL's ``host=db dbname=app``) names no
store."""


def open_store(url: str, *, read_only: bool = False) -> CheckpointStorage:
    """A store for ``url``: ``memory://``, ``file:///dir``, ``sqlite:///file.db``,
    ``postgresql://…`` or ``redis://…``; a PostgreSQL URL may end in
    ``?table_prefix=app_`` and a Redis URL in ``?prefix=app:`` (the constructor's option).
    ``read_only`` opens a SQLite, PostgreSQL or Redis store for a reader (their
    ``read_only`` option).

    Raises:
        ConfigurationError: no string, no scheme or an unknown one, or a URL whose host or
            port cannot be read (named without its password).
        MissingDependencyError: the store's driver is not installed (names the extra).

    Example:
        >>> store = open_store("sqlite:///runs.db")
        >>> store = open_store("postgresql://app@db/app?table_prefix=enrich_")
    """
    if not isinstance(url, str):
        hint = " (a path: open_store(f'sqlite:///{path}'))" if isinstance(url, PurePath) else ""
        raise ConfigurationError(f"a store URL is a string, got {url!r}{hint}")
    problem = host_problem(url)
    if problem is not None:
        raise ConfigurationError(f"store URL {without_password(url)!r}: {problem}")
    scheme = urlsplit(url).scheme
    if not scheme:
        raise ConfigurationError(f"store URL {without_password(url)!r}: {NO_SCHEME}")
    cls = store_class(scheme)
    options: dict[str, str | bool] = (
        {"read_only": True} if read_only and scheme in READ_ONLY_SCHEMES else {}
    )
    name = URL_OPTIONS.get(scheme)
    if name is not None:
        url, value = _take_query_option(url, name)
        if value is not None:
            options[name] = value
    store: CheckpointStorage = cls.from_url(url, **options)
    return store


def _take_query_option(url: str, name: str) -> tuple[str, str | None]:
    """``url`` without the query option ``name``, and its value (None: not there); the
    other options kept as written, byte for byte (libpq reads ``+`` as itself)."""
    parts = urlsplit(url)
    kept, value = [], None
    for pair in parts.query.split("&") if parts.query else []:
        key, _, raw = pair.partition("=")
        if unquote(key) == name:
            value = unquote(raw)
        else:
            kept.append(pair)
    if value is None:
        return url, None
    return urlunsplit(parts._replace(query="&".join(kept))), value


def home_path() -> Path:
    """``$NESTEGG_HOME``, else ``~/.nestegg``, without creating it."""
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()


def default_home() -> Path:
    """``$NESTEGG_HOME``, else ``~/.nestegg``, created with mode 0700."""
    home = home_path()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def default_store() -> CheckpointStorage:
    """The embedded default store: SQLite at ``$NESTEGG_HOME/nestegg.db``.

    Raises:
        StorageUnavailableError: the home cannot be created (said as for the database
            through its URL).
    """
    try:
        home = default_home()
    except OSError as error:
        path = home_path() / DEFAULT_DB_NAME
        raise StorageUnavailableError(f"cannot open the SQLite database {path}: {error}") from None
    store: CheckpointStorage = store_class("sqlite")(home / DEFAULT_DB_NAME)
    return store


__all__ = [
    "NO_SCHEME",
    "CheckpointStorage",
    "default_home",
    "default_store",
    "home_path",
    "open_store",
    "store_class",
]


if TYPE_CHECKING:  # mypy proves that every store fills the contract (and its capabilities)
    from nestegg.checkpoint.stores.base import BlockHistoryStore, DroppableStore
    from nestegg.checkpoint.stores.file import FileCheckpointStorage
    from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

    _STORES_FILL_THE_PROTOCOL: tuple[type[CheckpointStorage], ...] = (
        MemoryCheckpointStorage,
        FileCheckpointStorage,
        SQLiteCheckpointStorage,
        PostgresCheckpointStorage,
        RedisCheckpointStorage,
    )
    _SERVER_STORES_DROP: tuple[type[DroppableStore], ...] = (
        PostgresCheckpointStorage,
        RedisCheckpointStorage,
    )
    _BLOCK_HISTORY_STORES: tuple[type[BlockHistoryStore], ...] = (SQLiteCheckpointStorage,)
