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

from nestegg.testing import StoreSite
from tests.crash.harness import CrashReport, new_rng
from tests.registry import SERVER_KINDS, StoreTarget, clean_server, store_target

EMBEDDED_KINDS = ("file", "sqlite")


def embedded_target(kind: str, tmp_path: Path) -> StoreTarget:
    """A file or SQLite store in ``tmp_path``."""
    return store_target(kind, StoreSite(tmp_path, "", None))


@pytest.fixture(params=EMBEDDED_KINDS)
def embedded_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreTarget:
    """The file store, then the SQLite store, each in the test's temp dir."""
    return embedded_target(request.param, tmp_path)


@pytest.fixture(params=[pytest.param(kind, marks=pytest.mark.server) for kind in SERVER_KINDS])
async def server_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreTarget]:
    """PostgreSQL under its own table prefix, then Redis under its own key prefix."""
    site = StoreSite(tmp_path, uuid.uuid4().hex[:10], request)
    yield store_target(request.param, site)
    await clean_server(site, request.param)


@pytest.fixture
def crash_rng(request: pytest.FixtureRequest) -> tuple[random.Random, CrashReport]:
    """A random generator seeded for this test, and the report that names the seed."""
    return new_rng(request.node.nodeid)
