"""The one registry of stores: which package (or module) holds each store, the URL schemes
it opens and the extra that installs its driver.

``open_store``, ``store_class`` and the lazy names of :mod:`nestegg.checkpoint` are all
built from :data:`STORES`, and :func:`import_store` is the one path that imports a store's
module: a missing driver reaches the user there as ``MissingDependencyError`` naming the
extra to install.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from nestegg.errors import ConfigurationError, MissingDependencyError

_STORES_PACKAGE = "nestegg.checkpoint.stores"


@dataclass(frozen=True)
class StoreEntry:
    """One store: the name it is exported as, its package or module (under
    ``nestegg.checkpoint.stores``), the URL schemes it opens and the extra of its driver."""

    name: str
    module: str
    schemes: tuple[str, ...] = ()
    extra: str | None = None

    @property
    def store(self) -> str:
        """The store's short name: its package (``postgres``) or module (``memory``)."""
        return self.module.partition(".")[0]

    @property
    def module_path(self) -> str:
        """The store's module, dotted from the top."""
        return f"{_STORES_PACKAGE}.{self.module}"


STORES: tuple[StoreEntry, ...] = (
    StoreEntry("MemoryCheckpointStorage", "memory", ("memory",)),
    StoreEntry("FileCheckpointStorage", "file.store", ("file",)),
    StoreEntry("SQLiteCheckpointStorage", "sqlite.store", ("sqlite",)),
    StoreEntry(
        "PostgresCheckpointStorage", "postgres.store", ("postgresql", "postgres"), "postgres"
    ),
    StoreEntry("RedisCheckpointStorage", "redis.store", ("redis", "rediss"), "redis"),
    StoreEntry("SQLCheckpointStorage", "sql"),  # picks PostgreSQL or SQLite by URL
)
"""Every store nestegg ships, by the name it is exported as."""

BY_NAME: dict[str, StoreEntry] = {entry.name: entry for entry in STORES}
BY_SCHEME: dict[str, StoreEntry] = {scheme: entry for entry in STORES for scheme in entry.schemes}


def import_store(entry: StoreEntry) -> Any:
    """The store ``entry`` names (a class, or the ``SQLCheckpointStorage`` function).

    Raises:
        MissingDependencyError: the store's driver is not installed (names the extra).
    """
    try:
        module = importlib.import_module(entry.module_path)
    except ImportError as exc:
        if entry.extra is None or not _outside_nestegg(exc):
            raise
        raise MissingDependencyError(
            f"the {entry.store} store needs its driver ({exc.name}): "
            f"pip install 'nestegg[{entry.extra}]'"
        ) from exc
    return getattr(module, entry.name)


def loaded_class(name: str) -> Any:
    """The store exported as ``name`` if its module has been imported, else None (nothing
    is imported): a store whose module was never imported has no instances, so that
    ``isinstance`` needs none of the others (``nestegg runs`` on SQLite imports no file
    store to tell it is not one)."""
    module = sys.modules.get(BY_NAME[name].module_path)
    return None if module is None else getattr(module, name)


def _outside_nestegg(exc: ImportError) -> bool:
    return not (exc.name or "nestegg").startswith("nestegg")


def store_class(scheme: str) -> Any:
    """The store class for a URL scheme, imported lazily.

    Raises:
        ConfigurationError: an unknown scheme.
        MissingDependencyError: the store's driver is not installed (names the extra).
    """
    try:
        entry = BY_SCHEME[scheme]
    except KeyError:
        known = ", ".join(sorted(BY_SCHEME))
        raise ConfigurationError(f"unknown store scheme {scheme!r}; known: {known}") from None
    return import_store(entry)


__all__ = [
    "BY_NAME",
    "BY_SCHEME",
    "STORES",
    "StoreEntry",
    "import_store",
    "loaded_class",
    "store_class",
]
