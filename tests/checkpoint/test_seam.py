"""The seam between the orchestrator and checkpointing: checkpointing reaches a Clutch only
through the public ``Pipeline`` methods, and the CLI points a Clutch at another store with
``Clutch.using_store``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from nestegg import Clutch, get_context
from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage
from nestegg.checkpoint.checkpointer import Checkpointer
from nestegg.errors import ConfigurationError

CHECKPOINT = Path(__file__).resolve().parents[2] / "nestegg" / "checkpoint"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports anywhere (top level, in functions, TYPE_CHECKING)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_checkpoint_module_imports_the_clutch() -> None:
    offenders = [
        str(path.relative_to(CHECKPOINT))
        for path in sorted(CHECKPOINT.rglob("*.py"))
        if any(
            name == "nestegg.clutch" or name.startswith("nestegg.clutch.")
            for name in imported_modules(path)
        )
        or "nestegg.Clutch" in imported_modules(path)
    ]
    assert offenders == []


def test_the_checkpointer_does_not_import_the_execution() -> None:
    assert not any(
        name.startswith("nestegg.execution")
        for name in imported_modules(CHECKPOINT / "checkpointer.py")
    )


async def test_a_checkpointed_step_runs_with_its_checkpointer_from_the_first_step() -> None:
    seen: list[object] = []
    clutch = Clutch("seam", checkpoint=CheckpointConfig(storage=MemoryCheckpointStorage()))

    @clutch.agent()
    async def first(data: int) -> int:
        context = get_context()
        assert context is not None and context._execution is not None
        seen.append(context._execution.recorder)
        return data + 1

    assert await clutch.run(1, run_id="r") == 2
    assert [type(recorder) for recorder in seen] == [Checkpointer]


async def test_using_store_points_the_clutch_at_another_store_for_the_block() -> None:
    own, other = MemoryCheckpointStorage(), MemoryCheckpointStorage()
    clutch = Clutch("seam", checkpoint=CheckpointConfig(storage=own))

    @clutch.agent()
    async def double(data: int) -> int:
        return data * 2

    with clutch.using_store(other) as same:
        assert same is clutch
        assert await clutch.run(2, run_id="there") == 4
        assert [r.run_id for r in await clutch.list_runs()] == ["there"]
    assert await clutch.list_runs() == []
    assert await clutch.run(3, run_id="here") == 6
    assert await own.get_run("here") is not None and await other.get_run("here") is None
    assert await other.get_run("there") is not None


def test_using_store_without_checkpointing_raises_configuration_error() -> None:
    with (
        pytest.raises(ConfigurationError, match="no checkpointing"),
        Clutch("plain").using_store(MemoryCheckpointStorage()),
    ):
        pass
