"""What the command imports to start: what the command run uses, nothing else.

Each case runs the command in a fresh process, as the console script starts it, and
reads ``sys.modules`` as it ends. A module imported at the top of a module that declares
commands, where only a command's body needs it, is paid by every command: ``nestegg
--help`` took 0.4 s when the command's package imported the Clutch, pydantic and every
store (bench/cli_startup.py measures it).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nestegg.constants import HOME_ENV, STORE_ENV
from tests.cli.conftest import Filled, fill, store_url_for

ROOT = Path(__file__).resolve().parents[2]
CHILD = (
    "import atexit, json, sys\n"
    "listed = sys.argv.pop(1)\n"
    "atexit.register(lambda: open(listed, 'w').write(json.dumps(sorted(sys.modules))))\n"
    "sys.argv[0] = 'nestegg'\n"
    "from nestegg.cli import main\n"
    "main()\n"
)
"""The console script's ``main()``, writing the modules imported as it ends to a file."""

NEVER = (
    "aio_pika",
    "aiormq",
    "langgraph",
    "opentelemetry",
    "psycopg",
    "psycopg_pool",
    "redis",
    "starlette",
    "uvicorn",
    "nestegg.agents",
    "nestegg.checkpoint.admission",
    "nestegg.checkpoint.config",
    "nestegg.checkpoint.runs",
    "nestegg.checkpoint.stores.file",
    "nestegg.checkpoint.stores.memory",
    "nestegg.checkpoint.stores.postgres",
    "nestegg.checkpoint.stores.redis",
    "nestegg.clutch",
    "nestegg.execution",
    "nestegg.journal",
    "nestegg.pipeline",
    "nestegg.telemetry",
    "nestegg.transport",
    "nestegg.ui",
)
"""What reading a SQLite store does not use: the other stores and their drivers, the
brokers, the web inspector, telemetry and the Clutch."""

READING_NOTHING = (
    *NEVER,
    "asyncio",
    "orjson",
    "rich",
    "sqlite3",
    "nestegg.checkpoint",
    "nestegg.cli.reading",
    "nestegg.cli.render",
)
"""What a command that reads no store (help, usage) does not use either."""


def imported(tmp_path: Path, *args: str) -> list[str]:
    """The modules ``nestegg ARGS`` had imported when it ended (it must succeed)."""
    listed = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if k != STORE_ENV}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(listed), *args],
        cwd=ROOT,
        env={**env, HOME_ENV: str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)
    modules: list[str] = json.loads(listed.read_text())
    return modules


def among(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """The ``modules`` that are one of ``names`` or inside one of them."""
    return [m for m in modules if any(m == n or m.startswith(f"{n}.") for n in names)]


@pytest.fixture
def sqlite_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Filled]:
    """A SQLite store holding a completed, a failed and an interrupted run."""
    for url in store_url_for("sqlite", request, tmp_path):
        yield asyncio.run(fill(url))


@pytest.mark.parametrize("args", [["--help"], ["runs", "--help"], ["show", "--help"]], ids=" ".join)
def test_help_imports_no_store_nor_output(tmp_path: Path, args: list[str]) -> None:
    modules = imported(tmp_path, *args)
    assert not (unused := among(modules, READING_NOTHING)), unused
    assert among(modules, ("typer", "nestegg.cli.runs")) != []  # it did declare the commands


def test_importing_the_command_s_app_imports_no_store_nor_output() -> None:
    code = "import json, sys, nestegg.cli.app; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert not (unused := among(json.loads(done.stdout), READING_NOTHING)), unused


@pytest.mark.parametrize("command", ["runs", "show"])
def test_reading_a_sqlite_store_imports_that_store_only(
    tmp_path: Path, sqlite_store: Filled, command: str
) -> None:
    args = ["runs"] if command == "runs" else ["show", sqlite_store.ok]
    modules = imported(tmp_path, *args, "--store", sqlite_store.url)
    assert not (unused := among(modules, NEVER)), unused
    assert among(modules, ("nestegg.checkpoint.stores.sqlite", "rich")) != []  # it read, showed
