"""Checkpointing: configuration, the store contract, the stores and what reads back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nestegg.checkpoint.config import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.views import CheckpointInfo, CheckpointState, Event, RunInfo

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.file import FileCheckpointStorage
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

_LAZY = {
    "FileCheckpointStorage": "nestegg.checkpoint.stores.file",
    "SQLiteCheckpointStorage": "nestegg.checkpoint.stores.sqlite",
    "SQLCheckpointStorage": "nestegg.checkpoint.stores.sql",
    "PostgresCheckpointStorage": "nestegg.checkpoint.stores.postgres",
    "RedisCheckpointStorage": "nestegg.checkpoint.stores.redis",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'nestegg.checkpoint' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


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
