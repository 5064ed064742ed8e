"""CheckpointConfig() without a store: SQLite at $NESTEGG_HOME/nestegg.db, private files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage
from nestegg.constants import DEFAULT_DB_NAME, HOME_ENV
from nestegg.errors import ConfigurationError, StorageUnavailableError

from .conftest import replace_agent


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Run with umask 000, so that private modes come from nestegg, not the umask."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def pipeline(config: CheckpointConfig) -> tuple[Clutch, list[str]]:
    calls: list[str] = []
    clutch = Clutch("default-store", checkpoint=config)

    @clutch.agent()
    async def first(data: list[str]) -> list[str]:
        calls.append("first")
        return [*data, "first"]

    @clutch.agent()
    async def second(data: list[str]) -> list[str]:
        calls.append("second")
        return [*data, "second"]

    return clutch, calls


async def test_the_default_store_is_sqlite_in_nestegg_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None
) -> None:
    home = tmp_path / "not" / "yet" / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    clutch, calls = pipeline(CheckpointConfig())
    async with clutch:
        assert await clutch.run(["in"], run_id="default") == ["in", "first", "second"]
        assert isinstance(clutch.checkpointed_runs().store, SQLiteCheckpointStorage)
        open_files = {path.name: mode(path) for path in home.iterdir()}
    assert open_files == dict.fromkeys(open_files, 0o600)
    assert {DEFAULT_DB_NAME, f"{DEFAULT_DB_NAME}-wal"} <= set(open_files)

    database = home / DEFAULT_DB_NAME
    assert database.is_file()
    assert mode(home) == 0o700
    for path in home.iterdir():
        assert mode(path) == 0o600, path.name
    # Another Clutch (another process) finds the run in the same place.
    again, again_calls = pipeline(CheckpointConfig())
    async with again:
        assert await again.run(["in"], run_id="default") == ["in", "first", "second"]
        [info] = await again.list_runs()
        assert info.run_id == "default" and info.status == "completed"
    assert calls == ["first", "second"] and again_calls == []


async def test_nestegg_home_defaults_to_dot_nestegg_in_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, open_umask: None
) -> None:
    monkeypatch.delenv(HOME_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    clutch, _ = pipeline(CheckpointConfig())
    async with clutch:
        await clutch.run([], run_id="home")
    home = tmp_path / ".nestegg"
    assert (home / DEFAULT_DB_NAME).is_file()
    assert mode(home) == 0o700
    assert mode(home / DEFAULT_DB_NAME) == 0o600


async def test_the_default_store_resumes_a_failed_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    clutch, calls = pipeline(CheckpointConfig(run_id="flaky"))

    async def second(data: list[str]) -> list[str]:
        calls.append("second")
        raise RuntimeError("down")

    replace_agent(clutch, second)
    async with clutch:
        with pytest.raises(RuntimeError, match="down"):
            await clutch.run([])

    restarted, again = pipeline(CheckpointConfig(run_id="flaky"))
    async with restarted:
        assert await restarted.resume_latest() == ["first", "second"]
    assert calls == ["first", "second"] and again == ["second"]


async def test_no_checkpoint_config_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    clutch = Clutch("in-memory")

    @clutch.agent()
    async def only(data: str) -> str:
        return data + "!"

    assert await clutch.run("x") == "x!"
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize("home", ["/dev/null/home", "/proc/no-such-home"])
async def test_a_home_that_cannot_be_made_is_storage_unavailable(
    monkeypatch: pytest.MonkeyPatch, home: str
) -> None:
    monkeypatch.setenv(HOME_ENV, home)
    clutch = Clutch("homeless", checkpoint=CheckpointConfig())

    @clutch.agent()
    async def a(data: int) -> int:
        return data

    with pytest.raises(StorageUnavailableError, match=f"cannot open the SQLite database {home}"):
        await clutch.run(1, run_id="r1")


async def test_a_home_that_is_a_file_is_named_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.write_text("")
    monkeypatch.setenv(HOME_ENV, str(home))
    clutch = Clutch("homeless", checkpoint=CheckpointConfig())

    @clutch.agent()
    async def a(data: int) -> int:
        return data

    with pytest.raises(ConfigurationError) as refused:  # was: [Errno 17] File exists
        await clutch.run(1, run_id="r1")
    assert str(refused.value) == (
        f"NESTEGG_HOME {str(home)!r} is a file, not a directory: it names the directory the "
        "default store keeps its database (nestegg.db) in"
    )


def test_a_url_given_as_storage_is_refused_with_the_way_to_open_it() -> None:
    with pytest.raises(ConfigurationError, match=r"storage=open_store\('sqlite:///x.db'\)"):
        CheckpointConfig(storage="sqlite:///x.db")  # type: ignore[arg-type]
