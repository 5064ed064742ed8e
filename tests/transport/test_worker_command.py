"""``nestegg worker``: what it refuses (exit 2), in-process with typer's runner."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from nestegg.cli import app
from nestegg.constants import EXIT_USAGE
from tests.transport.conftest import Deployment


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
