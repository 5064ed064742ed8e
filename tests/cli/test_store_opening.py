"""Which store a command opens, and how: reading commands create nothing and open SQLite
read-only; a missing, empty or damaged store or run says so with one exit code per cause.
Run as real processes, as users run them."""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest

from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.file import FileCheckpointStorage
from nestegg.checkpoint.stores.sqlite.schema import SCHEMA_VERSION
from nestegg.constants import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    STORE_ENV,
)
from nestegg.errors import CheckpointCorruptedError
from nestegg.identifiers import NOT_ALLOWED
from nestegg.urls import UNREADABLE_HOST, UNREADABLE_USER, without_password
from tests.cli.conftest import Cli, Filled, fill, json_of
from tests.cli.test_subprocess import ROOT, nestegg

PENDING_TAKES = "the query option max_pending_commits takes a positive integer"
READING = (
    ["runs"],
    ["show", "ok"],
    ["checkpoints", "ok"],
    ["inspect", "ok"],
    ["diff", "ok", "ok"],
    ["events", "ok"],
    ["export", "ok"],
)
THREAD_COMMANDS = (["threads"], ["thread", "chat"], ["threads", "prune", "--yes"])


def _url(kind: str, where: Path) -> str:
    return f"sqlite:///{where / 'x.db'}" if kind == "sqlite" else f"file://{where / 'store'}"


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("kind", ["sqlite", "file"])
@pytest.mark.parametrize(
    "args",
    [*READING, ["delete", "ok", "--yes"], ["prune", "--keep", "1"], *THREAD_COMMANDS],
)
def test_a_missing_store_is_not_created(tmp_path: Path, kind: str, args: list[str]) -> None:
    url = _url(kind, tmp_path / "no" / "such" / "dir")
    before = _tree(tmp_path)
    result = nestegg(tmp_path, *args, "--store", url)
    assert result.returncode == EXIT_NOT_FOUND, result.stderr
    assert result.stderr.startswith(f"error: no store at {url}")
    assert len(result.stderr.splitlines()) == 1
    assert _tree(tmp_path) == before  # no directory, no file


@pytest.mark.parametrize(
    ("args", "what"),
    [
        (["show", "a/b"], "run id 'a/b'"),
        (["checkpoints", "a/b"], "run id 'a/b'"),
        (["events", "a/b"], "run id 'a/b'"),
        (["export", "a/b"], "run id 'a/b'"),
        (["delete", "a/b", "--yes"], "run id 'a/b'"),
        (["cancel", "a/b"], "run id 'a/b'"),
        (["signal", "a/b", "approval"], "run id 'a/b'"),
        (["signal", "ok", "a/b"], "signal name 'a/b'"),
        (["inspect", "a/b"], "checkpoint or run id 'a/b'"),
        (["diff", "ok", "a/b"], "checkpoint or run id 'a/b'"),
        (["resume", "a/b", "--app", "tests.cli.pipeline_app:pipeline"], "run id 'a/b'"),
        (["fork", "a/b", "--app", "tests.cli.pipeline_app:pipeline"], "checkpoint id 'a/b'"),
    ],
)
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_an_invalid_id_is_bad_usage_before_the_store_is_looked_at(
    tmp_path: Path, args: list[str], what: str, kind: str
) -> None:
    url = _url("sqlite", tmp_path / "no") if kind == "sqlite" else "redis://127.0.0.1:1/0"
    result = nestegg(tmp_path, *args, "--store", url)
    assert result.returncode == EXIT_USAGE, result.stderr  # not 3 (no store) nor 4
    assert (
        result.stderr == f"error: {what} contains a path separator '/' at index 1 {NOT_ALLOWED}\n"
    )
    assert _tree(tmp_path) == []


@pytest.mark.parametrize(
    "args", [["runs", "--pipeline", "\udcff"], ["prune", "--keep", "1", "--pipeline", "\udcff"]]
)
def test_a_pipeline_filter_no_pipeline_can_have_is_bad_usage_before_the_store(
    tmp_path: Path, args: list[str]
) -> None:
    # prune looked at the store first: a missing one exited 3
    result = nestegg(tmp_path, *args, "--store", _url("sqlite", tmp_path / "no"))
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "error: pipeline name '\\udcff' holds a lone surrogate" in result.stderr
    assert _tree(tmp_path) == []


def test_the_missing_default_store_is_not_created(tmp_path: Path) -> None:
    result = nestegg(tmp_path, "runs")
    assert result.returncode == EXIT_NOT_FOUND
    assert "no store at" in result.stderr and "the default store" in result.stderr
    assert not (tmp_path / "home").exists()


def test_an_empty_sqlite_file_is_damaged_not_empty(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.touch()
    for args in (["runs"], ["show", "ok"], ["export", "ok"]):
        result = nestegg(tmp_path, *args, "--store", f"sqlite:///{path}")
        assert result.returncode == EXIT_FAILED, result.stderr
        assert "is damaged or not a nestegg store: it is empty (0 bytes)" in result.stderr
        assert result.stdout == ""
    assert path.stat().st_size == 0 and _tree(tmp_path) == ["x.db"]  # left as it was


@pytest.mark.parametrize("foreign", [False, True])
@pytest.mark.parametrize(
    "args",
    [
        ["delete", "ok", "--yes"],
        ["prune", "--keep", "1", "--yes"],
        ["signal", "ok", "approval", "1"],
        ["cancel", "ok"],
        ["threads", "prune", "--yes"],
    ],
)
def test_a_command_that_writes_gives_no_schema_to_a_file_that_is_no_store(
    tmp_path: Path, args: list[str], foreign: bool
) -> None:
    path = tmp_path / "x.db"
    path.touch()
    if foreign:  # the application's own database, named by a slip of --store
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("CREATE TABLE users (id INTEGER)")
    before = path.read_bytes()
    result = nestegg(tmp_path, *args, "--store", f"sqlite:///{path}")
    assert result.returncode == EXIT_FAILED, result.stderr
    what = "it holds no nestegg schema" if foreign else "it is empty (0 bytes)"
    assert f"is damaged or not a nestegg store: {what}" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert path.read_bytes() == before and _tree(tmp_path) == ["x.db"]  # left as it was


@pytest.mark.parametrize("missing", ["run.json", "input.json"])
def test_a_file_store_run_without_its_record_is_damaged(tmp_path: Path, missing: str) -> None:
    url = _url("file", tmp_path)
    filled = asyncio.run(fill(url))
    (tmp_path / "store" / "runs" / filled.ok / missing).unlink()
    listed = nestegg(tmp_path, "runs", "--store", url, "--json")
    assert listed.returncode == EXIT_OK, listed.stderr
    rows = {row["run_id"]: row for row in orjson.loads(listed.stdout)}
    assert rows[filled.ok]["status"] == "damaged" and len(rows) == 3
    table = nestegg(tmp_path, "runs", "--store", url).stdout
    assert any(line.split()[:3] == [filled.ok, "?", "damaged"] for line in table.splitlines())
    shown = nestegg(tmp_path, "show", filled.ok, "--store", url)
    assert shown.returncode == EXIT_FAILED
    assert shown.stderr == (
        f"error: run {filled.ok!r} is damaged: its directory "
        f"{tmp_path / 'store' / 'runs' / filled.ok} has no {missing}\n"
    )


def test_a_run_directory_that_is_a_file_is_damaged_exit_1(tmp_path: Path) -> None:
    url = _url("file", tmp_path)
    filled = asyncio.run(fill(url))
    run_dir = tmp_path / "store" / "runs" / filled.ok
    shutil.rmtree(run_dir)
    run_dir.write_text("not a run\n")
    result = nestegg(tmp_path, "show", filled.ok, "--store", url)
    assert result.returncode == EXIT_FAILED, result.stderr  # damaged, not "unreachable" (4)
    assert "is damaged" in result.stderr


def test_a_deleted_journal_is_detected_not_paid_again(tmp_path: Path) -> None:
    url = _url("file", tmp_path)
    filled = asyncio.run(fill(url))  # bad: failed in enrich after its journaled call
    (tmp_path / "store" / "runs" / filled.bad / "journal.log").unlink()
    store = FileCheckpointStorage(tmp_path / "store")
    with pytest.raises(CheckpointCorruptedError, match="journal of run 'bad' is missing"):
        asyncio.run(store.read_journal(filled.bad, 2))
    result = nestegg(
        tmp_path, "resume", filled.bad, "--app", "tests.cli.pipeline_app:pipeline", "-s", url
    )
    assert result.returncode == EXIT_FAILED
    assert "journal of run 'bad' is missing" in result.stderr


def _read_only_mount(directory: Path, *command: str) -> subprocess.CompletedProcess[str]:
    """``command`` in a mount namespace where ``directory`` is a read-only bind mount."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare")
    script = (
        f'mount --bind "{directory}" "{directory}" && '
        f'mount -o remount,ro,bind "{directory}" "{directory}" && exec "$@"'
    )
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", "touch", str(directory / "probe")],
        capture_output=True,
        text=True,
    )
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.strip()}")
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *command],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != STORE_ENV},
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )


def test_sqlite_on_a_read_only_mount_can_be_inspected(tmp_path: Path) -> None:
    import sys

    directory = tmp_path / "ro"
    directory.mkdir()
    url = f"sqlite:///{directory / 'x.db'}"
    filled = asyncio.run(fill(url))
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    command = (sys.executable, "-m", "nestegg.cli")
    listed = _read_only_mount(directory, *command, "runs", "--json", "-s", url)
    assert listed.returncode == EXIT_OK, listed.stderr
    assert {r["run_id"] for r in orjson.loads(listed.stdout)} == {"ok", "bad", "gone"}
    shown = _read_only_mount(directory, *command, "show", filled.ok, "--json", "-s", url)
    assert orjson.loads(shown.stdout)["run"]["status"] == "completed", shown.stderr
    exported = _read_only_mount(directory, *command, "export", filled.ok, "-s", url)
    assert orjson.loads(exported.stdout)["run"]["run_id"] == filled.ok, exported.stderr
    # and a writing command says the store cannot be written
    deleted = _read_only_mount(directory, *command, "delete", filled.ok, "--yes", "-s", url)
    assert deleted.returncode == EXIT_UNAVAILABLE, deleted.stderr
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_reading_a_writable_sqlite_store_changes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(fill(url))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    for args in READING:
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_OK, (args, result.stderr)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def sqlite_back_to_version_5(path: Path) -> None:
    """The SQLite store at ``path`` as a nestegg of schema version 5 left it, which a
    reader does not read as it is (version 6 added tables its reads use)."""
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE group_steps")
        conn.execute("DROP TABLE group_event_batches")
        conn.execute("DROP INDEX runs_by_parent")  # version 7's
        conn.execute("PRAGMA user_version = 5")


def sqlite_schema(path: Path) -> tuple[int, list[str]]:
    """The schema version of the SQLite file at ``path`` and what its schema holds."""
    with closing(sqlite3.connect(path)) as conn:
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        names = conn.execute("SELECT name FROM sqlite_master ORDER BY name").fetchall()
    return version, [name for (name,) in names]


def test_reading_an_older_sqlite_schema_is_refused_and_migrates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    url = f"sqlite:///{path}"
    asyncio.run(fill(url))
    sqlite_back_to_version_5(path)
    schema = sqlite_schema(path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()}
    for args in (*READING, *([["threads"]] if find_spec("langgraph") else [])):
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_FAILED, (args, result.stderr)
        assert result.stderr == (
            f"error: the SQLite database {path} has schema version 5, which a reader does "
            "not upgrade (it reads version 6 and newer); nothing was changed: upgrade it as "
            "a user who may write it, with a command that writes (nestegg prune --keep 1 "
            f"--dry-run --store sqlite:///{path} upgrades it and deletes nothing) or a "
            "store's setup()\n"
        ), args
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.iterdir()} == before
    assert sqlite_schema(path) == schema
    upgraded = nestegg(tmp_path, "prune", "--keep", "1", "--dry-run", "--store", url)
    assert upgraded.returncode == EXIT_OK, upgraded.stderr
    assert sqlite_schema(path)[0] == SCHEMA_VERSION
    listed = nestegg(tmp_path, "runs", "--json", "--store", url)
    assert sorted(row["run_id"] for row in orjson.loads(listed.stdout)) == ["bad", "gone", "ok"]


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_an_invalid_id_exits_2_on_every_store(tmp_path: Path, kind: str) -> None:
    url = _url(kind, tmp_path)
    asyncio.run(fill(url))
    for args in (["show", "../x"], ["export", "a/b"], ["inspect", ".."], ["events", "x\ny"]):
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)
        assert NOT_ALLOWED in result.stderr
    for args in (["show", "a\udcffb"], ["delete", "\udcff", "--yes"]):  # the byte 0xff
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)
        assert "is not valid Unicode text (a lone surrogate" in result.stderr
    # A pipeline to list or prune by that is not UTF-8 failed in the store (exit 1).
    for args in (
        ["runs", "--pipeline", "\udcff"],
        ["prune", "--keep", "1", "--pipeline", "\udcff"],
    ):
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)
        assert "error: pipeline name '\\udcff' holds a lone surrogate" in result.stderr


def test_a_home_that_cannot_be_created_is_reported_as_through_a_url(
    tmp_path: Path, filled_doc: Path
) -> None:
    home = Path("/proc/no-such-home")
    document = filled_doc.read_text()  # an export: a document refused opens no store
    through_url = nestegg(
        tmp_path, "import", "-", "-s", f"sqlite:///{home / 'nestegg.db'}", stdin=document
    )
    by_default = nestegg(tmp_path, "import", "-", stdin=document, NESTEGG_HOME=str(home))
    assert through_url.returncode == by_default.returncode == EXIT_UNAVAILABLE
    assert by_default.stderr == through_url.stderr
    assert by_default.stderr.startswith(f"error: cannot open the SQLite database {home}")


def test_a_home_that_is_a_file_is_named_so(tmp_path: Path, filled_doc: Path) -> None:
    # it was StorageUnavailableError ... [Errno 17] File exists (exit 4), or for a reading
    # command: no store at .../nestegg.db (exit 3)
    home = tmp_path / "home"
    home.write_text("a file")
    for args, stdin in ((["import", "-"], filled_doc.read_text()), (["runs"], None)):
        result = nestegg(tmp_path, *args, stdin=stdin, NESTEGG_HOME=str(home))
        assert (result.returncode, result.stdout) == (EXIT_USAGE, ""), result.stderr
        assert result.stderr == (
            f"error: NESTEGG_HOME {str(home)!r} is a file, not a directory: it names the "
            "directory the default store keeps its database (nestegg.db) in\n"
        )
    assert home.read_text() == "a file"


def test_a_bad_store_from_the_environment_names_the_value_and_where(tmp_path: Path) -> None:
    result = nestegg(tmp_path, "runs", NESTEGG_STORE="bogus")
    assert result.returncode == EXIT_USAGE
    assert result.stderr.startswith("error: bad store URL 'bogus' from $NESTEGG_STORE: ")
    given = nestegg(tmp_path, "runs", "--store", "nope://x")
    assert given.stderr.startswith("error: bad store URL 'nope://x' from --store: ")


@pytest.mark.parametrize(
    "url", ["postgresql://app:s3cret/x@db/app", "redis://:s3cret/x@cache:6379/0", "redis://[bad"]
)
def test_a_store_url_whose_host_cannot_be_read_is_named_once_without_its_password(
    tmp_path: Path, url: str
) -> None:
    result = nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_USAGE
    assert result.stderr == (
        f"error: bad store URL {without_password(url)!r} from --store: {UNREADABLE_HOST}\n"
    )
    assert "s3cret" not in result.stderr


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://:s3cret@cache:6379/abc", "the database is a number from 0"),
        ("redis://:s3cret@cache:6379/0?db=3", "the database is given twice (/0 and ?db=3)"),
        ("redis://cache:6379/0?socket_timout=5", "unknown query option 'socket_timout'"),
        ("postgresql://app:s3cret@db/app?sslmod=require", "invalid URI query parameter"),
        (
            "postgresql://app:s3cret@db/app?connect_timeout=abc",
            "the option connect_timeout takes a whole number of seconds from 0, got 'abc'\n",
        ),
        (
            "rediss://:s3cret@cache:6379/0?ssl_cert_reqs=bogus",
            "redis-py does not take the value of the query option 'ssl_cert_reqs': Invalid SSL "
            "Certificate Requirements Flag: bogus\n",
        ),
        (
            "sqlite:///x.db?max_pending_commits=64&max_pending_commits=3",
            "the query option max_pending_commits is there twice: give it once\n",
        ),
        (
            "postgresql://app:s3cret@db/app?table_prefix=a_&table_prefix=b_",
            "the query option table_prefix is there twice: give it once\n",
        ),
        (
            "sqlite:///x.db#part",
            "it has a fragment ('#part'), which no store reads (a '#' in a file name or a "
            "password is written %23)\n",
        ),
        (
            "redis://:s3cret@cache:6379/0?prefix=a:#b",
            "it has a fragment ('#b'), which no store reads (a '#' in a file name or a "
            "password is written %23)\n",
        ),
        *(
            (f"{base}?max_pending_commits={value}", f"{PENDING_TAKES}, got {value!r}\n")
            for base, value in (
                ("sqlite:///x.db", "0"),
                ("postgresql://app:s3cret@db/app", "-1"),
                ("redis://:s3cret@cache:6379/0", "x"),
            )
        ),
    ],
)
def test_a_store_url_a_store_refuses_is_named_once(tmp_path: Path, url: str, reason: str) -> None:
    result = nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_USAGE
    assert result.stderr.startswith(
        f"error: bad store URL {without_password(url)!r} from --store: {reason}"
    ), result.stderr
    assert result.stderr.count("store URL") == 1 and "s3cret" not in result.stderr
    assert not (ROOT / "x.db").exists()


def test_a_store_url_holds_back_steps_as_its_store_does(cli: Cli, filled_any: Filled) -> None:
    # ?max_pending_commits= is the constructor's option, on SQLite, PostgreSQL and Redis
    url = f"{filled_any.url}{'&' if '?' in filled_any.url else '?'}max_pending_commits=8"
    for args in (["show", filled_any.ok], ["signal", filled_any.ok, "go", "1", "--replace"]):
        result = cli(*args, "--store", url)
        if urlsplit(url).scheme in ("file", "memory"):
            assert result.exit_code == EXIT_USAGE, (args, result.stderr)
            assert result.stderr.endswith(": unknown query option 'max_pending_commits'\n")
        else:
            assert result.exit_code == EXIT_OK, (args, result.stderr)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("sqlite:///x.db?prefix=app:", "unknown query option 'prefix'"),
        ("file:///no/store?foo=1", "unknown query option 'foo'"),
        (
            "sqlite:x.db",
            "sqlite: is followed by '//' and the path: sqlite:///x.db for 'x.db' in the current "
            "directory, sqlite:////x.db for '/x.db'",
        ),
    ],
)
def test_an_embedded_store_url_the_store_would_misread_is_bad_usage(
    tmp_path: Path, url: str, reason: str
) -> None:
    for args in (["runs"], ["delete", "r1", "--yes"]):
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_USAGE, (args, result.stderr)
        assert result.stderr == f"error: bad store URL {url!r} from --store: {reason}\n"
    assert not (ROOT / "x.db").exists() and not (ROOT / ".db").exists()


def test_a_store_path_of_the_other_kind_is_bad_usage_not_unreachable(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    for url, reason in (
        (
            f"sqlite:///{tmp_path}",
            f"SQLiteCheckpointStorage path {str(tmp_path)!r} is a directory: it needs the "
            f"path of a database file (such as {str(tmp_path / 'nestegg.db')!r})",
        ),
        (
            f"file://{tmp_path / 'plain'}",
            f"FileCheckpointStorage path {str(tmp_path / 'plain')!r} is a file: it needs the "
            "path of a directory",
        ),
    ):
        result = nestegg(tmp_path, "runs", "--store", url)
        assert result.returncode == EXIT_USAGE, result.stderr
        assert result.stderr == f"error: bad store URL {url!r} from --store: {reason}\n"


def test_a_postgres_option_value_libpq_does_not_take_is_bad_usage(
    tmp_path: Path, pg_url: str
) -> None:
    url = f"{pg_url}?sslmode=bogus"
    result = nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert result.stderr == (
        f"error: PostgreSQL store URL {without_password(url)!r}: libpq does not take the value "
        "of the connection option 'sslmode': connection is bad: invalid sslmode value: "
        '"bogus"\n'
    )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:123/s3cret@db/app",
        "redis://:123/s3cret@cache:6379/0",
        "redis://u:123?s3cret=x@cache:6379/0",
    ],
)
def test_a_store_url_whose_password_holds_digits_then_slash_is_refused_without_quoting_it(
    tmp_path: Path, url: str
) -> None:
    result = nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_USAGE
    assert result.stderr == (
        f"error: bad store URL {without_password(url)!r} from --store: {UNREADABLE_USER}\n"
    )
    assert "s3cret" not in result.stderr and "123" not in result.stderr


def test_a_key_value_connection_string_is_refused_without_its_password(tmp_path: Path) -> None:
    given = "host=127.0.0.1 dbname=test password=s3cret"
    for result, origin in (
        (nestegg(tmp_path, "runs", "--store", given), "--store"),
        (nestegg(tmp_path, "runs", NESTEGG_STORE=given), "$NESTEGG_STORE"),
    ):
        assert result.returncode == EXIT_USAGE
        assert result.stderr == (
            "error: bad store URL 'host=127.0.0.1 dbname=test password=***' from "
            f"{origin}: it has no scheme (sqlite:///file.db, file:///dir, postgresql://..., "
            "redis://...)\n"
        )


def test_an_empty_store_option_is_an_error(tmp_path: Path) -> None:
    for args in (["runs", "--store", ""], ["--store", " ", "runs"]):
        result = nestegg(tmp_path, *args)
        assert result.returncode == EXIT_USAGE
        assert result.stderr.startswith("error: --store is empty")
    assert not (tmp_path / "home").exists()


IN_MEMORY = (
    "names a store in memory, which lives only inside the process that made it: a "
    "command's would be new and empty, and gone when it ends; give a store in a file "
    "instead, such as sqlite:///runs.db"
)
APP = ("--app", "tests.cli.pipeline_app:pipeline")
CHANGING = (
    ["delete", "ok", "--yes"],
    ["prune", "--keep", "1", "--yes"],
    ["cancel", "ok"],
    ["signal", "ok", "go", "1"],
    ["resume", "ok", *APP],
    ["fork", "ok", *APP],
    ["recover", *APP],
    ["ui"],
)


def test_a_store_in_memory_is_refused_by_every_command(tmp_path: Path, filled_doc: Path) -> None:
    # nestegg runs --store sqlite:// printed "no runs", exit 0: a new, empty store
    importing = ["import", str(filled_doc)]
    for args in (*READING, *THREAD_COMMANDS, importing, *CHANGING):
        result = nestegg(tmp_path, *args, "--store", "sqlite://")
        assert (result.returncode, result.stdout) == (EXIT_USAGE, ""), (args, result.stderr)
        assert result.stderr == f"error: store URL 'sqlite://' from --store {IN_MEMORY}\n"
    for url in ("sqlite:///:memory:", "memory://", "sqlite://?max_pending_commits=8"):
        for args in (["runs"], importing, ["--store", url, "runs"]):
            result = nestegg(tmp_path, *args, "--store", url)
            assert result.returncode == EXIT_USAGE, (url, args, result.stderr)
            assert result.stderr == f"error: store URL {url!r} from --store {IN_MEMORY}\n"
    from_env = nestegg(tmp_path, "runs", NESTEGG_STORE="memory://")
    assert from_env.returncode == EXIT_USAGE
    assert from_env.stderr == f"error: store URL 'memory://' from ${STORE_ENV} {IN_MEMORY}\n"
    assert not (tmp_path / "home").exists()
    # A store in a file of that name is one.
    named = nestegg(tmp_path, "runs", "--store", f"sqlite:///{tmp_path / ':memory:'}")
    assert named.returncode == EXIT_NOT_FOUND, named.stderr


@pytest.fixture
def filled_doc(tmp_path: Path) -> Path:
    """An export of the completed run of a filled store."""
    url = _url("sqlite", tmp_path / "source")
    (tmp_path / "source").mkdir()
    filled: Filled = asyncio.run(fill(url))
    path = tmp_path / "ok.json"
    result = nestegg(tmp_path, "export", filled.ok, "-o", str(path), "-s", url)
    assert result.returncode == EXIT_OK, result.stderr
    return path


def test_reading_leaves_no_sqlite_files_behind(tmp_path: Path) -> None:
    """The read-only connection leaves no WAL or shared-memory file behind."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    asyncio.run(fill(url))
    conn = sqlite3.connect(tmp_path / "x.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]
    nestegg(tmp_path, "runs", "-s", url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.db"]


async def _setup(url: str) -> None:
    store = open_store(url)
    await store.setup()
    await store.close()


def test_an_invalid_id_exits_2_on_server_stores_too(cli: Cli, filled_any: Filled) -> None:
    for args in (["show", "../x"], ["delete", "a/b", "--yes"], ["diff", "..", "x"]):
        result = cli(*args, "--store", filled_any.url)
        assert result.exit_code == EXIT_USAGE, (args, result.stderr)
        assert NOT_ALLOWED in result.stderr
    for args in (["show", "a\udcffb"], ["delete", "\udcff", "--yes"]):  # the byte 0xff
        result = cli(*args, "--store", filled_any.url)
        assert result.exit_code == EXIT_USAGE, (args, result.stderr)
        assert "is not valid Unicode text (a lone surrogate" in result.stderr


async def _tables_of(pg_url: str, prefix: str) -> list[str]:
    import psycopg

    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        found = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", [prefix + "%"]
        )
        return [row[0] for row in await found.fetchall()]


async def _prefixed_run(url: str, run_id: str) -> None:
    store = open_store(url)
    try:
        await fill(url, run_id, opened=store)
    finally:
        await store.close()


def test_a_read_finds_no_postgres_store_where_its_tables_are_not_and_creates_none(
    cli: Cli, pg_url: str
) -> None:
    prefix = f"none_{uuid.uuid4().hex[:8]}_"
    url = f"{pg_url}?table_prefix={prefix}"
    for args in (["runs"], ["show", "r1"], ["threads"]):
        result = cli(*args, "--store", url)
        assert result.exit_code == EXIT_NOT_FOUND, (args, result.output)
        assert (
            result.stderr
            == f"error: no store at {url}: no nestegg tables there (a run creates them; "
            "a store with a prefix of its own: ?table_prefix=app_)\n"
        )
    assert asyncio.run(_tables_of(pg_url, prefix)) == []


def pg_schema(url: str) -> tuple[list[Any], ...]:
    """The tables, functions and recorded schema versions of the database at ``url``."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        ).fetchall()
        functions = conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace ORDER BY 1"
        ).fetchall()
        versions = "SELECT version FROM nestegg_schema_versions ORDER BY 1"
        return tables, functions, conn.execute(versions).fetchall() if tables else []


@contextmanager
def pg_database_and_reader(pg_url: str) -> Iterator[tuple[str, str]]:
    """A database of its own (its URL) and a role that may log in to it and do nothing
    else (its URL there), both dropped afterwards."""
    import psycopg

    tag = uuid.uuid4().hex[:10]
    database, role = f"nestegg_read_{tag}", f"nestegg_reader_{tag}"
    parts = urlsplit(pg_url)
    url = parts._replace(path=f"/{database}").geturl()
    as_reader = parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port or 5432}")
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
        admin.execute(f"CREATE ROLE {role} LOGIN")
        try:
            yield url, as_reader._replace(path=f"/{database}").geturl()
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def pg_version_5_for_a_reader(url: str, as_reader: str) -> None:
    """The store at ``url`` as version 5 left it (the versions after it added a function
    and an index only), which a reader reads as it is; ``as_reader``'s role may SELECT from
    its tables and do nothing else."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {urlsplit(as_reader).username}"
        )
        conn.execute("DROP FUNCTION nestegg_commit_many")
        conn.execute("DROP INDEX nestegg_runs_parent_idx")
        conn.execute("DELETE FROM nestegg_schema_versions WHERE version >= 6")


def _read_changing_nothing(
    tmp_path: Path, url: str, as_reader: str
) -> list[tuple[str, list[str], subprocess.CompletedProcess[str]]]:
    """Every command that only reads, as the reader and as a role that may write, asserting
    that none changed the schema; what each gave."""
    reading = [*READING, *([["threads"]] if find_spec("langgraph") else [])]
    before = pg_schema(url)
    done = [
        (where, args, nestegg(tmp_path, *args, "--store", where))
        for where in (as_reader, url)
        for args in reading
    ]
    assert pg_schema(url) == before
    return done


def test_a_read_of_postgres_creates_and_migrates_nothing_and_needs_only_select(
    tmp_path: Path, pg_url: str
) -> None:
    import psycopg

    from nestegg.checkpoint.stores.postgres.migrations import MIGRATIONS as PG_MIGRATIONS

    with pg_database_and_reader(pg_url) as (url, as_reader):
        empty = nestegg(tmp_path, "runs", "--store", url)
        assert empty.returncode == EXIT_NOT_FOUND, empty.stderr
        assert empty.stderr.startswith(f"error: no store at {url}: no nestegg tables there")
        assert pg_schema(url) == ([], [], [])
        asyncio.run(fill(url))
        pg_version_5_for_a_reader(url, as_reader)
        for where, args, result in _read_changing_nothing(tmp_path, url, as_reader):
            assert result.returncode == EXIT_OK, (where, args, result.stderr)
        with psycopg.connect(url, autocommit=True) as conn:  # older than a reader reads
            conn.execute("DROP TABLE nestegg_signals")
            conn.execute("DELETE FROM nestegg_schema_versions WHERE version = 5")
        for where, args, result in _read_changing_nothing(tmp_path, url, as_reader):
            assert result.returncode == EXIT_FAILED, (where, args, result.stderr)
            assert result.stderr == (
                f"error: PostgreSQL at {where}: the store has schema version 4, which a "
                "reader does not upgrade (it reads version 5 and newer); nothing was "
                "changed: upgrade it as a role that may alter its tables, with a command "
                f"that writes (nestegg prune --keep 1 --dry-run --store {where} upgrades it "
                "and deletes nothing) or a store's setup()\n"
            )
        upgraded = nestegg(tmp_path, "prune", "--keep", "1", "--dry-run", "--store", url)
        assert upgraded.returncode == EXIT_OK, upgraded.stderr
        assert pg_schema(url)[2] == [(v,) for v in range(1, len(PG_MIGRATIONS) + 1)]
        listed = nestegg(tmp_path, "runs", "--json", "--store", url)
        assert sorted(row["run_id"] for row in orjson.loads(listed.stdout)) == ["bad", "gone", "ok"]
        with psycopg.connect(url, autocommit=True) as conn:  # a newer nestegg's
            conn.execute("INSERT INTO nestegg_schema_versions (version) VALUES (99)")
        newer = nestegg(tmp_path, "runs", "--store", as_reader)
        assert (newer.returncode, newer.stderr) == (
            EXIT_FAILED,
            f"error: PostgreSQL at {as_reader}: the store has schema version 99; this nestegg "
            f"knows up to {len(PG_MIGRATIONS)}: upgrade nestegg\n",
        )


def test_a_read_finds_no_redis_store_under_a_prefix_that_holds_none_and_writes_none(
    tmp_path: Path, redis_url: str
) -> None:
    import redis

    tag = uuid.uuid4().hex[:8]
    url = f"{redis_url}?prefix=none-{tag}:"
    for args in (["runs"], ["show", "r1"], ["threads"]):
        result = nestegg(tmp_path, *args, "--store", url)
        assert result.returncode == EXIT_NOT_FOUND, (args, result.stdout, result.stderr)
        assert result.stderr == (
            f"error: no store at {url}: no nestegg store under its key prefix (a run writes "
            "one; a store with a prefix of its own: ?prefix=app:)\n"
        )
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"none-{tag}:*")) == []
    finally:
        client.close()
    stored = f"{redis_url}?prefix=set-{tag}:"
    asyncio.run(_set_up(stored))  # a store set up, without runs yet: there
    try:
        listed = nestegg(tmp_path, "runs", "--store", stored)
        assert (listed.returncode, listed.stderr.strip()) == (0, "no runs"), listed.stdout
    finally:
        asyncio.run(_drop(stored))


def test_a_read_of_a_redis_store_set_up_before_its_mark_writes_none(
    tmp_path: Path, redis_url: str
) -> None:
    # A store written by a version whose setup() wrote no <prefix>store: the commands that
    # only read leave it so, and a Redis user allowed only to read and run scripts reads it.
    from urllib.parse import urlsplit

    import redis

    tag = uuid.uuid4().hex[:8]
    prefix = f"old-{tag}:"
    url = f"{redis_url}?prefix={prefix}"
    asyncio.run(_prefixed_run(url, tag))
    admin = redis.Redis.from_url(redis_url)
    user, password = f"nestegg-reader-{tag}", uuid.uuid4().hex
    try:
        admin.delete(f"{prefix}store")
        before = sorted(admin.scan_iter(match=f"{prefix}*"))
        admin.acl_setuser(
            user,
            enabled=True,
            passwords=[f"+{password}"],
            keys=["*"],
            # as the README says: SELECT too for a database other than 0
            commands=["+@read", "+@scripting", "+multi", "+exec"]
            + (["+select"] if urlsplit(redis_url).path.strip("/") not in ("", "0") else []),
        )
        parts = urlsplit(redis_url)
        netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 6379}"
        as_reader = f"{parts._replace(netloc=netloc).geturl()}?prefix={prefix}"
        for where in (as_reader, url):
            for args in (["runs"], ["show", f"ok{tag}"]):
                result = nestegg(tmp_path, *args, "--store", where)
                assert result.returncode == EXIT_OK, (args, result.stdout, result.stderr)
                assert f"ok{tag}" in result.stdout
            assert sorted(admin.scan_iter(match=f"{prefix}*")) == before
    finally:
        admin.acl_deluser(user)
        admin.close()
        asyncio.run(_drop(url))


@pytest.mark.parametrize("server", ["postgres", "redis"])
def test_a_store_url_reaches_a_store_built_with_a_prefix_of_its_own(
    cli: Cli, pg_url: str, redis_url: str, server: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    url = (
        f"{pg_url}?table_prefix=own_{tag}_"
        if server == "postgres"
        else f"{redis_url}?prefix=own-{tag}:"
    )
    asyncio.run(_prefixed_run(url, tag))
    try:
        listed = json_of(cli("runs", "--json", "--store", url))
        assert sorted(row["run_id"] for row in listed) == sorted(
            f"{name}{tag}" for name in ("ok", "bad", "gone")
        )
        plain = cli("runs", "--json", "--store", url.split("?")[0])  # the default prefix
        if plain.exit_code == 0:
            assert not [row for row in json_of(plain) if row["run_id"].endswith(tag)]
        else:
            assert plain.exit_code == EXIT_NOT_FOUND, plain.stderr
    finally:
        asyncio.run(_drop(url))


async def _set_up(url: str, *, drop: bool = False) -> None:
    """Set the store at ``url`` up, and with ``drop`` drop it."""
    store = open_store(url)
    try:
        await store.setup()
        if drop:
            await store.drop()  # type: ignore[attr-defined]
    finally:
        await store.close()


async def _drop(url: str) -> None:
    await _set_up(url, drop=True)


def test_a_missing_relative_sqlite_file_is_named_with_the_absolute_spelling(
    tmp_path: Path,
) -> None:
    in_dir = nestegg(tmp_path, "runs", "--store", "sqlite:///no-such-dir/runs.db")
    assert in_dir.returncode == EXIT_NOT_FOUND
    assert in_dir.stderr == (
        "error: no store at sqlite:///no-such-dir/runs.db: no such file 'no-such-dir/runs.db' "
        "in the current directory (sqlite:/// names a relative path; an absolute one takes "
        "four slashes: sqlite:////no-such-dir/runs.db)\n"
    )
    here = nestegg(tmp_path, "runs", "--store", "sqlite:///no-such.db")
    assert here.stderr == (
        "error: no store at sqlite:///no-such.db: no such file 'no-such.db' in the current "
        "directory\n"
    )
    absolute = nestegg(tmp_path, "runs", "--store", f"sqlite:///{tmp_path / 'none.db'}")
    assert absolute.stderr.endswith(": no such file\n")
