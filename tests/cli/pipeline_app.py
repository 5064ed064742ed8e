"""A small checkpointed pipeline the command line tests resume (``--app``).

``enrich`` fails while the environment variable CLI_TEST_FAIL is ``1``; with
CLI_TEST_KILL=1 it kills its own process (SIGKILL) instead, leaving the run interrupted.
``pipeline`` uses whatever store the command selects; ``gated`` is ``pipeline`` with an
``on_request`` hook that refuses runs while CLI_TEST_REFUSE is ``1``;
``own_store_pipeline`` names its own file store (CLI_TEST_OWN_STORE, a directory),
``own_sqlite_pipeline`` its own SQLite store (CLI_TEST_OWN_STORE, a file),
``own_url_pipeline`` the store at the URL CLI_TEST_OWN_STORE (a server's, with its prefix);
``without_enrich`` builds it with ``enrich`` taken out.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import nestegg
from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.pipeline import RequestHook

FAIL_ENV = "CLI_TEST_FAIL"
KILL_ENV = "CLI_TEST_KILL"
REFUSE_ENV = "CLI_TEST_REFUSE"
OWN_STORE_ENV = "CLI_TEST_OWN_STORE"
PIPELINE = "cli-test"

POLICY = CheckpointPolicy(every_n_steps=1, keep_latest=None)


async def ask_size(name: str) -> str:
    """Stands in for a paid call whose result the journal keeps."""
    return "big"


async def refuse_when_asked(request: dict) -> None:
    """An ``on_request`` hook that refuses runs while CLI_TEST_REFUSE is ``1``."""
    if os.environ.get(REFUSE_ENV) == "1":
        raise PermissionError(f"run {request['clutch_id']} is not allowed")


def build(name: str, config: CheckpointConfig, on_request: RequestHook | None = None) -> Clutch:
    """The three-agent pipeline under ``name`` (with the ``on_request`` hook given)."""
    clutch = Clutch(name, strategy=Strategy.SEQUENTIAL, checkpoint=config, on_request=on_request)

    @clutch.agent()
    async def fetch(data: dict) -> dict:
        return {**data, "page": f"page of {data['name']}"}

    @clutch.agent()
    async def enrich(data: dict) -> dict:
        size = await nestegg.call(ask_size, data["name"])  # journaled
        if os.environ.get(KILL_ENV) == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        if os.environ.get(FAIL_ENV) == "1":
            raise RuntimeError("enrich broke")
        return {**data, "items": [1, 2, 3], "tags": {"size": size}}

    @clutch.agent()
    async def report(data: dict) -> dict:
        return {**data, "report": f"{data['name']}: {len(data['items'])} items"}

    return clutch


pipeline = build(PIPELINE, CheckpointConfig(policy=POLICY))
gated = build(PIPELINE, CheckpointConfig(policy=POLICY), refuse_when_asked)


def without_enrich(store: CheckpointStorage | None, order: list[str] | None = None) -> Clutch:
    """The pipeline ``cli-test`` after its agent ``enrich`` was taken out (``store``:
    None for the command's): a checkpoint that continues with ``enrich`` cannot be
    continued by it. With an ``order=`` that still names ``enrich``, its definition does
    not hold (``Clutch.validate`` fails)."""
    config = CheckpointConfig(storage=store, policy=POLICY)
    clutch = Clutch(PIPELINE, strategy=Strategy.SEQUENTIAL, order=order, checkpoint=config)

    @clutch.agent()
    async def fetch(data: dict) -> dict:
        return {**data, "page": f"page of {data['name']}"}

    @clutch.agent()
    async def report(data: dict) -> dict:
        return {**data, "report": f"{data['name']}: reported"}

    return clutch


def _own_store_pipeline() -> Clutch:
    from nestegg.checkpoint import FileCheckpointStorage

    root = Path(os.environ.get(OWN_STORE_ENV, "own-store"))
    return build("cli-own", CheckpointConfig(storage=FileCheckpointStorage(root), policy=POLICY))


def _own_sqlite_pipeline() -> Clutch:
    from nestegg.checkpoint import SQLiteCheckpointStorage

    path = Path(os.environ.get(OWN_STORE_ENV, "own.db"))
    return build("cli-own", CheckpointConfig(storage=SQLiteCheckpointStorage(path), policy=POLICY))


def _own_url_pipeline() -> Clutch:
    from nestegg.checkpoint.stores import open_store

    store = open_store(os.environ[OWN_STORE_ENV])
    return build("cli-own", CheckpointConfig(storage=store, policy=POLICY))


def __getattr__(name: str) -> Clutch:
    if name == "own_store_pipeline":
        return _own_store_pipeline()
    if name == "own_sqlite_pipeline":
        return _own_sqlite_pipeline()
    if name == "own_url_pipeline":
        return _own_url_pipeline()
    raise AttributeError(name)


not_a_clutch = 42
here = Path("pipelines")  # no Clutch either, of a type outside the builtins
