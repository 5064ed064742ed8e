"""The PostgreSQL store; psycopg is imported only in this package.

``store`` (the store), ``batches`` (commits, run reads, creations and claims, alone and
grouped), ``reads`` (runs listed, a run's rows read), ``connection`` (the pool and a
query's deadline), ``schema`` (tables and the SQL of each operation), ``migrations`` (the
schema's versions), ``threads`` (LangGraph thread rows) and ``errors`` (psycopg's errors
by SQLSTATE class and error class).
"""

from nestegg.checkpoint.stores.postgres.store import (
    PostgresCheckpointStorage,
    validate_table_prefix,
)

__all__ = ["PostgresCheckpointStorage", "validate_table_prefix"]
