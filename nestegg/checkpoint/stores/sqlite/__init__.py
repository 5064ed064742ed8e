"""The SQLite store, the embedded default: everything only it uses lives in this package.

``store`` (the store), ``reads`` (runs listed, a run's rows read), ``errors`` (sqlite3's
errors by result code and class), ``connection`` (the writer thread and its lock),
``schema`` (tables and migrations), ``blocks`` (step blocks), ``events`` (packed event
batches) and ``read_only`` (opening a file without writing to it).
"""

from nestegg.checkpoint.stores.sqlite.errors import storage_error
from nestegg.checkpoint.stores.sqlite.store import SQLiteCheckpointStorage

__all__ = ["SQLiteCheckpointStorage", "storage_error"]
