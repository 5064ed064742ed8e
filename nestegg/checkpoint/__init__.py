"""Checkpointing: configuration, the store contract, the stores and what reads back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nestegg.checkpoint.config import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.stores.registry import BY_NAME, import_store
from nestegg.checkpoint.views import CheckpointInfo, CheckpointState, Event, RunInfo

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.file import FileCheckpointStorage
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage


def __getattr__(name: str) -> Any:
    """The stores other than memory, imported when first named (stores/registry.py)."""
    entry = BY_NAME.get(name)
    if entry is None:
        raise AttributeError(f"module 'nestegg.checkpoint' has no attribute {name!r}")
    return import_store(entry)


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
