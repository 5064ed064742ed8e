"""``nestegg worker``: what it refuses (exit 2), in-process with typer's runner, and in a
process of its own for what happens while the pipeline's module is imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nestegg.cli import app
from nestegg.constants import EXIT_USAGE
from tests.transport.conftest import ROOT, Deployment

WORKER_EXIT_TIMEOUT_S = 30.0


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


@pytest.mark.server
def test_an_unknown_agent_is_bad_usage(deployment: Deployment) -> None:
    code, output = invoke("tests.transport.apps:chain", "--agents", "ping,pang")
    assert code == EXIT_USAGE
    assert "agents ['pang'] are not agents of Clutch 'chain'" in output


def worker_process(app_spec: str, **settings: str) -> subprocess.CompletedProcess[str]:
    """``nestegg worker app_spec`` in a process of its own, with ``NESTEGG_TEST_*``
    ``settings`` (see tests.transport.apps), until it exits."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update({f"NESTEGG_TEST_{name.upper()}": value for name, value in settings.items()})
    return subprocess.run(
        [sys.executable, "-m", "nestegg", "worker", app_spec],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WORKER_EXIT_TIMEOUT_S,
    )


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://[bad", "'redis://[bad': Invalid IPv6 URL"),
        (
            "redis://127.0.0.1:notaport/6",
            "'redis://127.0.0.1:notaport/6': Port could not be cast to integer value as 'notaport'",
        ),
        ("amqp://guest:guest@[bad/", "'amqp://guest@[bad/': Invalid IPv6 URL"),
    ],
)
def test_a_malformed_transport_url_is_bad_usage_in_one_line(url: str, reason: str) -> None:
    worker = worker_process("tests.transport.apps:chain", transport=url)
    assert worker.returncode == EXIT_USAGE
    assert worker.stderr == f"error: bad transport URL {reason}\n"
