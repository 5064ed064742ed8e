"""Fixtures for the command line tests: a runner, and stores filled by real runs.

``filled`` yields a store URL (a SQLite file or a file directory; ``filled_any`` also
PostgreSQL in a database of its own and Redis in database 13, with run ids unique to the test
and deleted afterwards, when they are reachable) holding three runs of the
``cli-test`` pipeline made by a real checkpointed Clutch: one completed, one failed and
one interrupted (failed, then claimed by an owner process that no longer exists).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.ownership import host_id
from nestegg.checkpoint.records import Owner
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.sqlite.schema import SEQ_SPAN
from nestegg.cli import app
from nestegg.constants import HOME_ENV, STORE_ENV
from nestegg.testing import StoreSite
from tests.cli.pipeline_app import FAIL_ENV, KILL_ENV, POLICY, REFUSE_ENV, build
from tests.registry import store_target

GONE_PID = 99_999_999
"""Above any pid_max: no process has it."""
REDIS_CLI_DB = 13
LOCAL_KINDS = ("sqlite", "file")
ALL_KINDS = (*LOCAL_KINDS, "postgres", "redis")


@dataclass(frozen=True)
class Filled:
    """A store URL and the ids of the runs in it."""

    url: str
    ok: str
    bad: str
    gone: str


class Cli:
    """Invokes the nestegg command in-process with typer's runner."""

    def __init__(self, home: Path) -> None:
        self.runner = CliRunner()
        self.env = {
            HOME_ENV: str(home),
            STORE_ENV: None,
            FAIL_ENV: None,
            KILL_ENV: None,
            REFUSE_ENV: None,
        }

    def __call__(self, *args: str, input: str | None = None, **env: str | None) -> Result:
        return self.runner.invoke(app, list(args), input=input, env={**self.env, **env})


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """The command, with NESTEGG_HOME in a temp dir and no NESTEGG_STORE."""
    return Cli(tmp_path / "home")


async def fill(url: str, suffix: str = "", opened: CheckpointStorage | None = None) -> Filled:
    """Three runs of the test pipeline in the store at ``url`` (or in ``opened``)."""
    filled = Filled(url, f"ok{suffix}", f"bad{suffix}", f"gone{suffix}")
    store = opened or open_store(url)
    try:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
        await clutch.run({"name": "Acme"}, run_id=filled.ok)
        os.environ[FAIL_ENV] = "1"
        try:
            for run_id in (filled.bad, filled.gone):
                with pytest.raises(RuntimeError, match="enrich broke"):
                    await clutch.run({"name": run_id}, run_id=run_id)
        finally:
            del os.environ[FAIL_ENV]
        await leave_interrupted(store, filled.gone)
    finally:
        await store.close()
    return filled


async def leave_interrupted(store: CheckpointStorage, run_id: str) -> None:
    """Make run ``run_id`` interrupted: claimed by a process of this host that is gone."""
    run = await store.get_run(run_id)
    assert run is not None
    now = time.time()
    dead = Owner(host=host_id(), pid=GONE_PID, started="gone")
    await store.claim_run(run_id, run.fence, dead, now + 30, now, reopen=True)


def _postgres_database(pg_url: str) -> Iterator[str]:
    import psycopg

    name = f"nestegg_cli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    base, _, _ = pg_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def _redis_database(redis_url: str) -> Iterator[str]:
    base, _, _ = redis_url.rpartition("/")
    yield f"{base}/{REDIS_CLI_DB}"


async def delete_runs(url: str, run_ids: tuple[str, ...]) -> None:
    store = open_store(url)
    try:
        for run_id in run_ids:
            await store.delete_run(run_id)
    finally:
        await store.close()


async def queue(url: str, run_id: str) -> None:
    """Store a run for workers that none took (as a caller on workers stores it)."""
    store = open_store(url)
    try:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
        await clutch.checkpointed_runs().create_queued({"name": "Queued"}, run_id)
    finally:
        await store.close()


def store_url_for(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, isolated store of ``kind`` as a URL: an embedded store where
    tests/registry.py puts it; a server store in a database of its own (a command cannot
    name a table or key prefix)."""
    if kind in LOCAL_KINDS:
        yield store_target(kind, StoreSite(tmp_path, "", request)).url
    elif kind == "postgres":
        yield from _postgres_database(request.getfixturevalue("pg_url"))
    else:
        yield from _redis_database(request.getfixturevalue("redis_url"))


@pytest.fixture(params=LOCAL_KINDS)
def local_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty SQLite or file store."""
    yield from store_url_for(request.param, request, tmp_path)


@pytest.fixture(params=ALL_KINDS)
def any_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty store of every kind (server kinds skip when unreachable)."""
    yield from store_url_for(request.param, request, tmp_path)


@pytest.fixture
def filled(local_url: str) -> Filled:
    """A SQLite or file store with a completed, a failed and an interrupted run."""
    return asyncio.run(fill(local_url))


@pytest.fixture
def filled_any(any_url: str) -> Iterator[Filled]:
    """Every kind of store with a completed, a failed and an interrupted run (ids unique to
    the test; deleted afterwards)."""
    filled = asyncio.run(fill(any_url, f"-{uuid.uuid4().hex[:8]}"))
    yield filled
    asyncio.run(delete_runs(any_url, (filled.ok, filled.bad, filled.gone)))


def damage_newest_event_batch(url: str, run_id: str, damage: Callable[[bytes], bytes]) -> None:
    """Change the body of the run's newest event batch in the SQLite store at ``url``."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        (base,) = conn.execute("SELECT run_key FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        key, body = conn.execute(
            "SELECT batch_key, body FROM event_batches WHERE batch_key > ? AND batch_key < ? "
            "ORDER BY batch_key DESC LIMIT 1",
            (base * SEQ_SPAN, (base + 1) * SEQ_SPAN),
        ).fetchone()
        conn.execute("UPDATE event_batches SET body = ? WHERE batch_key = ?", (damage(body), key))


def tear(body: bytes) -> bytes:
    """A batch body cut short (for :func:`damage_newest_event_batch`): the log is torn."""
    return body[: len(body) // 2]


def alter(body: bytes) -> bytes:
    """A batch body whose last byte is changed (for :func:`damage_newest_event_batch`): the
    log reads, its last event's body does not (altered, it is refused as torn)."""
    return body[:-1] + bytes([body[-1] ^ 0x01])


def stored_as_is(url: str, run_id: str) -> list[list[Any]]:
    """The rows the SQLite store at ``url`` holds of the run: its record, signals,
    checkpoints and event batches (as stored: a torn log cannot be read past its damage)."""
    with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
        (base,) = conn.execute("SELECT run_key FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        batches = "SELECT * FROM event_batches WHERE batch_key > ? AND batch_key < ?"
        return [
            conn.execute(f"SELECT * FROM {table} WHERE run_id = ?", (run_id,)).fetchall()
            for table in ("runs", "signals", "checkpoints")
        ] + [conn.execute(batches, (base * SEQ_SPAN, (base + 1) * SEQ_SPAN)).fetchall()]


def leave_waiting(url: str, run_id: str) -> None:
    """Store a run of the waiting pipeline at ``url`` that waits for its signal."""
    from tests.ui.pipelines import start_waiting

    async def wait() -> None:
        store = open_store(url)
        try:
            await start_waiting(store, run_id, nap=False)
        finally:
            await store.close()

    asyncio.run(wait())


def leave_torn(url: str, torn: str, *whole: str) -> None:
    """Store runs of the waiting pipeline at ``url`` that wait for their signal: ``torn``
    with its event log torn (its newest batch cut short), the ``whole`` ones as they are."""
    for run_id in (torn, *whole):
        leave_waiting(url, run_id)
    damage_newest_event_batch(url, torn, tear)


def json_of(result: Result) -> Any:
    """The JSON a command printed on stdout (asserting it succeeded)."""
    import orjson

    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return orjson.loads(result.stdout)
