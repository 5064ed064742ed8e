"""A caller in a process of its own, as the README runs one: ``asyncio.run(clutch.run(...))``
without ``async with clutch``, on Redis Streams and on RabbitMQ. The process prints its
result and exits with nothing on stderr (aio-pika's connection tasks must not be left
pending when ``asyncio.run`` closes its loop)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from tests.transport.apps import make_split
from tests.transport.conftest import ROOT, Deployment

pytestmark = pytest.mark.server

CALLER_TIMEOUT_S = 60.0

RUN_ONCE = """
import asyncio
from tests.transport.apps import make_split

print(asyncio.run(make_split().run({"x": 1}, timeout=20))["x"])
"""

GIVE_UP_WAITING = """
import asyncio
from tests.transport.apps import make_split

try:
    asyncio.run(make_split().run({"x": 1}, timeout=0.5))
except TimeoutError:
    print("timed out")
"""

SUBMIT_AND_LEAVE = """
import asyncio
from tests.transport.apps import make_split

async def main():
    await make_split().submit({"x": 1})
    await asyncio.sleep(0.2)

asyncio.run(main())
print("left")
"""

SUBMIT_AS_LAST_THING = """
import asyncio
from tests.transport.apps import make_split

asyncio.run(make_split().submit({"x": 1}, run_id="submitted"))
print("left")
"""

SUBMIT_IN_ASYNC_WITH = """
import asyncio
from tests.transport.apps import make_split

async def main():
    async with make_split() as split:
        await split.submit({"x": 1}, run_id="submitted")

asyncio.run(main())
print("left")
"""


def run_caller(deployment: Deployment, code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` with the deployment's settings, from the project's root."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=deployment.env(),
        capture_output=True,
        text=True,
        timeout=CALLER_TIMEOUT_S,
    )


def test_a_caller_that_ran_a_run_exits_without_a_word_on_stderr(deployment: Deployment) -> None:
    deployment.start_worker("split")
    caller = run_caller(deployment, RUN_ONCE)
    assert (caller.returncode, caller.stdout, caller.stderr) == (0, "1\n", "")


@pytest.mark.parametrize(
    ("code", "printed"), [(GIVE_UP_WAITING, "timed out\n"), (SUBMIT_AND_LEAVE, "left\n")]
)
def test_a_caller_that_leaves_its_run_to_the_workers_exits_without_a_word_on_stderr(
    deployment: Deployment, code: str, printed: str
) -> None:
    caller = run_caller(deployment, code)  # no worker: the run waits in its channel
    assert (caller.returncode, caller.stdout, caller.stderr) == (0, printed, "")


@pytest.mark.parametrize("code", [SUBMIT_AS_LAST_THING, SUBMIT_IN_ASYNC_WITH])
async def test_a_run_submitted_as_the_callers_loop_ends_is_stored_and_run_by_a_worker(
    deployment: Deployment, store: Any, code: str
) -> None:
    caller = run_caller(deployment, code)  # submit() returned, the loop closed at once
    assert (caller.returncode, caller.stdout, caller.stderr) == (0, "left\n", "")
    assert await store.get_run("submitted") is not None
    deployment.start_worker("split")  # its first step waits on the broker
    split = make_split()
    try:
        assert (await split.result("submitted", timeout=20))["x"] == 1
    finally:
        await split.stop()
