"""The public surface of the nestegg package."""

from __future__ import annotations

import subprocess
import sys

import nestegg
from nestegg.clutch import Clutch
from nestegg.context import get_context
from nestegg.signals import Handover, Terminate, handover
from nestegg.strategies import Strategy
from nestegg.task import ClutchTask, StepEvent

REQUIRED = {
    "Clutch": Clutch,
    "Strategy": Strategy,
    "Terminate": Terminate,
    "Handover": Handover,
    "handover": handover,
    "StepEvent": StepEvent,
    "ClutchTask": ClutchTask,
    "get_context": get_context,
}


def test_all_is_sorted_and_unique() -> None:
    assert nestegg.__all__ == sorted(nestegg.__all__)
    assert len(set(nestegg.__all__)) == len(nestegg.__all__)


def test_all_holds_the_eggai_clutch_names() -> None:
    for name, obj in REQUIRED.items():
        assert name in nestegg.__all__
        assert getattr(nestegg, name) is obj


def test_every_exported_name_exists() -> None:
    for name in nestegg.__all__:
        assert hasattr(nestegg, name), name


def test_version_is_a_string() -> None:
    assert isinstance(nestegg.__version__, str) and nestegg.__version__


def test_importing_nestegg_does_not_import_optional_drivers() -> None:
    code = (
        "import sys, nestegg\n"
        "loaded = sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('psycopg', 'psycopg_pool', 'redis'))\n"
        "print(','.join(loaded))\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.strip() == ""
