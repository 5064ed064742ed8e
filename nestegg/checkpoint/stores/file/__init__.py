"""The file store: a directory per run, JSON lines appended durably.

``store`` (the store), ``commit`` (applying a commit to a run's files), ``format`` (the
on-disk layout) and ``io`` (atomic and durable writes).
"""

from nestegg.checkpoint.stores.file.root import storage_error
from nestegg.checkpoint.stores.file.store import FileCheckpointStorage

__all__ = ["FileCheckpointStorage", "storage_error"]
