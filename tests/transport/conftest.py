"""Fixtures of the transport tests: a broker (Redis Streams, RabbitMQ), an isolated key
prefix per test, and worker processes started with ``nestegg worker``.

Every test gets its own prefix for the Redis store, the streams or queues and the
side-effect counters; all of it is deleted afterwards. An unreachable server skips the
test with one line (fails under ``CI=true``, see tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import reachable_url
from tests.servers import delete_redis_keys

RABBITMQ_URL_ENV = "NESTEGG_TEST_RABBITMQ_URL"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
ROOT = Path(__file__).resolve().parents[2]
WORKER_START_TIMEOUT_S = 15.0
STACK_DUMP_WAIT_S = 2.0
"""Seconds a worker that did not exit gets to write its stacks before it is killed."""
BROKERS = ("redis", "rabbitmq")


@cache
def rabbitmq_unreachable(url: str) -> str | None:
    """Why RabbitMQ at ``url`` cannot be used, or None if its port answers."""
    try:
        import aio_pika  # noqa: F401
    except ImportError:
        return "aio-pika is not installed: pip install 'nestegg[rabbitmq]'"
    host_port = url.rpartition("@")[2].split("/")[0]
    host, _, port = host_port.partition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port or 5672)), timeout=3):
            return None
    except OSError as error:
        return f"RabbitMQ unreachable at {host_port}: {error}"


@dataclass
class Deployment:
    """One test's pipeline settings, as environment for worker and caller processes."""

    redis_url: str
    prefix: str
    broker: str
    lease: float = 2.0
    slow: float = 0.0
    pace: float = 0.0
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def transport_url(self) -> str:
        """The broker URL workers and callers use."""
        if self.broker == "redis":
            return self.redis_url
        return os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL

    def env(self) -> dict[str, str]:
        """The environment of a process of this deployment."""
        env = dict(os.environ)
        env.update(
            NESTEGG_TEST_REDIS_URL=self.redis_url,
            NESTEGG_TEST_PREFIX=self.prefix,
            NESTEGG_TEST_TRANSPORT=self.transport_url,
            NESTEGG_TEST_LEASE=str(self.lease),
            NESTEGG_TEST_SLOW=str(self.slow),
            NESTEGG_TEST_PACE=str(self.pace),
            PYTHONPATH=str(ROOT),
        )
        return env

    async def nestegg(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``nestegg ARGS`` run in a process of this deployment (in a thread, so that this
        test's loop goes on meanwhile), its output captured."""
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "nestegg", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )

    def apply(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Use these settings in this process too (pipelines built from now on)."""
        for key, value in self.env().items():
            if key.startswith("NESTEGG_TEST_"):
                monkeypatch.setenv(key, value)

    def start_worker(
        self, app: str, *options: str, module: str = "tests.transport.apps"
    ) -> WorkerProcess:
        """A ``nestegg worker <module>:<app>`` process, consuming once started."""
        command = [sys.executable, "-m", "nestegg", "worker", f"{module}:{app}"]
        worker = WorkerProcess(
            subprocess.Popen(
                [*command, *options],
                cwd=ROOT,
                env=self.env(),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        )
        self.workers.append(worker)
        return worker

    def stop_all(self) -> None:
        """SIGKILL every worker still running."""
        for worker in self.workers:
            worker.kill()


@dataclass
class WorkerProcess:
    """A worker process."""

    process: subprocess.Popen[bytes]

    @property
    def alive(self) -> bool:
        """Whether it still runs."""
        return self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL it and reap it."""
        if self.alive:
            self.process.kill()
        self.process.wait()

    def terminate(self) -> None:
        """SIGTERM it (it drains)."""
        self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """Its exit code, waiting up to ``timeout`` seconds.

        Raises:
            AssertionError: it still runs then; with its threads' and tasks' stacks
                (SIGUSR1, see tests.transport.apps) and what it wrote to stderr.
        """
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(STACK_DUMP_WAIT_S)
            self.kill()
            raise AssertionError(
                f"worker {self.process.pid} still ran {timeout} s later:\n{self.errors()}"
            ) from None

    def errors(self) -> str:
        """What it wrote to stderr (once it exited)."""
        assert self.process.stderr is not None
        return self.process.stderr.read().decode(errors="replace")


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The test RabbitMQ URL; skips (fails under CI=true) if it cannot be reached."""
    return reachable_url(RABBITMQ_URL_ENV, DEFAULT_RABBITMQ_URL, rabbitmq_unreachable)


@pytest.fixture(params=[pytest.param(b, marks=pytest.mark.server) for b in BROKERS])
async def deployment(
    request: pytest.FixtureRequest, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Deployment]:
    """A fresh prefix on the test Redis with Redis Streams, then with RabbitMQ; used in
    this process too; workers killed and everything under the prefix deleted after."""
    broker = request.param
    if broker == "rabbitmq":
        request.getfixturevalue("rabbitmq_url")  # reachable, else skipped (failed under CI)
    prefix = f"nestegg-transport-{uuid.uuid4().hex[:10]}:"
    deployed = Deployment(redis_url=redis_url, prefix=prefix, broker=broker)
    deployed.apply(monkeypatch)
    try:
        yield deployed
    finally:
        deployed.stop_all()
        if broker == "rabbitmq":
            await _delete_queues(deployed)  # their names are kept under the prefix
        await delete_redis_keys(redis_url, prefix)


@pytest.fixture
async def store(deployment: Deployment) -> AsyncIterator[Any]:
    """The deployment's store, opened in the test."""
    from nestegg.checkpoint.stores.redis import RedisCheckpointStorage

    opened = RedisCheckpointStorage(deployment.redis_url, prefix=deployment.prefix)
    await opened.setup()
    yield opened
    await opened.close()


async def _delete_queues(deployed: Deployment) -> None:
    """Delete every queue the test declared, in this process or in a worker's (recorded
    under the prefix by :func:`tests.transport.apps.transport`)."""
    import redis.asyncio as aioredis

    from nestegg.transport.rabbitmq import RabbitMQTransport
    from tests.transport.apps import QUEUES_KEY

    client = aioredis.Redis.from_url(deployed.redis_url)
    try:
        recorded = await client.smembers(f"{deployed.prefix}{QUEUES_KEY}")
    finally:
        await client.aclose()
    transport = RabbitMQTransport(deployed.transport_url, prefix=deployed.prefix)
    try:
        await transport.delete_channels(sorted(name.decode() for name in recorded))
    finally:
        await transport.close()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that takes connections and never says a word (another
    server's port, not a broker's): the kernel completes the handshakes, nothing reads."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield server.getsockname()[1]


async def wait_until(check: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll ``check()`` until true (the loop runs meanwhile); AssertionError naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)
