"""Running ``nestegg ui`` as a real process and driving a real headless Chromium.

Chromium comes from Debian's package (``/usr/bin/chromium``; `.ci/browser` installs it):
Playwright's Python package drives it, since its own browser download is not possible
everywhere. Without it the browser tests skip, and fail under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.error import URLError
from urllib.request import urlopen

from nestegg.constants import HOME_ENV, STORE_ENV
from tests.conftest import server_missing
from tests.stores.private_servers import free_port

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
START_SECONDS = 30
STOP_SECONDS = 15


@dataclass
class Server:
    """A running ``nestegg ui`` process."""

    process: subprocess.Popen[str]
    base: str
    token: str
    output: list[str]


def child_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a child process: unbuffered, its own NESTEGG_HOME, no store set."""
    env = {k: v for k, v in os.environ.items() if k != STORE_ENV}
    return {**env, HOME_ENV: str(home), "PYTHONUNBUFFERED": "1", **extra}


@contextmanager
def ui_server(home: Path, *args: str, **env: str) -> Iterator[Server]:
    """``nestegg ui ARGS`` on a free port (``env`` added to its environment), ready to
    answer at its ``--host`` (127.0.0.1 by default); stopped (SIGTERM) afterwards."""
    port = free_port()
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    command = [sys.executable, "-m", "nestegg.cli", "ui", "--port", str(port), *args]
    process = subprocess.Popen(
        command, cwd=ROOT, env=child_env(home, **env), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    output: list[str] = []
    token = ""
    try:
        while not output or not output[-1].startswith("Ctrl-C"):
            line = process.stdout.readline()
            assert line, f"nestegg ui ended: {''.join(output)}"
            output.append(line)
            if line.startswith("write token: "):
                token = line.split(": ", 1)[1].strip()
        base = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        _wait_until_up(base, process, output)
        yield Server(process, base, token, output)
    finally:
        stop(process)


def _wait_until_up(base: str, process: subprocess.Popen[str], output: list[str]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while True:
        assert process.poll() is None, f"nestegg ui ended: {''.join(output)}"
        try:
            with urlopen(base + "/static/app.css", timeout=1) as response:
                if response.status == 200:
                    return
        except (URLError, OSError):
            pass
        assert time.monotonic() < deadline, "nestegg ui did not answer"
        time.sleep(0.1)


def stop(process: subprocess.Popen[Any]) -> int:
    """SIGTERM, then SIGKILL if it does not end; its exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
    return process.wait()


def run_apart(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine in a thread of its own (Playwright's sync API holds this thread's
    event loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


def launch_chromium(playwright: Any) -> Any:
    """Debian's Chromium, headless (skips, or fails under CI=true, when it is missing)."""
    if not os.path.exists(CHROMIUM):
        server_missing(f"Chromium is missing at {CHROMIUM}: apt-get install chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
