"""SQLCheckpointStorage: one name that opens PostgreSQL or SQLite by URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from nestegg.checkpoint import SQLCheckpointStorage, SQLiteCheckpointStorage
from nestegg.errors import ConfigurationError, InvalidIdentifierError


def test_a_postgresql_url_opens_the_postgres_store_with_its_options() -> None:
    pytest.importorskip("psycopg")
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    for url in ("postgresql://app@127.0.0.1/app", "postgres://app@127.0.0.1/app"):
        store = SQLCheckpointStorage(url, table_prefix="app_", max_size=3)
        assert isinstance(store, PostgresCheckpointStorage)
        assert store.table_prefix == "app_"


def test_a_bad_table_prefix_is_refused() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(InvalidIdentifierError):
        SQLCheckpointStorage("postgresql://app@127.0.0.1/app", table_prefix="no-dash")


async def test_a_sqlite_url_opens_the_sqlite_store(tmp_path: Path) -> None:
    store = SQLCheckpointStorage(f"sqlite:///{tmp_path}/runs.db")
    assert isinstance(store, SQLiteCheckpointStorage)
    await store.setup()
    await store.close()
    assert (tmp_path / "runs.db").exists()


@pytest.mark.parametrize("options", [{"table_prefix": "app_"}, {"pool": object()}, {"max_size": 3}])
def test_postgres_options_with_a_sqlite_url_are_a_configuration_error(
    tmp_path: Path, options: dict[str, object]
) -> None:
    with pytest.raises(ConfigurationError, match="PostgreSQL only"):
        SQLCheckpointStorage(f"sqlite:///{tmp_path}/runs.db", **options)


@pytest.mark.parametrize("url", ["redis://127.0.0.1/0", "mysql://x@y/z", "runs.db"])
def test_other_urls_are_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="postgresql:// or sqlite:///"):
        SQLCheckpointStorage(url)
