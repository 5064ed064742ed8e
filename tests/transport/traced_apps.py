"""The pipelines of :mod:`tests.transport.apps` in worker processes that trace to files.

Importing it installs the OpenTelemetry SDK in the process: every ended span is appended
to ``spans-<pid>.jsonl`` in the folder ``NESTEGG_TEST_TELEMETRY`` names (at once, so that
what a killed worker ended is there), and the metric points are written to
``metrics-<pid>.json`` when the process exits normally (a worker stopped with SIGTERM).
"""

from __future__ import annotations

import atexit
import json
import os
from pathlib import Path

from nestegg import Clutch
from tests.otel_sdk import (
    TELEMETRY_ENV,
    JsonLinesSpanExporter,
    Sdk,
    install_sdk,
    metrics_file,
    spans_file,
)
from tests.transport import apps


def _install() -> None:
    folder = Path(os.environ[TELEMETRY_ENV])
    pid = os.getpid()
    sdk = install_sdk(JsonLinesSpanExporter(spans_file(folder, pid)))

    def dump(installed: Sdk = sdk) -> None:
        metrics_file(folder, pid).write_text(json.dumps(installed.metrics()))

    atexit.register(dump)


_install()


def __getattr__(name: str) -> Clutch:
    """``traced_apps:chain``, ``traced_apps:slow``, ...: as in :mod:`tests.transport.apps`."""
    made: Clutch = getattr(apps, name)
    return made
