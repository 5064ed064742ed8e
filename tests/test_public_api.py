"""The public surface of the nestegg package."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import nestegg
import nestegg.checkpoint
from nestegg.checkpoint.stores.registry import BY_NAME
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


@pytest.mark.parametrize("package", [nestegg, nestegg.checkpoint], ids=lambda p: p.__name__)
def test_each_name_is_its_module_s_and_the_one_type_checkers_see(package: ModuleType) -> None:
    # The names are imported when first used: each is the object of the module it is
    # listed with, and the imports type checkers read name the same module (the stores of
    # nestegg.checkpoint come through the registry: test_store_registry.py).
    homes: dict[str, str] = package._HOMES  # type: ignore[attr-defined]
    names = [name for name in package.__all__ if name != "__version__" and name not in BY_NAME]
    assert sorted(homes) == names
    for name, home in homes.items():
        assert getattr(package, name) is getattr(importlib.import_module(home), name), name
    assert package.__file__ is not None
    source = ast.parse(Path(package.__file__).read_text())
    checked = next(
        n for n in source.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    seen = {
        a.name: n.module for n in checked.body if isinstance(n, ast.ImportFrom) for a in n.names
    }
    assert {name: seen[name] for name in homes} == homes
    assert set(seen) - set(homes) <= set(BY_NAME)


@pytest.mark.parametrize(
    ("package", "name", "home"),
    [
        ("nestegg", "Clutch", "nestegg.clutch"),
        ("nestegg.checkpoint", "CheckpointConfig", "nestegg.checkpoint.config"),
    ],
)
def test_a_name_s_module_is_imported_when_the_name_is_used(
    package: str, name: str, home: str
) -> None:
    code = (
        f"import sys, {package}\n"
        f"before = {home!r} in sys.modules\n"
        f"from {package} import {name}\n"
        f"listed, typo = {name!r} in dir({package}), hasattr({package}, 'Cluth')\n"
        f"print(before, {name}.__module__, listed, typo)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert completed.stdout.split() == ["False", home, "True", "False"]
