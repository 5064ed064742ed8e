"""``nestegg ui`` as a real process: it starts, serves, refuses what it must, and stops."""

from __future__ import annotations

import asyncio
import re
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.error import URLError
from urllib.request import Request, urlopen

import pytest

from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.sqlite.schema import SCHEMA_VERSION
from nestegg.cli.ui import is_loopback
from nestegg.constants import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE
from nestegg.urls import without_password
from tests.cli.conftest import fill
from tests.cli.pipeline_app import OWN_STORE_ENV
from tests.cli.test_store_opening import (
    pg_database_and_reader,
    pg_schema,
    pg_version_5_for_a_reader,
    sqlite_back_to_version_5,
    sqlite_schema,
)
from tests.servers import delete_redis_keys, drop_postgres_tables
from tests.ui.browser import ROOT, child_env, stop, ui_server
from tests.ui.pipelines import start_waiting

TIMEOUT = 60


def empty_store(tmp_path: Path) -> str:
    """The URL of a SQLite store holding no runs."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"

    async def create() -> None:
        store = open_store(url)
        await store.setup()
        await store.close()

    asyncio.run(create())
    return url


def _ui(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``nestegg ui ARGS`` run to its end (it ends at once when it refuses); ``env`` added
    to its environment."""
    command = [sys.executable, "-m", "nestegg.cli", "ui", *args]
    return subprocess.run(
        command, cwd=ROOT, env=child_env(tmp_path, **env), capture_output=True, text=True,
        timeout=TIMEOUT,
    )  # fmt: skip


def _get(url: str, **headers: str) -> tuple[int, str]:
    with urlopen(Request(url, headers=headers), timeout=10) as response:
        return response.status, response.read().decode()


def test_it_serves_the_store_it_is_given_and_stops_on_sigterm(tmp_path: Path) -> None:
    url = empty_store(tmp_path)
    with ui_server(tmp_path / "home", "--store", url) as server:
        status, page = _get(server.base + "/")
        assert status == 200 and "no runs" in page
        assert server.output[0].startswith(f"nestegg ui: {server.base}/ (store: {url})")
        assert not any("token" in line for line in server.output)  # read-only: no token
        code = stop(server.process)
    assert code in (0, -15)  # uvicorn ends on SIGTERM after shutting down


@pytest.mark.server
def test_a_store_url_is_printed_without_its_password(tmp_path: Path, pg_url: str) -> None:
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    scheme, _, rest = pg_url.partition("://")
    user, _, host = rest.rpartition("@")
    url = f"{scheme}://{user or 'postgres'}:s3cret@{host}?table_prefix={prefix}"  # trust auth
    asyncio.run(empty_store_at(url))
    try:
        with ui_server(tmp_path / "home", "--store", url) as server:
            assert server.output[0].startswith(
                f"nestegg ui: {server.base}/ (store: {without_password(url)})"
            )
            assert "s3cret" not in "".join(server.output)
            stop(server.process)
    finally:
        asyncio.run(drop_postgres_tables(pg_url, prefix))


async def empty_store_at(url: str) -> None:
    store = open_store(url)
    await store.setup()
    await store.close()


def test_with_allow_writes_it_prints_the_token_and_the_url_that_keeps_it(
    tmp_path: Path,
) -> None:
    url = empty_store(tmp_path)
    with ui_server(tmp_path / "home", "--store", url, "--allow-writes") as server:
        assert len(server.token) >= 20
        assert f"{server.base}/?token={server.token}" in "".join(server.output)


def test_with_an_app_the_commands_the_pages_suggest_carry_it(tmp_path: Path) -> None:
    # they said --app MODULE:CLUTCH though the server was given the app
    url = f"sqlite:///{tmp_path / 'runs.db'}"

    async def waiting() -> None:
        store = open_store(url)
        try:
            await start_waiting(store, "w1", nap=False)
        finally:
            await store.close()

    asyncio.run(waiting())
    app = "tests.ui.pipelines:waiting_app"
    with ui_server(tmp_path / "home", "--app", app, "--store", url, "--allow-writes") as server:
        status, page = _get(f"{server.base}/runs/w1")
    assert status == 200
    assert f"nestegg signal w1 approval VALUE --app {app} --store {url}</code>" in page
    other = "tests.cli.pipeline_app:pipeline"  # another pipeline's Clutch: not this run's
    with ui_server(tmp_path / "home", "--app", other, "--store", url, "--allow-writes") as server:
        page = _get(f"{server.base}/runs/w1")[1]
    assert f"w1 approval VALUE --app MODULE:CLUTCH --store {url}</code>" in page
    with ui_server(tmp_path / "home", "--store", url) as server:  # no app: to be filled in
        assert "approval VALUE --app MODULE:CLUTCH --store" in _get(f"{server.base}/runs/w1")[1]


def test_an_app_naming_its_own_store_serves_that_store(tmp_path: Path) -> None:
    app = "tests.cli.pipeline_app:own_store_pipeline"
    other = f"sqlite:///{tmp_path / 'other.db'}"
    own = {OWN_STORE_ENV: str(tmp_path / "own")}
    asyncio.run(empty_store_at(f"file://{tmp_path / 'own'}"))
    with ui_server(
        tmp_path / "home", "--app", app, "--store", other, "--allow-writes", **own
    ) as server:
        assert server.output[0] == (
            f"note: the Clutch at {app} names its own store; --store is ignored\n"
        )
        assert (
            f"(store: {tmp_path / 'own'} (the store the Clutch at {app} names))"
            in (server.output[1])
        )
        assert _get(server.base + "/")[0] == 200
    assert not (tmp_path / "other.db").exists()  # the --store one was never opened


@pytest.mark.parametrize(
    ("attribute", "name", "why"),
    [
        ("own_sqlite_pipeline", "own.db", "no such file"),
        ("own_store_pipeline", "own", "no nestegg file store there"),
    ],
)
def test_an_app_naming_its_own_store_that_does_not_exist_is_refused_and_creates_nothing(
    tmp_path: Path, attribute: str, name: str, why: str
) -> None:
    # It served, and opened the store the Clutch names, creating an empty one where a
    # wrong path pointed: a read command refuses a store that is not there.
    app = f"tests.cli.pipeline_app:{attribute}"
    own = tmp_path / name
    done = _ui(tmp_path, "--port", "0", "--app", app, "--allow-writes", **{OWN_STORE_ENV: str(own)})
    assert (done.returncode, done.stdout) == (EXIT_NOT_FOUND, "")
    assert done.stderr.strip() == (
        f"error: no store at {own} (the store the Clutch at {app} names): {why}"
    )
    assert not own.exists()


SERVER_STORES = [
    (
        "postgresql",
        "?table_prefix=",
        "_",
        "table prefix",
        "no nestegg tables there (a run creates them; a store with a prefix of its own: "
        "?table_prefix=app_)",
    ),
    (
        "redis",
        "?prefix=",
        ":",
        "key prefix",
        "no nestegg store under its key prefix (a run writes one; a store with a prefix of "
        "its own: ?prefix=app:)",
    ),
]
SERVER_IDS = [store[0] for store in SERVER_STORES]


def _stored_under(server: str, prefix: str) -> list[str]:
    """The tables (PostgreSQL) or keys (Redis) under ``prefix`` on the test ``server``."""
    if server.startswith("redis"):
        import redis

        client = redis.Redis.from_url(server)
        try:
            return [key.decode() for key in client.scan_iter(match=f"{prefix}*")]
        finally:
            client.close()
    import psycopg

    with psycopg.connect(server) as conn:
        found = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", [prefix + "%"]
        )
        return [row[0] for row in found.fetchall()]


@pytest.mark.server
@pytest.mark.parametrize(("scheme", "query", "end", "named", "why"), SERVER_STORES, ids=SERVER_IDS)
def test_an_app_naming_a_server_store_never_set_up_is_refused_and_creates_nothing(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    scheme: str,
    query: str,
    end: str,
    named: str,
    why: str,
) -> None:
    # It served a Clutch's PostgreSQL or Redis store that was never set up (a wrong
    # prefix or database) as a store without runs; its first page created PostgreSQL's.
    server = request.getfixturevalue("redis_url" if scheme == "redis" else "pg_url")
    prefix = f"none{uuid.uuid4().hex[:8]}{end}"
    app = "tests.cli.pipeline_app:own_url_pipeline"
    own = {OWN_STORE_ENV: f"{server}{query}{prefix}"}
    done = _ui(tmp_path, "--port", "0", "--app", app, "--allow-writes", **own)
    assert (done.returncode, done.stdout) == (EXIT_NOT_FOUND, ""), done.stderr
    assert done.stderr == (
        f"error: no store at {without_password(server)}, {named} {prefix!r} (the store the "
        f"Clutch at {app} names): {why}\n"
    )
    assert _stored_under(server, prefix) == []


@pytest.mark.server
@pytest.mark.parametrize(("scheme", "query", "end"), [s[:3] for s in SERVER_STORES], ids=SERVER_IDS)
def test_an_app_naming_a_server_store_that_is_set_up_serves_it(
    tmp_path: Path, request: pytest.FixtureRequest, scheme: str, query: str, end: str
) -> None:
    server = request.getfixturevalue("redis_url" if scheme == "redis" else "pg_url")
    prefix = f"own{uuid.uuid4().hex[:8]}{end}"
    url = f"{server}{query}{prefix}"
    asyncio.run(fill(url))
    app = "tests.cli.pipeline_app:own_url_pipeline"
    try:
        with ui_server(
            tmp_path / "home", "--app", app, "--allow-writes", **{OWN_STORE_ENV: url}
        ) as server_process:
            named = "table prefix" if scheme.startswith("postgres") else "key prefix"
            assert (
                f"(store: {without_password(server)}, {named} {prefix!r} (the store the Clutch "
                f"at {app} names))"
            ) in server_process.output[0]
            status, page = _get(server_process.base + "/")
            assert status == 200 and "/runs/ok" in page
            assert _get(server_process.base + "/runs/ok")[0] == 200
    finally:
        if scheme == "redis":
            asyncio.run(delete_redis_keys(server, prefix))
        else:
            asyncio.run(drop_postgres_tables(server, prefix))


def test_an_app_without_allow_writes_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    # It served, and the first page opened the store the Clutch names for writing,
    # creating it: the Clutch serves resume and fork alone, which need --allow-writes.
    app = "tests.cli.pipeline_app:own_store_pipeline"
    done = _ui(tmp_path, "--port", "0", "--app", app, **{OWN_STORE_ENV: str(tmp_path / "own")})
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip() == (
        "error: --app needs --allow-writes: the Clutch only resumes and forks runs; to "
        "browse the store it names, give that store with --store"
    )
    assert done.stdout == ""
    assert not (tmp_path / "own").exists()


def test_with_host_ipv6_loopback_it_serves_over_ipv6_only(tmp_path: Path) -> None:
    url = empty_store(tmp_path)
    with ui_server(tmp_path / "home", "--store", url, "--host", "::1") as server:
        port = server.base.rsplit(":", 1)[1]
        assert server.base == f"http://[::1]:{port}"
        assert server.output[0].startswith(f"nestegg ui: {server.base}/ (store: {url})")
        status, page = _get(server.base + "/")  # its Host header, [::1]:PORT, is served
        assert status == 200 and "no runs" in page
        with pytest.raises(URLError):  # bound to ::1, not to IPv4
            _get(f"http://127.0.0.1:{port}/")


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.4"])
def test_a_host_other_machines_reach_is_refused_without_allow_remote(
    tmp_path: Path, host: str
) -> None:
    done = _ui(tmp_path, "--host", host, "--port", "1")
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip() == (
        f"error: --host {host} is reachable from other machines; add --allow-remote to mean it"
    )
    assert done.stdout == ""  # refused before serving anything


@pytest.mark.parametrize("host", ["no-such-host.invalid", "a..b"])
@pytest.mark.parametrize("remote", [[], ["--allow-remote"]])
def test_a_host_that_does_not_resolve_is_refused_before_serving(
    tmp_path: Path, host: str, remote: list[str]
) -> None:
    url = empty_store(tmp_path)
    done = _ui(tmp_path, "--host", host, "--store", url, *remote)
    assert done.returncode == EXIT_USAGE
    assert done.stderr.startswith(f"error: --host {host!r} does not resolve: ")
    assert done.stderr.count("\n") == 1 and "reachable" not in done.stderr  # one line
    assert done.stdout == ""  # refused before serving anything


def test_a_store_that_is_not_there_is_refused_and_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    done = _ui(tmp_path, "--store", f"sqlite:///{missing}")
    assert done.returncode == EXIT_NOT_FOUND
    assert done.stderr.strip() == f"error: no store at sqlite:///{missing}: no such file"
    assert done.stdout == "" and not missing.exists()
    bad = _ui(tmp_path, "--store", "sqlit:///x.db")
    assert bad.returncode == EXIT_USAGE and bad.stderr.startswith("error: bad store URL")


def test_without_allow_writes_sqlite_is_opened_read_only_and_migrated_only_with_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "x.db"
    url = f"sqlite:///{path}"
    asyncio.run(fill(url))
    sqlite_back_to_version_5(path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    done = _ui(tmp_path, "--store", url)
    assert done.returncode == EXIT_FAILED, done.stderr
    assert done.stderr.startswith(
        f"error: the SQLite database {path} has schema version 5, which a reader does not "
        "upgrade (it reads version 6 and newer); nothing was changed"
    )
    assert done.stdout == ""  # refused before serving
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before
    with ui_server(tmp_path / "home", "--store", url, "--allow-writes") as server:
        assert "/runs/ok" in _get(server.base + "/")[1]
    assert sqlite_schema(path)[0] == SCHEMA_VERSION  # opened for writing: migrated, as before


@pytest.mark.server
def test_without_allow_writes_postgres_needs_only_select_and_is_migrated_only_with_it(
    tmp_path: Path, pg_url: str
) -> None:
    from nestegg.checkpoint.stores.postgres.migrations import MIGRATIONS as PG_MIGRATIONS

    with pg_database_and_reader(pg_url) as (url, as_reader):
        asyncio.run(fill(url))
        pg_version_5_for_a_reader(url, as_reader)
        before = pg_schema(url)
        for where in (as_reader, url):
            with ui_server(tmp_path / "home", "--store", where) as server:
                status, page = _get(server.base + "/")
                assert status == 200 and "/runs/ok" in page, where
                assert _get(server.base + "/runs/ok")[0] == 200
            assert pg_schema(url) == before, where  # nothing created or migrated
        with ui_server(tmp_path / "home", "--store", url, "--allow-writes") as server:
            assert "/runs/ok" in _get(server.base + "/")[1]
        assert pg_schema(url)[2] == [(v,) for v in range(1, len(PG_MIGRATIONS) + 1)]  # as before


def test_a_port_in_use_is_refused_before_anything_is_printed(tmp_path: Path) -> None:
    url = empty_store(tmp_path)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _ui(tmp_path, "--store", url, "--port", str(port))
    assert done.returncode == EXIT_FAILED
    assert (
        done.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert done.stdout == ""


def test_port_0_listens_on_a_free_port_and_prints_it(tmp_path: Path) -> None:
    url = empty_store(tmp_path)
    command = [sys.executable, "-m", "nestegg.cli", "ui", "--store", url, "--port", "0"]
    process = subprocess.Popen(
        command, cwd=ROOT, env=child_env(tmp_path), stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        match = re.match(r"nestegg ui: (http://127\.0\.0\.1:(\d+))/ ", first)
        assert match and int(match.group(2)) > 0, first
        assert _get(match.group(1) + "/")[0] == 200
    finally:
        stop(process)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.1", True), ("localhost", True), ("::1", True),
     ("[::1]", True), ("0.0.0.0", False), ("192.168.1.4", False), ("example.org", False)],
)  # fmt: skip
def test_which_hosts_are_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
