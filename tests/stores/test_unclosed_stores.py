"""A store nobody closed leaves nothing behind at exit: no task destroyed while pending.

A script runs a pipeline on a store it never closes and exits, once under
``asyncio.run`` and once under ``run_until_complete`` on a loop it leaves open (the
pool of a server store keeps tasks of its own); its stderr must stay empty.
"""

from __future__ import annotations

import asyncio
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


CONNECTING_AT_EXIT = textwrap.dedent(
    """
    import asyncio, contextlib, socket, sys, threading
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    host, port, conninfo, prefix = sys.argv[1:]
    hold = threading.Event()  # set: new connections get no answer, as from a slow server

    def pump(source, target):
        with contextlib.suppress(OSError):  # a side closed: the other one ends too
            while data := source.recv(65536):
                target.sendall(data)
            target.shutdown(socket.SHUT_WR)

    def serve(listener):
        held = []
        while True:
            client = listener.accept()[0]
            if hold.is_set():
                held.append(client)
                continue
            server = socket.create_connection((host, int(port)))
            threading.Thread(target=pump, args=(client, server), daemon=True).start()
            threading.Thread(target=pump, args=(server, client), daemon=True).start()

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve, args=(listener,), daemon=True).start()
    store = PostgresCheckpointStorage(
        f"{conninfo} host=127.0.0.1 port={listener.getsockname()[1]}", table_prefix=prefix
    )

    async def main():
        await store.setup()
        hold.set()
        # Two reads at once: the pool opens a second connection, still connecting at the end.
        print(await asyncio.gather(store.list_runs(limit=1), store.list_runs(limit=1)))

    asyncio.run(main())
    """
)


@pytest.mark.server
async def test_asyncio_run_ends_while_the_pool_is_connecting(pg_url: str) -> None:
    """A PostgreSQL pool left open whose worker is connecting when ``asyncio.run`` ends:
    the process exits (it waited forever for that worker), and the pool's warning about
    the cancelled attempt (``error connecting in ...``) is not printed."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    parts = conninfo_to_dict(pg_url)
    host, port = str(parts.pop("host", "localhost")), str(parts.pop("port", 5432))
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    args = [host, port, make_conninfo("", **parts), prefix]
    try:
        done = subprocess.run(
            [sys.executable, "-c", CONNECTING_AT_EXIT, *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the script did not exit within 30 s; stderr: {hung.stderr!r}")
    finally:
        await drop_postgres_tables(pg_url, prefix)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[[], []]\n"
    assert done.stderr == ""


RUN_AT_LOOP_END = textwrap.dedent(
    """
    import asyncio, sys
    from nestegg import Clutch
    from nestegg.checkpoint import CheckpointConfig
    from nestegg.checkpoint.stores import open_store

    url = sys.argv[1]
    store = open_store(url)
    clutch = Clutch("ending", checkpoint=CheckpointConfig(storage=store))

    @clutch.agent()
    async def slow(data: dict) -> dict:
        await asyncio.sleep(60)
        return data

    async def main():
        try:
            await clutch.run({}, run_id="ended", timeout=0.2)
        except TimeoutError:
            print("timed out")
        finally:
            await store.close()  # the run goes on, until asyncio.run cancels it

    asyncio.run(main())

    async def status():
        reader = open_store(url)
        try:
            return (await reader.get_run("ended")).status
        finally:
            await reader.close()

    print(asyncio.run(status()))
    """
)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(kind, marks=[pytest.mark.server] if kind in SERVER_KINDS else [])
        for kind in ("sqlite", *SERVER_KINDS)
    ],
)
async def test_a_run_stored_cancelled_as_asyncio_run_ends_leaves_no_pending_task(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    """A store closed while a run still goes on (a command that ends on Ctrl-C closes it
    first): the run's end, stored as ``asyncio.run`` cancels it, opens the store again, and
    that is closed too (a PostgreSQL pool's tasks were destroyed pending)."""
    url, prefix = f"sqlite:///{tmp_path / 'n.db'}", ""
    if kind == "postgres":
        prefix = f"t{uuid.uuid4().hex[:12]}_"
        url = f"{request.getfixturevalue('pg_url')}?table_prefix={prefix}"
    elif kind == "redis":
        prefix = f"nestegg-test:{uuid.uuid4().hex}:"
        url = f"{request.getfixturevalue('redis_url')}?prefix={prefix}"
    try:
        done = subprocess.run(
            [sys.executable, "-c", RUN_AT_LOOP_END, url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        if kind == "postgres":
            await drop_postgres_tables(request.getfixturevalue("pg_url"), prefix)
        elif kind == "redis":
            await delete_redis_keys(request.getfixturevalue("redis_url"), prefix)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "timed out\ncancelled\n"
    assert done.stderr == ""


@pytest.mark.server
async def test_a_closed_postgres_store_closes_its_idle_connections(pg_url: str) -> None:
    """``close()`` lets its pool's ``close()`` end: a second cancel of the pool's closer, by
    the generator that closes it at the loop's end, cut it short, leaving the pool's idle
    connections open."""
    from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage

    prefix = f"t{uuid.uuid4().hex[:12]}_"
    store = PostgresCheckpointStorage(pg_url, table_prefix=prefix, min_size=2)
    try:
        await store.setup()
        pool = store._pool
        async with pool.connection() as first, pool.connection() as second:
            idle = [first, second]  # back in the pool, idle, once the block ends
        await store.close()
        await asyncio.sleep(0.05)  # the generator's finalization runs meanwhile
        assert [connection.closed for connection in idle] == [True, True]
    finally:
        await drop_postgres_tables(pg_url, prefix)
