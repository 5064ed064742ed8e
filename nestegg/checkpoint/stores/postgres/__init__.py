"""The PostgreSQL store; psycopg is imported only in this package.

``store`` (the store) and ``schema`` (tables, migrations and the SQL of each operation).
"""

from nestegg.checkpoint.stores.postgres.store import (
    PostgresCheckpointStorage,
    validate_table_prefix,
)

__all__ = ["PostgresCheckpointStorage", "validate_table_prefix"]
