"""A caller in a process of its own, as the README runs one: ``asyncio.run(clutch.run(...))``
without ``async with clutch``, on Redis Streams and on RabbitMQ. The process prints its
result and exits with nothing on stderr (aio-pika's connection tasks must not be left
pending when ``asyncio.run`` closes its loop)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from typing import Any

import pytest

from tests.servers import delete_redis_keys
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


UNANSWERED = """
import asyncio, sys
from nestegg.errors import TransportError
from tests.transport.apps import make_split

try:
    asyncio.run(make_split().run({"x": 1}, timeout=float(sys.argv[1])))
except TransportError as error:
    print(error)
"""
UNANSWERED_EXIT_S = 20.0
"""Seconds a caller whose broker does not answer gets to exit (its run's timeout is 10 s
and its connection's 1 s, or its run's 1 s and its connection's 5 s)."""


def run_caller(
    env: dict[str, str], code: str, timeout: float = CALLER_TIMEOUT_S, *args: str
) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` with environment ``env`` (a deployment's), from the
    project's root, within ``timeout`` seconds."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_caller_that_ran_a_run_exits_without_a_word_on_stderr(deployment: Deployment) -> None:
    deployment.start_worker("split")
    caller = run_caller(deployment.env(), RUN_ONCE)
    assert (caller.returncode, caller.stdout, caller.stderr) == (0, "1\n", "")


@pytest.mark.parametrize(
    ("code", "printed"), [(GIVE_UP_WAITING, "timed out\n"), (SUBMIT_AND_LEAVE, "left\n")]
)
def test_a_caller_that_leaves_its_run_to_the_workers_exits_without_a_word_on_stderr(
    deployment: Deployment, code: str, printed: str
) -> None:
    caller = run_caller(deployment.env(), code)  # no worker: the run waits in its channel
    assert (caller.returncode, caller.stdout, caller.stderr) == (0, printed, "")


@pytest.mark.parametrize("code", [SUBMIT_AS_LAST_THING, SUBMIT_IN_ASYNC_WITH])
async def test_a_run_submitted_as_the_callers_loop_ends_is_stored_and_run_by_a_worker(
    deployment: Deployment, store: Any, code: str
) -> None:
    caller = run_caller(deployment.env(), code)  # submit() returned, the loop closed at once
    assert (caller.returncode, caller.stdout, caller.stderr) == (0, "left\n", "")
    assert await store.get_run("submitted") is not None
    deployment.start_worker("split")  # its first step waits on the broker
    split = make_split()
    try:
        assert (await split.result("submitted", timeout=20))["x"] == 1
    finally:
        await split.stop()


@pytest.mark.parametrize(
    ("listening", "timeout", "handshake"),
    [(True, "10", r"1"), (True, "1", r"0\.\d+|1"), (False, "10", None)],
    ids=["silent-port", "silent-port-run-timeout-first", "closed-port"],
)
async def test_a_caller_whose_broker_does_not_answer_gets_a_transport_error_and_exits(
    redis_url: str,
    silent_port: int,
    closed_port: int,
    listening: bool,
    timeout: str,
    handshake: str | None,
) -> None:
    """The run's timeout ending before the connection's opening does (1 s, and the
    transport's 5 s) gives the same TransportError as the opening timing out first."""
    pytest.importorskip("aio_pika")
    from nestegg.checkpoint.ownership import run_state
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    port = silent_port if listening else closed_port
    prefix = f"nestegg-unanswered-{uuid.uuid4().hex[:10]}:"
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        NESTEGG_TEST_REDIS_URL=redis_url,
        NESTEGG_TEST_PREFIX=prefix,
        NESTEGG_TEST_TRANSPORT=f"amqp://guest:guest@127.0.0.1:{port}/",
    )
    if timeout == "10":
        env["NESTEGG_TEST_CONNECT_TIMEOUT"] = "1"
    store = RedisCheckpointStorage(redis_url, prefix=prefix)
    try:
        caller = run_caller(env, UNANSWERED, UNANSWERED_EXIT_S, timeout)
        run_id = caller.stdout.partition("; run '")[2].partition("'")[0]
        stored = await store.get_run(run_id)
    finally:
        await store.close()
        await delete_redis_keys(redis_url, prefix)
    assert caller.returncode == 0, caller.stderr
    assert caller.stdout.startswith(f"RabbitMQ: connecting to 127.0.0.1:{port}/ failed: ")
    # the run is stored: the error says what becomes of it
    reason, _, fate = caller.stdout.partition("; run ")
    assert re.fullmatch(
        r"'[^']+' is stored, queued for workers: a worker's sweep publishes it once it has "
        r"been untouched for sweep_after \(five leases by default\), and await "
        r"clutch.result\('[^']+'\) waits for it; await clutch.cancel\('[^']+'\) keeps every "
        r"worker from running it\n",
        fate,
    ), caller.stdout
    assert stored is not None and run_state(stored, stored.updated_at) == "queued"
    assert caller.stderr == ""  # no reconnection left running, no line of aio-pika's
    if handshake is not None:
        assert re.search(
            rf"no AMQP handshake within ({handshake}) s \(is it a RabbitMQ port\?\)$", reason
        ), reason
