"""Run ids and agent names are checked before anything touches the store."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import MAX_NAME_LENGTH
from nestegg.errors import InvalidIdentifierError
from nestegg.identifiers import check_name

from .conftest import Pipeline, config

BAD_IDS = [
    "a/b",
    "/etc/passwd",
    "..",
    "../escape",
    "a/../b",
    "a\\b",
    "..\\escape",
    "a\x00b",
    "\x00",
    "a\nb",
    "a\udcffb",  # the byte 0xff of a command line that is not UTF-8
    "\ud800",
    "",
    "x" * (MAX_NAME_LENGTH + 1),
    "y" * 10_000,
]
GOOD_IDS = ["x" * MAX_NAME_LENGTH, "rün-ÿ-データ", "with space", "a.b", "-dash"]


class Spy:
    """A store that records every call made to it."""

    def __init__(self, inner: CheckpointStorage) -> None:
        self.inner = inner
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args))
            return await method(*args, **kwargs)

        return call

    def used(self) -> list[str]:
        return [name for name, _ in self.calls if name != "setup"]


def tree(root: Path) -> list[str]:
    """Every path under ``root`` (the store's files and directories)."""
    return sorted(
        os.path.relpath(os.path.join(top, name), root)
        for top, dirs, files in os.walk(root)
        for name in [*dirs, *files]
        if not name.endswith(("-shm", "-wal"))
    )


def spied_pipeline(store: CheckpointStorage) -> tuple[Pipeline, Spy]:
    spy = Spy(store)
    return Pipeline(spy), spy  # type: ignore[arg-type]


def operations(clutch: Clutch, bad: str) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def submitted() -> Any:
        task = await clutch.submit([], run_id=bad)
        return await task.result(timeout=5)

    async def streamed() -> Any:
        return [event async for event in clutch.stream([], run_id=bad)]

    return {
        "run": lambda: clutch.run([], run_id=bad),
        "submit": submitted,
        "stream": streamed,
        "resume_latest": lambda: clutch.resume_latest(bad),
        "delete_run": lambda: clutch.delete_run(bad),
        "events": lambda: clutch.events(bad),
        "list_checkpoints": lambda: clutch.list_checkpoints(bad),
    }


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda v: repr(v[:20]))
async def test_a_bad_run_id_is_refused_before_the_store_is_touched(
    bad: str, checkpoint_store: CheckpointStorage, store_root: Path
) -> None:
    pipeline, spy = spied_pipeline(checkpoint_store)
    files = tree(store_root)
    for name, operation in operations(pipeline.clutch, bad).items():
        with pytest.raises(InvalidIdentifierError):
            await operation()
        assert spy.used() == [], f"{name} used the store: {spy.calls}"
    assert tree(store_root) == files
    assert pipeline.calls == []
    assert await checkpoint_store.list_runs() == []


@pytest.mark.parametrize("bad", [*BAD_IDS, 5, b"r1"], ids=lambda v: repr(v)[:20])
def test_a_bad_configured_run_id_is_refused_when_the_config_is_built(bad: Any) -> None:
    with pytest.raises(InvalidIdentifierError) as refused:
        CheckpointConfig(run_id=bad)
    with pytest.raises(InvalidIdentifierError) as by_run:
        check_name(bad, "run id")  # the rule and the error of run(input, run_id=...)
    assert str(refused.value) == str(by_run.value).replace("run id", "CheckpointConfig.run_id", 1)


def test_a_configured_run_id_error_names_the_field() -> None:
    with pytest.raises(InvalidIdentifierError) as refused:
        CheckpointConfig(run_id="a/b")
    assert str(refused.value) == (
        "CheckpointConfig.run_id 'a/b' contains a path separator '/' at index 1 (a path "
        "separator, '..', a NUL, a line feed or a carriage return is not allowed)"
    )
    assert CheckpointConfig(run_id=None).run_id is None
    assert CheckpointConfig(run_id="rün-1").run_id == "rün-1"


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda v: repr(v[:20]))
async def test_a_bad_checkpoint_id_is_refused_before_the_store_is_touched(
    bad: str, checkpoint_store: CheckpointStorage, store_root: Path
) -> None:
    pipeline, spy = spied_pipeline(checkpoint_store)
    files = tree(store_root)
    clutch = pipeline.clutch
    for operation in (
        lambda: clutch.resume(bad),
        lambda: clutch.get_checkpoint(bad),
        lambda: clutch.fork(bad),
        lambda: clutch.fork(bad, data=[], run_id="new"),
    ):
        with pytest.raises(InvalidIdentifierError, match="checkpoint id"):
            await operation()
    assert spy.used() == [], spy.calls
    assert tree(store_root) == files
    assert await checkpoint_store.list_runs() == []


@pytest.mark.parametrize("good", GOOD_IDS, ids=lambda v: repr(v[:20]))
async def test_unusual_but_safe_run_ids_work(
    good: str, checkpoint_store: CheckpointStorage
) -> None:
    pipeline = Pipeline(checkpoint_store)
    pipeline.fail.add("b")
    with pytest.raises(Exception, match="on purpose"):
        await pipeline.clutch.run([], run_id=good)
    pipeline.fail.clear()
    assert await pipeline.clutch.resume_latest(good) == ["a", "b", "c"]
    assert [r.run_id for r in await pipeline.clutch.list_runs()] == [good]
    assert await pipeline.clutch.delete_run(good) is True


@pytest.mark.parametrize("bad", ["../evil", "a/b", "a\\b", "x" * (MAX_NAME_LENGTH + 1)])
def test_a_bad_agent_name_is_refused_at_registration(
    bad: str, checkpoint_store: CheckpointStorage
) -> None:
    clutch = Clutch("names", checkpoint=config(checkpoint_store))

    async def agent(data: Any) -> Any:
        return data

    agent.__name__ = bad
    with pytest.raises(InvalidIdentifierError):
        clutch.agent()(agent)
    assert clutch.agent_names == ()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (5, "pipeline name must be a string, got 5"),
        (
            "a\0b",
            "pipeline name 'a\\x00b' holds a NUL character (U+0000) at index 1: no store can "
            "keep it with the runs",
        ),
        (
            "ab\ud800",
            "pipeline name 'ab\\ud800' holds a lone surrogate (U+D800) at index 2, which is "
            "not text: no store can keep it with the runs",
        ),
    ],
)
async def test_a_bad_pipeline_name_is_refused_with_checkpointing_or_a_transport(
    bad: str,
    why: str,
    checkpoint_store: CheckpointStorage,
    store_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("NESTEGG_HOME", str(home))
    spy = Spy(checkpoint_store)
    files = tree(store_root)
    for options in (
        {"checkpoint": config(spy)},  # type: ignore[arg-type]
        {"checkpoint": CheckpointConfig()},  # the default store, not created
        {"checkpoint": config(checkpoint_store), "transport": "redis://localhost:1"},
        {"transport": "redis://localhost:1"},
    ):
        with pytest.raises(InvalidIdentifierError) as refused:
            Clutch(bad, **options)
        assert str(refused.value) == why
    assert spy.used() == []
    assert tree(store_root) == files and not home.exists()
    assert await checkpoint_store.list_runs() == []


@pytest.mark.parametrize("name", ["", "team/enrich", "../x", "a\nb", "x" * 300])
async def test_a_pipeline_name_a_store_keeps_is_taken_and_its_runs_resume(
    name: str, checkpoint_store: CheckpointStorage
) -> None:
    """Names that are no run id but that every store keeps: refusing them would shut the
    pipelines that have them out of their stored runs."""
    clutch = Clutch(name, checkpoint=config(checkpoint_store))
    calls: list[int] = []

    @clutch.agent()
    async def double(data: int) -> int:
        calls.append(data)
        if len(calls) == 1:
            raise RuntimeError("flaky")
        return data * 2

    with pytest.raises(RuntimeError):
        await clutch.run(2, run_id="r1")
    assert await clutch.resume_latest("r1") == 4
    [run] = await clutch.list_runs()
    assert (run.pipeline, run.status) == (name, "completed")


async def test_any_pipeline_name_runs_without_checkpointing_as_in_eggai_clutch() -> None:
    for name in ("", "../x", "a\nb"):
        clutch = Clutch(name)

        @clutch.agent()
        async def double(data: int) -> int:
            return data * 2

        assert clutch.name == name
        assert await clutch.run(2) == 4
