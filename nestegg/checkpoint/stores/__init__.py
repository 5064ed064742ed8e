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
from urllib.parse import unquote, urlsplit

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.registry import store_class
from nestegg.constants import DEFAULT_DB_NAME, DEFAULT_HOME, HOME_ENV
from nestegg.errors import ConfigurationError, StorageUnavailableError
from nestegg.urls import host_problem, without_password

PENDING = "max_pending_commits"

URL_OPTIONS = {
    "sqlite": (PENDING,),
    "postgresql": ("table_prefix", PENDING),
    "postgres": ("table_prefix", PENDING),
    "redis": ("prefix", PENDING),
    "rediss": ("prefix", PENDING),
}
"""The store options a URL may carry in its query, by scheme (``?table_prefix=app_``,
``?max_pending_commits=64``), so that a command reaches a store built with a prefix of its
own, or holds its steps back as the constructor's option does."""

READ_ONLY_SCHEMES = frozenset({"sqlite", "postgresql", "postgres", "redis", "rediss"})
"""The schemes of the stores that take ``read_only``, which :func:`open_store` passes on."""

NO_SCHEME = "it has no scheme (sqlite:///file.db, file:///dir, postgresql://..., redis://...)"
"""Why a string with no scheme (``runs.db``, PostgreSQL's ``host=db dbname=app``) names no
store."""


def open_store(url: str, *, read_only: bool = False) -> CheckpointStorage:
    """A store for ``url``: ``memory://``, ``file:///dir``, ``sqlite:///file.db``,
    ``postgresql://…`` or ``redis://…``; a PostgreSQL URL may end in
    ``?table_prefix=app_`` and a Redis URL in ``?prefix=app:``, and a SQLite, PostgreSQL
    or Redis URL in ``?max_pending_commits=64`` (the constructor's options).
    ``read_only`` opens a SQLite, PostgreSQL or Redis store for a reader (their
    ``read_only`` option).

    Raises:
        ConfigurationError: no string, no scheme or an unknown one, or a URL whose host or
            port cannot be read (named without its password), or a
            ``max_pending_commits`` that is not a positive integer.
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
    if "#" in url:
        raise ConfigurationError(
            f"store URL {without_password(url)!r}: it has a fragment "
            f"({'#' + url.partition('#')[2]!r}), which no store reads (a '#' in a file name "
            "or a password is written %23)"
        )
    options: dict[str, str | bool | int] = (
        {"read_only": True} if read_only and scheme in READ_ONLY_SCHEMES else {}
    )
    given = url
    for name in URL_OPTIONS.get(scheme, ()):
        url, value = _take_query_option(url, name, given)
        if value is not None:
            options[name] = _pending_limit(given, value) if name == PENDING else value
    store: CheckpointStorage = cls.from_url(url, **options)
    return store


def in_memory(url: str) -> bool:
    """Whether ``url`` names a store kept in memory, in the process that opens it:
    ``memory://``, or SQLite's ``sqlite://`` and ``sqlite:///:memory:``."""
    from nestegg.checkpoint.stores.sqlite.store import MEMORY_PATH

    try:
        parts = urlsplit(url)
    except ValueError:  # a URL no store takes: opening it says why
        return False
    if parts.scheme == "memory":
        return True
    in_sqlite = parts.scheme == "sqlite" and parts.netloc in ("", "localhost")
    return in_sqlite and unquote(parts.path) in ("", f"/{MEMORY_PATH}")


def _pending_limit(url: str, value: str) -> int:
    """``?max_pending_commits=``'s value: a positive integer, as the constructor takes it
    (no limit is the option left out)."""
    if value.isascii() and value.isdigit() and int(value) > 0:
        return int(value)
    raise ConfigurationError(
        f"store URL {without_password(url)!r}: the query option {PENDING} takes a positive "
        f"integer, got {value!r}"
    )


def _take_query_option(url: str, name: str, given: str) -> tuple[str, str | None]:
    """``url`` (which has no fragment) without the query option ``name``, and its value
    (None: not there); the rest kept as written, byte for byte (libpq reads ``+`` as
    itself; ``urlunsplit`` would turn ``sqlite:////abs.db`` into ``sqlite://abs.db``).

    Raises:
        ConfigurationError: the option is there twice (``given``, the URL, named).
    """
    head, _, query = url.partition("?")
    kept, value = [], None
    for pair in query.split("&") if query else []:
        key, _, raw = pair.partition("=")
        if unquote(key) != name:
            kept.append(pair)
        elif value is None:
            value = unquote(raw)
        else:
            raise ConfigurationError(
                f"store URL {without_password(given)!r}: the query option {name} is there "
                "twice: give it once"
            )
    if value is None:
        return url, None
    return head + ("?" + "&".join(kept) if kept else ""), value


def home_path() -> Path:
    """``$NESTEGG_HOME``, else ``~/.nestegg``, without creating it.

    Raises:
        ConfigurationError: it is there and is not a directory (a file), naming it and
            where it came from.
    """
    given = os.environ.get(HOME_ENV)
    home = Path(given or DEFAULT_HOME).expanduser()
    if home.exists() and not home.is_dir():
        named = f"{HOME_ENV} {given!r}" if given else f"{DEFAULT_HOME} ({str(home)!r})"
        what = "a file, not a directory" if home.is_file() else "not a directory"
        raise ConfigurationError(
            f"{named} is {what}: it names the directory the default store keeps its "
            f"database ({DEFAULT_DB_NAME}) in"
        )
    return home


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
        ConfigurationError: the home is a file (:func:`home_path`).
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
    "in_memory",
    "open_store",
    "store_class",
]


if TYPE_CHECKING:  # mypy proves that every store fills the contract (and its capabilities)
    from nestegg.checkpoint.stores.base import BlockHistoryStore, DroppableStore, ForkListing
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
    _STORES_LIST_FORKS: tuple[type[ForkListing], ...] = (
        MemoryCheckpointStorage,
        FileCheckpointStorage,
        SQLiteCheckpointStorage,
        PostgresCheckpointStorage,
        RedisCheckpointStorage,
    )
