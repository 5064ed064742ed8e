"""Shared fixtures.

Test servers: PostgreSQL and Redis on 127.0.0.1 (URLs overridable by NESTEGG_TEST_PG_URL
and NESTEGG_TEST_REDIS_URL). A test that needs an unreachable server skips with one line
saying why; under ``CI=true`` it fails instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache

import pytest

import tests.registry  # noqa: F401  (registers the project's stores with nestegg.testing)

PG_URL_ENV = "NESTEGG_TEST_PG_URL"
REDIS_URL_ENV = "NESTEGG_TEST_REDIS_URL"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
SERVER_CONNECT_TIMEOUT_S = 3


def server_missing(reason: str) -> None:
    """Skip the test because a server is missing; fail instead under ``CI=true``."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: servers are required)", pytrace=False)
    pytest.skip(reason)


@cache
def postgres_unreachable(url: str) -> str | None:
    """Why PostgreSQL at ``url`` cannot be used, or None if it answers."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed: pip install 'nestegg[postgres]'"
    try:
        with psycopg.connect(url, connect_timeout=SERVER_CONNECT_TIMEOUT_S) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"PostgreSQL unreachable at {url}: {first_line}"
    return None


@cache
def redis_unreachable(url: str) -> str | None:
    """Why Redis at ``url`` cannot be used, or None if it answers."""
    try:
        import redis
    except ImportError:
        return "redis-py is not installed: pip install 'nestegg[redis]'"
    client = redis.Redis.from_url(url, socket_connect_timeout=SERVER_CONNECT_TIMEOUT_S)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"Redis unreachable at {url}: {exc}"
    finally:
        client.close()
    return None


def reachable_url(env: str, default: str, unreachable: Callable[[str], str | None]) -> str:
    """The test server URL of ``$env`` (else ``default``); skips (fails under CI=true) with
    the reason ``unreachable`` gives when it cannot be reached."""
    url = os.environ.get(env) or default
    reason = unreachable(url)
    if reason:
        server_missing(reason)
    return url


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The test PostgreSQL URL; skips (fails under CI=true) if it cannot be reached."""
    return reachable_url(PG_URL_ENV, DEFAULT_PG_URL, postgres_unreachable)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test Redis URL; skips (fails under CI=true) if it cannot be reached."""
    return reachable_url(REDIS_URL_ENV, DEFAULT_REDIS_URL, redis_unreachable)
