"""Fixtures of the crash tests: one isolated store location per test, and a seeded rng.

Embedded stores live in the test's temp dir. Server stores get their own table prefix
(PostgreSQL) or key prefix (Redis), removed after the test; an unreachable server skips
the test with one line (fails under ``CI=true``, see tests/conftest.py).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.crash.harness import CrashReport, StoreTarget, new_rng
from tests.stores.conftest import delete_redis_keys, drop_postgres_tables

EMBEDDED_KINDS = ("file", "sqlite")
SERVER_KINDS = ("postgres", "redis")


def embedded_target(kind: str, tmp_path: Path) -> StoreTarget:
    """A file or SQLite store in ``tmp_path``."""
    if kind == "file":
        return StoreTarget(kind, (tmp_path / "runs").as_uri())
    return StoreTarget(kind, f"sqlite:///{tmp_path / 'runs.db'}")


@pytest.fixture(params=EMBEDDED_KINDS)
def embedded_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    """The file store, then the SQLite store, each in the test's temp dir."""
    return embedded_target(request.param, tmp_path)


@pytest.fixture(params=[pytest.param(kind, marks=pytest.mark.server) for kind in SERVER_KINDS])
async def server_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreTarget]:
    """PostgreSQL under its own table prefix, then Redis under its own key prefix."""
    tag = uuid.uuid4().hex[:10]
    if request.param == "postgres":
        url = request.getfixturevalue("pg_url")
        target = StoreTarget("postgres", url, f"crash_{tag}_")
    else:
        url = request.getfixturevalue("redis_url")
        target = StoreTarget("redis", url, f"nestegg-crash:{tag}:")
    yield target
    if target.kind == "postgres":
        await drop_postgres_tables(url, target.prefix or "")
    else:
        await delete_redis_keys(url, target.prefix or "")


@pytest.fixture
def crash_rng(request: pytest.FixtureRequest) -> tuple[random.Random, CrashReport]:
    """A random generator seeded for this test, and the report that names the seed."""
    return new_rng(request.node.nodeid)
