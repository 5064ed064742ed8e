"""Checkpoint stores, one module each; :func:`open_store` picks one by URL scheme.

Each store's driver is imported only in its own module, and only when that store is
used: ``import nestegg`` never imports psycopg or redis.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import DEFAULT_DB_NAME, DEFAULT_HOME, HOME_ENV
from nestegg.errors import ConfigurationError, MissingDependencyError

# scheme -> (module, class, extra that installs its driver)
_SCHEMES: dict[str, tuple[str, str, str | None]] = {
    "memory": ("nestegg.checkpoint.stores.memory", "MemoryCheckpointStorage", None),
    "file": ("nestegg.checkpoint.stores.file", "FileCheckpointStorage", None),
    "sqlite": ("nestegg.checkpoint.stores.sqlite", "SQLiteCheckpointStorage", None),
    "postgresql": ("nestegg.checkpoint.stores.postgres", "PostgresCheckpointStorage", "postgres"),
    "postgres": ("nestegg.checkpoint.stores.postgres", "PostgresCheckpointStorage", "postgres"),
    "redis": ("nestegg.checkpoint.stores.redis", "RedisCheckpointStorage", "redis"),
    "rediss": ("nestegg.checkpoint.stores.redis", "RedisCheckpointStorage", "redis"),
}


def store_class(scheme: str) -> Any:
    """The store class for a URL scheme, imported lazily.

    Raises:
        ConfigurationError: an unknown scheme.
        MissingDependencyError: the store's driver is not installed (names the extra).
    """
    try:
        module_name, class_name, extra = _SCHEMES[scheme]
    except KeyError:
        known = ", ".join(sorted(_SCHEMES))
        raise ConfigurationError(f"unknown store scheme {scheme!r}; known: {known}") from None
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if extra is None:
            raise
        raise MissingDependencyError(
            f"the {scheme} store needs its driver ({exc.name}): pip install 'nestegg[{extra}]'"
        ) from exc
    return getattr(module, class_name)


def open_store(url: str) -> CheckpointStorage:
    """A store for ``url``: ``memory://``, ``file:///dir``, ``sqlite:///file.db``,
    ``postgresql://…`` or ``redis://…``.

    Example:
        >>> store = open_store("sqlite:///runs.db")
    """
    scheme = urlsplit(url).scheme
    cls = store_class(scheme)
    store: CheckpointStorage = cls.from_url(url)
    return store


def default_home() -> Path:
    """``$NESTEGG_HOME``, else ``~/.nestegg``, created with mode 0700."""
    home = Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser()
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    return home


def default_store() -> CheckpointStorage:
    """The embedded default store: SQLite at ``$NESTEGG_HOME/nestegg.db``."""
    cls = store_class("sqlite")
    store: CheckpointStorage = cls(default_home() / DEFAULT_DB_NAME)
    return store


__all__ = ["CheckpointStorage", "default_home", "default_store", "open_store", "store_class"]


if TYPE_CHECKING:  # mypy proves that every store fills the contract (and its capabilities)
    from nestegg.checkpoint.stores.base import DroppableStore
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
