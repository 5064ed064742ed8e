"""Every store says the contract's errors in the same words: those of stores/common.py."""

from __future__ import annotations

from typing import Any

import pytest

from nestegg.checkpoint.stores import common
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.file import FileCheckpointStorage
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.errors import ConfigurationError
from nestegg.testing import fixtures
from nestegg.testing.builders import OWNER, T0, create, make_commit, make_run

store_name = fixtures.store_name
store_factory = fixtures.store_factory
store = fixtures.store


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    fixtures.parametrize_stores(metafunc)


async def test_every_store_words_the_contract_errors_alike(store: CheckpointStorage) -> None:
    run = await create(store, fence=3)
    expected = [
        common.run_exists(run.run_id),
        common.run_not_found("run-none"),
        common.run_not_found("run-none"),
        common.run_claimed(run.run_id),
        common.stale_fence(run.run_id, 3, 9),
    ]
    attempts = [
        store.create_run(make_run(run.run_id)),
        store.claim_run("run-none", 0, OWNER, T0, T0),
        store.commit(make_commit(make_run("run-none"))),
        store.claim_run(run.run_id, 7, OWNER, T0, T0),
        store.commit(make_commit(run, fence=9)),
    ]
    for attempt, error in zip(attempts, expected, strict=True):
        with pytest.raises(type(error)) as raised:
            await attempt
        assert str(raised.value) == str(error)
        assert raised.value.args == error.args


@pytest.mark.parametrize(
    ("make", "needs"), [(SQLiteCheckpointStorage, "file"), (FileCheckpointStorage, "directory")]
)
@pytest.mark.parametrize("path", [5, None, b"x.db"])
def test_a_store_path_that_is_not_text_is_refused_naming_the_store(
    make: Any, needs: str, path: Any
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        make(path)
    assert str(refused.value) == (
        f"{make.__name__} needs the path of its {needs} (a str or a pathlib.Path), got {path!r}"
    )


@pytest.mark.parametrize(
    ("make", "needs"),
    [
        (SQLiteCheckpointStorage, "a database file (such as 'nestegg.db')"),
        (FileCheckpointStorage, "a directory ('.' for the current one)"),
    ],
)
def test_an_empty_store_path_is_refused_as_empty(make: Any, needs: str) -> None:
    # SQLite said "path '' is a directory" (Path('') is '.'); the file store used '.'
    with pytest.raises(ConfigurationError) as refused:
        make("")
    assert str(refused.value) == f"{make.__name__} path is empty: it needs the path of {needs}"
