"""A store nobody closed leaves nothing behind at exit: no task destroyed while pending.

A script runs a pipeline on a store it never closes and exits, once under
``asyncio.run`` and once under ``run_until_complete`` on a loop it leaves open (the
pool of a server store keeps tasks of its own); its stderr must stay empty.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.registry import EMBEDDED_KINDS, SERVER_KINDS
from tests.servers import delete_redis_keys, drop_postgres_tables

STORE_KINDS = EMBEDDED_KINDS + SERVER_KINDS

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from nestegg import Clutch
    from nestegg.checkpoint import CheckpointConfig
    from nestegg.checkpoint.stores.file import FileCheckpointStorage
    from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

    kind, where, prefix, runner = sys.argv[1:]
    if kind == "postgres":
        from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
        store = PostgresCheckpointStorage(where, table_prefix=prefix)
    elif kind == "redis":
        from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
        store = RedisCheckpointStorage(where, prefix=prefix)
    else:
        store = {"memory": lambda: MemoryCheckpointStorage(),
                 "file": lambda: FileCheckpointStorage(where),
                 "sqlite": lambda: SQLiteCheckpointStorage(where + "/n.db")}[kind]()
    clutch = Clutch("unclosed", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def first(data: dict) -> dict:
        await asyncio.sleep(0.01)
        return {**data, "first": True}

    @clutch.agent()
    async def second(data: dict) -> dict:
        return {**data, "second": True}

    if runner == "asyncio.run":
        print(asyncio.run(clutch.run({"n": 1})))
    else:
        print(asyncio.new_event_loop().run_until_complete(clutch.run({"n": 1})))
    """
)


@pytest.mark.parametrize("runner", ["asyncio.run", "run_until_complete"])
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(kind, marks=[pytest.mark.server] if kind in SERVER_KINDS else [])
        for kind in STORE_KINDS
    ],
)
async def test_a_store_left_open_leaves_no_pending_task_at_exit(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str, runner: str
) -> None:
    where = str(tmp_path)
    if kind == "postgres":
        where, prefix = request.getfixturevalue("pg_url"), f"t{uuid.uuid4().hex[:12]}_"
    elif kind == "redis":
        where, prefix = request.getfixturevalue("redis_url"), f"nestegg-test:{uuid.uuid4().hex}:"
    else:
        prefix = ""
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, kind, where, prefix, runner],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if kind == "postgres":
            await drop_postgres_tables(where, prefix)
        elif kind == "redis":
            await delete_redis_keys(where, prefix)
    assert done.returncode == 0, done.stderr
    assert "'first': True, 'second': True" in done.stdout
    assert done.stderr == ""
