"""What names a journaled function: the same name however its module was started, or the
name given with ``durable(name=...)``.

The crash tests in tests/crash/test_recover_started_module.py start real pipelines as
``python -m pkg.mod`` and ``python pkg/mod.py``, kill them and recover them through the
command.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import nestegg
from nestegg import Clutch
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import ConfigurationError
from nestegg.journal import function_name
from nestegg.module_names import importable_name, main_module_name, named_object
from tests.checkpoint import conftest as checkpointed
from tests.checkpoint.conftest import Flaky, config
from tests.test_journal import journal_of

store_kind = checkpointed.store_kind
store_root = checkpointed.store_root
reopen_store = checkpointed.reopen_store
checkpoint_store = checkpointed.checkpoint_store

# ------------------------------------------------------------- module names


def test_a_file_is_named_as_imported_from_the_highest_root_holding_it(tmp_path: Path) -> None:
    demo = tmp_path / "examples" / "demo.py"
    roots = [str(tmp_path / "examples"), "/nowhere", str(tmp_path)]
    assert importable_name(demo, roots) == "examples.demo"
    assert importable_name(demo, [str(tmp_path / "examples")]) == "demo"
    assert importable_name(tmp_path / "pkg" / "__init__.py", [str(tmp_path)]) == "pkg"
    assert importable_name(demo, ["/nowhere"]) is None
    assert importable_name(tmp_path / "my-scripts" / "run.py", [str(tmp_path)]) is None
    assert importable_name(tmp_path / "tool.pyw", [str(tmp_path)]) is None


def test_a_named_object_is_looked_up_in_loaded_modules_unless_importing_is_allowed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "never_loaded.py").write_text("class Found(Exception): ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "never_loaded", raising=False)

    assert named_object("never_loaded", "Found") is None
    assert "never_loaded" not in sys.modules  # a stored name imports nothing by itself
    assert named_object("nestegg.errors", "JournaledCallError.__init__") is not None
    assert named_object("nestegg.errors", "NoSuchError") is None
    found = named_object("never_loaded", "Found", importing=True)
    assert isinstance(found, type) and found.__module__ == "never_loaded"


def test_an_empty_root_is_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert importable_name("flows/mod.py", [""]) == "flows.mod"


def test_the_started_module_is_named_by_its_spec_then_by_its_file(tmp_path: Path) -> None:
    by_m = types.ModuleType("__main__")
    by_m.__spec__ = types.SimpleNamespace(name="pkg.mod")  # type: ignore[assignment]
    by_m.__file__ = str(tmp_path / "pkg" / "mod.py")
    assert main_module_name(by_m, []) == "pkg.mod"

    by_path = types.ModuleType("__main__")
    by_path.__spec__ = None
    by_path.__file__ = str(tmp_path / "pkg" / "mod.py")
    assert main_module_name(by_path, [str(tmp_path / "pkg"), str(tmp_path)]) == "pkg.mod"
    assert main_module_name(by_path, ["/nowhere"]) == "__main__"

    interactive = types.ModuleType("__main__")
    assert main_module_name(interactive, [str(tmp_path)]) == "__main__"
    assert main_module_name(None, [str(tmp_path)]) == "__main__"


def run_as_flows_mod(tmp_path: Path, script: str, command: list[str]) -> list[str]:
    """Write ``script`` to flows/mod.py in ``tmp_path``, start it there by ``command`` (the
    arguments after ``python``) and give the words it printed."""
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "mod.py").write_text(script)
    done = subprocess.run(
        [sys.executable, *command], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


SCRIPT = """
import nestegg
from nestegg.journal import function_name

async def expensive(x):
    return x

@nestegg.durable
async def decorated(x):
    return x

print(function_name(expensive), function_name(decorated))
"""


@pytest.mark.parametrize(
    "command",
    [["-m", "flows.mod"], ["flows/mod.py"], [str(Path("flows") / ".." / "flows" / "mod.py")]],
)
def test_a_started_script_names_its_functions_as_its_module_would(
    tmp_path: Path, command: list[str]
) -> None:
    assert run_as_flows_mod(tmp_path, SCRIPT, command) == [
        "flows.mod.expensive",
        "flows.mod.decorated",
    ]


SPAWNING_SCRIPT = """
import multiprocessing
from nestegg.journal import function_name

async def expensive(x):
    return x

def name_in_child(_):
    return function_name(expensive)  # the script is __mp_main__ in a spawned child

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(function_name(expensive), pool.map(name_in_child, [0])[0])
"""


def test_a_spawned_child_names_the_script_s_functions_as_the_script_does(tmp_path: Path) -> None:
    assert run_as_flows_mod(tmp_path, SPAWNING_SCRIPT, ["flows/mod.py"]) == [
        "flows.mod.expensive",
        "flows.mod.expensive",
    ]


ENUM_SCRIPT = """
import enum, sys
from nestegg.checkpoint.codec import decode_value, encode_value

class Kind(enum.Enum):
    BILLING = "billing"

stored = encode_value(Kind.BILLING)
print(stored.decode(), decode_value(stored) is Kind.BILLING, "flows.mod" in sys.modules)
"""


@pytest.mark.parametrize("command", [["-m", "flows.mod"], ["flows/mod.py"]])
def test_an_enum_of_a_started_script_is_stored_by_its_module_name_and_read_back(
    tmp_path: Path, command: list[str]
) -> None:
    # Read back in the process that stored it: its own member, not a second import's.
    assert run_as_flows_mod(tmp_path, ENUM_SCRIPT, command) == [
        '{"$ne":"enum","v":["flows.mod:Kind","billing"]}',
        "True",
        "False",
    ]


def test_an_imported_function_keeps_its_module_name() -> None:
    assert function_name(test_an_imported_function_keeps_its_module_name) == (
        f"{__name__}.test_an_imported_function_keeps_its_module_name"
    )


# ------------------------------------------------------------ durable(name=)


async def test_a_named_durable_function_replays_after_it_was_renamed(
    checkpoint_store: CheckpointStorage,
) -> None:
    paid: list[str] = []

    @nestegg.durable(name="llm.ask")
    async def ask(prompt: str) -> str:
        paid.append(prompt)
        return f"answer to {prompt}"

    @nestegg.durable(name="llm.ask")
    async def ask_renamed(prompt: str) -> str:
        paid.append(f"again {prompt}")
        return "a new answer"

    asker = [ask]
    fail = [True]
    clutch = Clutch("named", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def agent(data: list[str]) -> list[str]:
        reply = await asker[0]("q")
        also = await nestegg.call(asker[0], "r")
        if fail[0]:
            raise Flaky("agent failed")
        return [*data, reply, also]

    with pytest.raises(Flaky):
        await clutch.run([], run_id="job")
    assert [e["function"] for e in await journal_of(checkpoint_store, "job", 1)] == [
        "llm.ask",
        "llm.ask",
    ]
    asker[0], fail[0] = ask_renamed, False
    assert await clutch.resume_latest("job") == ["answer to q", "answer to r"]
    assert paid == ["q", "r"]


async def test_the_outer_durable_name_wins(checkpoint_store: CheckpointStorage) -> None:
    async def base(prompt: str) -> str:
        return prompt

    inner = nestegg.durable(base, name="inner")
    outer = nestegg.durable(inner, name="outer")
    plain = nestegg.durable(base)
    clutch = Clutch("names", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def agent(data: Any) -> Any:
        return [await inner("a"), await outer("b"), await plain("c")]

    await clutch.run([], run_id="job")
    functions = [e["function"] for e in await journal_of(checkpoint_store, "job", 1)]
    assert functions == ["inner", "outer", function_name(base)]


@pytest.mark.parametrize("bad", ["", "  ", 3, b"x"])
def test_durable_checks_its_name_when_it_decorates(bad: Any) -> None:
    message = f"durable(name=...) must be a non-empty str, got {bad!r}"
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        nestegg.durable(name=bad)
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        nestegg.durable(print, name=bad)
