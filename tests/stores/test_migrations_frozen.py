"""Migrations are history: each version's statements (and the source of a migration step
written in Python) are written out literally and never edited. A new schema version
appends an entry here and there."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from types import CodeType

import pytest

from nestegg.checkpoint.stores.postgres import migrations as postgres_migrations
from nestegg.checkpoint.stores.sqlite import schema as sqlite_schema

FROZEN = {
    "sqlite": [
        "ed898c064769e0c6",
        "06133cadbac98471",
        "213b91dfb323241c",
        "574577e21c614609",
        "435201091c424438",
        "ef488801f59adf1b",
        "45932a470a6297e0",
    ],
    "postgres": [
        "3ec2799861ff4318",
        "44a93f1cb98b2c45",
        "e345a47bf71da8b5",
        "2d8d2ae0159d25a4",
        "8983b2c4d50c754c",
        "221827f7bb3b99df",
        "d02c5d485ed01f48",
    ],
}
MIGRATIONS = {"sqlite": sqlite_schema.MIGRATIONS, "postgres": postgres_migrations.MIGRATIONS}


def digest(version: Sequence[str | Callable[..., object]]) -> str:
    text = "\n".join(step if isinstance(step, str) else inspect.getsource(step) for step in version)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("store", sorted(FROZEN))
def test_no_migration_was_edited(store: str) -> None:
    assert [digest(version) for version in MIGRATIONS[store]] == FROZEN[store]


def test_a_postgres_migration_names_its_tables_in_its_own_text() -> None:
    # Each placeholder is the name itself, so renaming a table today cannot change history.
    placed = {
        name
        for version in postgres_migrations.MIGRATIONS
        for s in version
        for name in postgres_migrations.migration_names(s)
    }
    assert placed == {
        "checkpoints",
        "checkpoints_run_idx",
        "commit",
        "commit_many",
        "events",
        "journal",
        "lg_rows",
        "lg_threads",
        "runs",
        "runs_parent_idx",
        "runs_pipeline_idx",
        "runs_status_idx",
        "signals",
        "steps",
    }


def _names(code: CodeType) -> set[str]:
    inner = [c for c in code.co_consts if isinstance(c, CodeType)]
    return set(code.co_names).union(*map(_names, inner))


def test_the_sqlite_migration_steps_written_in_python_use_nothing_of_today() -> None:
    # No constant, query or encoder of today's module: only the standard library.
    todays = set(vars(sqlite_schema)) - {"struct"}
    for version in sqlite_schema.MIGRATIONS:
        for step in version:
            if not isinstance(step, str):
                assert not _names(step.__code__) & todays
