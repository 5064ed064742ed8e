"""Migrations are history: each version's statements (and the source of a migration step
written in Python) are written out literally and never edited. A new schema version
appends an entry here and there."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence

import pytest

from nestegg.checkpoint.stores.postgres import schema as postgres_schema
from nestegg.checkpoint.stores.sqlite import schema as sqlite_schema

FROZEN = {
    "sqlite": ["ed898c064769e0c6", "87cd082cecc764a2", "213b91dfb323241c", "435201091c424438"],
    "postgres": ["3ec2799861ff4318", "44a93f1cb98b2c45", "e345a47bf71da8b5", "8983b2c4d50c754c"],
}
MIGRATIONS = {"sqlite": sqlite_schema.MIGRATIONS, "postgres": postgres_schema.MIGRATIONS}


def digest(version: Sequence[str | Callable[..., object]]) -> str:
    text = "\n".join(step if isinstance(step, str) else inspect.getsource(step) for step in version)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("store", sorted(FROZEN))
def test_no_migration_was_edited(store: str) -> None:
    assert [digest(version) for version in MIGRATIONS[store]] == FROZEN[store]
