"""Fixtures and helpers for the behaviour tests of checkpointed runs.

``checkpoint_store`` yields one set-up store of each embedded kind (memory, SQLite, file),
each in its own temporary location; ``reopen_store`` opens a second handle on the same
data (a process restart); ``tamper`` damages stored records the way a torn write or a
flipped bit would, for each kind of store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch, Strategy
from nestegg.agents import AgentNode
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.sqlite.schema import SEQ_SPAN
from nestegg.constants import DEFAULT_LEASE
from nestegg.testing import StoreSite, registered_store
from tests.registry import FILE_STORE_DIR, SQLITE_FILE

STORE_KINDS = ("memory", "sqlite", "file")


class Flaky(Exception):
    """The failure an agent raises on purpose."""


@pytest.fixture(params=STORE_KINDS)
def store_kind(request: pytest.FixtureRequest) -> str:
    """The kind of store under test."""
    kind: str = request.param
    return kind


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    """The directory the store under test keeps its files in."""
    return tmp_path


@pytest.fixture
async def reopen_store(
    store_kind: str, store_root: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[], Awaitable[CheckpointStorage]]]:
    """Opens (and sets up) further handles on the same stored data (the store registered
    as ``store_kind``, kept under ``store_root``); all closed at the end."""
    site = StoreSite(store_root, uuid.uuid4().hex[:12], request)
    build = registered_store(store_kind).factory(site)
    opened: list[CheckpointStorage] = []

    async def reopen() -> CheckpointStorage:
        store = build()
        opened.append(store)
        await store.setup()
        return store

    yield reopen
    for store in reversed(opened):
        await store.close()


@pytest.fixture
async def checkpoint_store(
    reopen_store: Callable[[], Awaitable[CheckpointStorage]],
) -> CheckpointStorage:
    """One set-up store of each embedded kind, isolated from every other test."""
    return await reopen_store()


# ----------------------------------------------------------------------- pipelines


def config(
    store: CheckpointStorage,
    run_id: str | None = None,
    clock: Callable[[], float] = time.time,
    lease: timedelta = DEFAULT_LEASE,
    **policy: Any,
) -> CheckpointConfig:
    """A CheckpointConfig on ``store`` with a policy made of ``policy``, timed by ``clock``."""
    return CheckpointConfig(
        storage=store,
        policy=CheckpointPolicy(**policy),
        run_id=run_id,
        clock=clock,
        lease=lease,
    )


def replace_agent(clutch: Clutch, agent: Callable[..., Awaitable[Any]]) -> None:
    """Put ``agent`` in the place of the agent of its name, edges kept (a Clutch refuses a
    second function of a name; a test swaps one in)."""
    name = agent.__name__
    clutch._agents[name] = AgentNode(name, agent, clutch._agents[name].edges)


class Pipeline:
    """A Clutch whose agents append their name to the data (a list) and log each call.

    ``fail`` holds the names of agents that raise Flaky when called; ``gates`` maps an
    agent to an Event it waits for before returning.
    """

    def __init__(
        self,
        store: CheckpointStorage,
        names: Iterable[str] = ("a", "b", "c"),
        *,
        name: str = "pipeline",
        strategy: Strategy = Strategy.SEQUENTIAL,
        run_id: str | None = None,
        max_turns: int = 100,
        on_checkpoint: Any = None,
        clock: Callable[[], float] = time.time,
        lease: timedelta = DEFAULT_LEASE,
        **policy: Any,
    ) -> None:
        self.calls: list[str] = []
        self.fail: set[str] = set()
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: dict[str, asyncio.Event] = {}
        self.clutch = Clutch(
            name,
            strategy=strategy,
            max_turns=max_turns,
            checkpoint=config(store, run_id, clock, lease, **policy),
            on_checkpoint=on_checkpoint,
        )
        for agent_name in names:
            self.clutch.agent()(self.appender(agent_name))

    def appender(self, agent_name: str) -> Callable[[list[str]], Awaitable[list[str]]]:
        """An agent named ``agent_name`` that appends its name to the data."""

        async def agent(data: list[str]) -> list[str]:
            self.calls.append(agent_name)
            self.entered.setdefault(agent_name, asyncio.Event()).set()
            gate = self.gates.get(agent_name)
            if gate is not None:
                await gate.wait()
            if agent_name in self.fail:
                raise Flaky(f"{agent_name} failed on purpose")
            return [*data, agent_name]

        agent.__name__ = agent_name
        agent.__qualname__ = agent_name
        return agent

    def gate(self, agent_name: str) -> asyncio.Event:
        """Make ``agent_name`` wait for the returned Event before it returns."""
        event = asyncio.Event()
        self.gates[agent_name] = event
        self.entered[agent_name] = asyncio.Event()
        return event


async def stored_view(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    """Everything stored of a run, as comparable values."""
    run = await store.get_run(run_id)
    return {
        "run": dataclasses.asdict(run) if run is not None else None,
        "steps": await store.load_steps(run_id),
        "checkpoints": await store.list_checkpoints(run_id),
        "events": await store.read_events(run_id),
    }


async def wait_for(event: asyncio.Event, timeout: float = 5.0) -> None:
    """Wait for ``event`` (a test fails rather than hangs)."""
    await asyncio.wait_for(event.wait(), timeout)


TINY = timedelta(milliseconds=50)


# ---------------------------------------------------------------------- tampering


class Tamper:
    """Replaces stored bytes behind the store's back, for each kind of store.

    memory: the record in the store's dicts; sqlite: the column, with an UPDATE through
    sqlite3; file: the bytes of the file that holds the record.
    """

    def __init__(self, kind: str, store: CheckpointStorage, root: Path) -> None:
        self.kind = kind
        self.store = store
        self.root = root

    @property
    def db_path(self) -> Path:
        return self.root / SQLITE_FILE

    @property
    def file_root(self) -> Path:
        return self.root / FILE_STORE_DIR

    def _sqlite(self, sql: str, params: tuple[Any, ...]) -> None:
        with sqlite3.connect(self.db_path) as conn:
            changed = conn.execute(sql, params).rowcount
        assert changed == 1, f"{sql} changed {changed} rows"

    def checkpoint_file(self, checkpoint_id: str) -> Path:
        """The one file of the file store that holds checkpoint ``checkpoint_id``."""
        files = [
            p
            for p in self.file_root.rglob(f"*{checkpoint_id}*")
            if p.is_file() and not p.is_symlink()
        ]
        assert len(files) == 1, f"checkpoint {checkpoint_id}: files {files}"
        return files[0]

    async def stored_checkpoint_bytes(self, checkpoint_id: str) -> bytes:
        """What the store keeps of a checkpoint: its sealed body (file: the whole file)."""
        if self.kind == "file":
            return self.checkpoint_file(checkpoint_id).read_bytes()
        record = await self.store.get_checkpoint(checkpoint_id)
        assert record is not None
        return record.body

    async def damage_checkpoint(self, checkpoint_id: str, damage: Callable[[bytes], bytes]) -> None:
        """Replace what the store keeps of a checkpoint (see stored_checkpoint_bytes) with
        ``damage`` of it."""
        if self.kind == "file":
            path = self.checkpoint_file(checkpoint_id)
            path.write_bytes(damage(path.read_bytes()))
            return
        body = damage(await self.stored_checkpoint_bytes(checkpoint_id))
        if self.kind == "memory":
            memory: Any = self.store
            run_id = memory._checkpoint_runs[checkpoint_id]
            checkpoints = memory._runs[run_id].checkpoints
            checkpoints[checkpoint_id] = checkpoints[checkpoint_id]._replace(body=body)
        else:
            self._sqlite(
                "UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?", (body, checkpoint_id)
            )

    async def checkpoint_body(self, checkpoint_id: str, body: bytes) -> None:
        """Store ``body`` as the sealed body of a checkpoint (file: in place in its file)."""
        if self.kind != "file":
            await self.damage_checkpoint(checkpoint_id, lambda _: body)
            return
        record = await self.store.get_checkpoint(checkpoint_id)
        assert record is not None
        old = record.body
        await self.damage_checkpoint(checkpoint_id, lambda raw: _replace_once(raw, old, body))

    async def step_body(self, run_id: str, seq: int, body: bytes) -> None:
        """Store ``body`` as the sealed body of step ``seq``."""
        if self.kind == "memory":
            memory: Any = self.store
            steps = memory._runs[run_id].steps
            steps[seq] = steps[seq]._replace(body=body)
        elif self.kind == "sqlite":
            self._sqlite(
                "UPDATE steps SET body = ? WHERE step_key = "
                "(SELECT run_key FROM runs WHERE run_id = ?) * ? + ?",
                (body, run_id, SEQ_SPAN, seq),
            )
        else:
            [record] = [s for s in await self.store.load_steps(run_id) if s.seq == seq]
            self._file_replace_in_run(run_id, record.body, body)

    async def run_input(self, run_id: str, body: bytes) -> None:
        """Store ``body`` as the sealed input of a run."""
        if self.kind == "memory":
            memory: Any = self.store
            memory._runs[run_id].run.input = body
        elif self.kind == "sqlite":
            self._sqlite("UPDATE runs SET input = ? WHERE run_id = ?", (body, run_id))
        else:
            run = await self.store.get_run(run_id)
            assert run is not None
            self._file_replace_in_run(run_id, run.input, body)

    def _file_replace_in_run(self, run_id: str, old: bytes, new: bytes) -> None:
        holders = [
            p
            for p in self.file_root.rglob("*")
            if p.is_file() and run_id in p.parts and old in p.read_bytes()
        ]
        assert len(holders) == 1, f"the record is in {holders}"
        holders[0].write_bytes(_replace_once(holders[0].read_bytes(), old, new))


def _replace_once(raw: bytes, old: bytes, new: bytes) -> bytes:
    assert raw.count(old) == 1, "the record is not stored exactly once"
    return raw.replace(old, new)


@pytest.fixture
def tamper(store_kind: str, checkpoint_store: CheckpointStorage, store_root: Path) -> Tamper:
    """Damages records of ``checkpoint_store``."""
    return Tamper(store_kind, checkpoint_store, store_root)
