"""Checkpointing: configuration, the store contract, the stores and what reads back.

Each name is imported from its module when first used (``from nestegg.checkpoint import
CheckpointConfig`` does it): a store through :mod:`nestegg.checkpoint.stores.registry`,
which names the extra to install when its driver is missing, the others from the module
listed for them; so that what imports one of its modules (the ``nestegg`` command
reading a SQLite store) does not import the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nestegg.checkpoint.stores.registry import BY_NAME, import_store
from nestegg.lazy_names import imported_name

if TYPE_CHECKING:
    from nestegg.checkpoint.config import CheckpointConfig, CheckpointPolicy
    from nestegg.checkpoint.stores import open_store
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.checkpoint.stores.file import FileCheckpointStorage
    from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
    from nestegg.checkpoint.views import CheckpointInfo, CheckpointState, Event, RunInfo

_HOMES = {
    "CheckpointConfig": "nestegg.checkpoint.config",
    "CheckpointInfo": "nestegg.checkpoint.views",
    "CheckpointPolicy": "nestegg.checkpoint.config",
    "CheckpointState": "nestegg.checkpoint.views",
    "CheckpointStorage": "nestegg.checkpoint.stores.base",
    "Event": "nestegg.checkpoint.views",
    "RunInfo": "nestegg.checkpoint.views",
    "open_store": "nestegg.checkpoint.stores",
}
"""The module each name other than a store's comes from (the imports above, for type
checkers)."""


def __getattr__(name: str) -> Any:
    """A name of this package, imported when first used: a store through the registry
    (stores/registry.py), another from its module (:data:`_HOMES`)."""
    entry = BY_NAME.get(name)
    if entry is not None:
        return import_store(entry)
    return imported_name(globals(), __name__, _HOMES, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES, *BY_NAME})


__all__ = [
    "CheckpointConfig",
    "CheckpointInfo",
    "CheckpointPolicy",
    "CheckpointState",
    "CheckpointStorage",
    "Event",
    "FileCheckpointStorage",
    "MemoryCheckpointStorage",
    "PostgresCheckpointStorage",
    "RedisCheckpointStorage",
    "RunInfo",
    "SQLCheckpointStorage",
    "SQLiteCheckpointStorage",
    "open_store",
]
