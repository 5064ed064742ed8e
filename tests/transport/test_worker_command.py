"""``nestegg worker``: what it refuses (exit 2), in-process with typer's runner, and in a
process of its own for what happens while the pipeline's module is imported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from nestegg.cli import app
from nestegg.constants import EXIT_OK, EXIT_USAGE
from nestegg.urls import without_password
from tests.conftest import server_missing
from tests.servers import delete_redis_keys
from tests.transport.apps import make_chain
from tests.transport.conftest import (
    DEFAULT_RABBITMQ_URL,
    RABBITMQ_URL_ENV,
    ROOT,
    Deployment,
    rabbitmq_unreachable,
)

WORKER_EXIT_TIMEOUT_S = 30.0
RETRIES_SEEN_AFTER_S = 3.0
"""Seconds a worker whose broker cannot be reached gets to try (again every second)."""
STORE_RETRIES_SEEN_AFTER_S = 5.0
"""Seconds a worker whose store is unavailable gets to try (each try of the Redis store
takes about 2 s of its own retries, then the worker waits a second)."""
STOPPED_WITHIN_S = 3.0
"""Seconds a worker that is not serving yet gets to exit after SIGTERM."""


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["worker", *args])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def test_a_clutch_without_a_transport_is_bad_usage() -> None:
    code, output = invoke("tests.cli.pipeline_app:pipeline")
    assert code == EXIT_USAGE
    assert "has no transport=" in output


def test_a_spec_without_an_attribute_is_bad_usage_named_as_the_argument() -> None:
    code, output = invoke("tests.transport.apps")
    assert code == EXIT_USAGE
    assert "APP_SPEC must look like module:attribute, got 'tests.transport.apps'" in output


def test_a_module_that_cannot_be_imported_is_bad_usage() -> None:
    code, output = invoke("tests.transport.no_such_module:chain")
    assert code == EXIT_USAGE
    assert "cannot import 'tests.transport.no_such_module'" in output


def test_a_module_that_fails_while_imported_is_bad_usage_naming_where() -> None:
    code, output = invoke("tests.cli.boom_app:pipeline")
    where = os.path.relpath(ROOT / "tests" / "cli" / "boom_app.py")
    assert code == EXIT_USAGE
    assert (
        f"error: cannot import 'tests.cli.boom_app': RuntimeError: boom (at {where}, line 3) "
        "(nestegg --debug shows the traceback)\n"
    ) in output


@pytest.mark.server
def test_an_unknown_agent_is_bad_usage(deployment: Deployment) -> None:
    code, output = invoke("tests.transport.apps:chain", "--agents", "ping,pang")
    assert code == EXIT_USAGE
    assert "agents ['pang'] are not agents of Clutch 'chain'" in output


@pytest.mark.server
async def test_a_worker_says_once_on_stderr_that_it_serves_and_what(
    deployment: Deployment,
) -> None:
    worker = deployment.start_worker("chain", "--agents", "pong,ping", "--concurrency", "2")
    caller = make_chain()
    try:
        await caller.run({}, run_id="served", timeout=30)
    finally:
        await caller.stop()
    worker.terminate()
    assert worker.wait(WORKER_EXIT_TIMEOUT_S) == EXIT_OK
    broker = without_password(deployment.transport_url)
    assert worker.errors().splitlines() == [
        f"nestegg worker: serving pipeline 'chain' (agents pong, ping; concurrency 2) from "
        f"{broker}, store redis at {without_password(deployment.redis_url)}, key prefix "
        f"{deployment.prefix!r}; SIGTERM or Ctrl-C stops it"
    ]


@pytest.mark.parametrize("agents", ["", "ping,,pong", "ping,"])
def test_an_empty_agent_name_is_bad_usage(agents: str) -> None:
    code, output = invoke("tests.transport.apps:chain", "--agents", agents)
    assert code == EXIT_USAGE
    assert f"--agents must name agents, separated by commas (a,b), got {agents!r}" in output


def worker_env(settings: dict[str, str]) -> dict[str, str]:
    """This process's environment with the project importable and ``settings`` as
    ``NESTEGG_TEST_*`` variables."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update({f"NESTEGG_TEST_{name.upper()}": value for name, value in settings.items()})
    return env


def worker_process(app_spec: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``nestegg worker app_spec`` in a process of its own, with ``NESTEGG_TEST_*``
    ``settings`` (see tests.transport.apps), until it exits."""
    return subprocess.run(
        [sys.executable, "-m", "nestegg", "worker", app_spec],
        cwd=ROOT,
        env=worker_env(settings),
        capture_output=True,
        text=True,
        timeout=WORKER_EXIT_TIMEOUT_S,
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://[bad", "'redis://[bad': its host or port cannot be read"),
        ("redis://127.0.0.1:notaport/6", "'redis://127.0.0.1:notaport/6': its host or port"),
        ("amqp://guest:guest@[bad/", "'amqp://guest@[bad/': its host or port cannot be read"),
    ],
)
def test_a_malformed_transport_url_is_bad_usage_in_one_line(url: str, reason: str) -> None:
    worker = worker_process("tests.transport.apps:chain", transport=url)
    assert worker.returncode == EXIT_USAGE
    assert worker.stderr.startswith(f"error: bad transport URL {reason}")
    assert len(worker.stderr.splitlines()) == 1


@pytest.fixture
async def store_settings(redis_url: str) -> AsyncIterator[dict[str, str]]:
    """A worker's store (the test Redis, under a prefix of its own, deleted afterwards)."""
    prefix = f"nestegg-refused-{uuid.uuid4().hex[:10]}:"
    yield {"redis_url": redis_url, "prefix": prefix}
    await delete_redis_keys(redis_url, prefix)


def refused_url(setting: str, redis_url: str) -> str:
    """A broker URL the test servers refuse, as named by ``setting``; skips the test
    (fails under CI=true) when RabbitMQ cannot be reached."""
    redis_host = redis_url.partition("://")[2].rpartition("@")[2].split("/")[0]
    if setting == "redis-login":
        return f"redis://nestegg-nobody:wrong-secret@{redis_host}/0"
    if setting == "redis-database":
        return f"redis://{redis_host}/4096"
    url = os.environ.get(RABBITMQ_URL_ENV) or DEFAULT_RABBITMQ_URL
    reason = rabbitmq_unreachable(url)
    if reason:
        server_missing(reason)
    rabbit_host = url.rpartition("@")[2].split("/")[0]
    if setting == "rabbitmq-login":
        return f"amqp://guest:wrong-secret@{rabbit_host}/"
    if setting == "rabbitmq-tls":  # TLS asked of the plain AMQP port
        return f"amqps://guest:guest@{rabbit_host}/"
    return f"amqp://guest:guest@{rabbit_host}/nestegg-no-such-vhost"


@pytest.mark.server
@pytest.mark.parametrize(
    ("setting", "refusal"),
    [
        (
            "rabbitmq-login",
            "RabbitMQ at amqp://guest@{host}/ refused to log user 'guest' in: ACCESS_REFUSED - "
            "Login was refused",
        ),
        (
            "rabbitmq-vhost",
            "RabbitMQ at amqp://guest@{host}/nestegg-no-such-vhost refused to open vhost "
            "'nestegg-no-such-vhost': it does not exist, user 'guest' may not access it, or a "
            "connection limit is reached",
        ),
        (
            "rabbitmq-tls",
            "RabbitMQ at amqps://guest@{host}/ answered no TLS handshake (WRONG_VERSION_NUMBER): "
            "amqps:// needs the broker's TLS listener (port 5671 by default); a plain AMQP port "
            "takes amqp://",
        ),
        (
            "redis-login",
            "Redis at redis://nestegg-nobody@{host}/0 refused the login: invalid "
            "username-password pair",
        ),
        (
            "redis-database",
            "Redis at redis://{host}/4096 has no such database: DB index is out of range",
        ),
    ],
)
def test_a_broker_that_refuses_the_settings_ends_the_worker_at_start_in_one_line(
    store_settings: dict[str, str], setting: str, refusal: str
) -> None:
    url = refused_url(setting, store_settings["redis_url"])
    worker = worker_process("tests.transport.apps:chain", transport=url, **store_settings)
    host = urlsplit(url).netloc.rpartition("@")[2]
    assert worker.returncode == EXIT_USAGE
    *tries, last = worker.stderr.splitlines()
    assert last.startswith(f"error: {refusal.format(host=host)}")  # one line, no traceback
    # tried again for REFUSED_FOR seconds first (a refusal that passes does not stop it)
    assert tries and all("was refused, trying again" in line for line in tries), tries
    assert all("setting up nestegg.chain." in line and "[" not in line for line in tries), tries
    assert "secret" not in worker.stderr


def started_worker(app_spec: str, **settings: str) -> subprocess.Popen[str]:
    """``nestegg worker app_spec`` started in a process of its own with ``NESTEGG_TEST_*``
    ``settings`` (see tests.transport.apps), its stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "nestegg", "worker", app_spec],
        cwd=ROOT,
        env=worker_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stopped_after(process: subprocess.Popen[str], seconds: float) -> str:
    """SIGTERM ``process`` after ``seconds`` (it must still run then) and its stderr; it
    must exit within STOPPED_WITHIN_S seconds of the signal."""
    try:
        time.sleep(seconds)
        assert process.poll() is None, process.communicate()[1]  # still retrying
        process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _, errors = process.communicate(timeout=WORKER_EXIT_TIMEOUT_S)
        took = time.monotonic() - signalled
    finally:
        process.kill()
        process.wait()
    assert took < STOPPED_WITHIN_S, (took, errors)
    return errors


@pytest.mark.server
def test_a_broker_that_cannot_be_reached_at_start_is_retried_until_stopped(
    store_settings: dict[str, str], closed_port: int
) -> None:
    port = closed_port
    transport = f"redis://127.0.0.1:{port}/0"
    process = started_worker("tests.transport.apps:chain", transport=transport, **store_settings)
    errors = stopped_after(process, RETRIES_SEEN_AFTER_S)
    assert process.returncode == EXIT_OK
    retries = [line for line in errors.splitlines() if line.startswith("warning: setting up")]
    assert retries, errors
    assert "serving" not in errors  # never connected: no start line
    assert f"Error 111 connecting to 127.0.0.1:{port}" in retries[0]


@pytest.mark.server
def test_a_worker_shows_its_own_retry_warnings_and_not_the_broker_clients_lines(
    store_settings: dict[str, str], closed_port: int
) -> None:
    pytest.importorskip("aio_pika")
    transport = f"amqp://guest:guest@127.0.0.1:{closed_port}/"
    process = started_worker("tests.transport.apps:chain", transport=transport, **store_settings)
    errors = stopped_after(process, RETRIES_SEEN_AFTER_S)
    lines = errors.splitlines()
    assert lines, errors
    assert all(line.startswith("warning: setting up") for line in lines), errors
    assert lines[0].startswith("warning: setting up nestegg.chain"), errors  # no list
    assert f"Connect call failed ('127.0.0.1', {closed_port})" in lines[0]
    assert "error when creating transport" not in errors  # aiormq's own line


@pytest.mark.server
@pytest.mark.parametrize(
    ("connect_timeout", "retried"),
    [("1", True), ("60", False)],  # SIGTERM after some attempts, or during the first
    ids=["retried", "stopped-while-connecting"],
)
def test_a_port_that_does_not_speak_amqp_is_retried_as_an_unreachable_broker_until_stopped(
    store_settings: dict[str, str], silent_port: int, connect_timeout: str, retried: bool
) -> None:
    pytest.importorskip("aio_pika")
    transport = f"amqp://guest:guest@127.0.0.1:{silent_port}/"
    process = started_worker(
        "tests.transport.apps:chain",
        transport=transport,
        connect_timeout=connect_timeout,
        **store_settings,
    )
    errors = stopped_after(process, RETRIES_SEEN_AFTER_S)
    assert process.returncode == EXIT_OK
    failure = (
        f"RabbitMQ: connecting to 127.0.0.1:{silent_port}/ failed: no AMQP handshake within "
        f"{connect_timeout} s (is it a RabbitMQ port?)"
    )
    lines = errors.splitlines()
    assert bool(lines) == retried, errors
    assert all(line.startswith("warning: setting up") for line in lines), errors
    assert all(line.endswith(failure) for line in lines), errors


@pytest.mark.server
def test_a_store_that_is_unavailable_at_start_is_waited_for_until_stopped(
    store_settings: dict[str, str], closed_port: int
) -> None:
    store = f"redis://127.0.0.1:{closed_port}/0"  # the broker is the test Redis
    settings = {**store_settings, "redis_url": store, "transport": store_settings["redis_url"]}
    process = started_worker("tests.transport.apps:chain", **settings)
    errors = stopped_after(process, STORE_RETRIES_SEEN_AFTER_S)
    assert process.returncode == EXIT_OK
    lines = errors.splitlines()
    assert all(line.startswith("warning: ") for line in lines), errors
    assert any(
        line.startswith(
            f"warning: setting up the store of pipeline 'chain' failed: Redis at {store} is "
            f"unavailable: Error 111 connecting to 127.0.0.1:{closed_port}"
        )
        for line in lines
    ), errors
    assert "serving" not in errors  # never set up: no start line
