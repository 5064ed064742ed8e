"""The exception tree: the drawing in errors.py's docstring matches the classes."""

from __future__ import annotations

import inspect
import re

import pytest

from nestegg import errors
from nestegg.errors import (
    CheckpointFallbackWarning,
    CheckpointSerializationError,
    JournaledCallError,
    NestEggError,
    RecordTooLargeError,
    RunError,
)

TREE_NAME = re.compile(r"[A-Z]\w*")
BRANCH = "── "
INDENT = 4


def drawn_tree() -> dict[str, str | None]:
    """Class name -> drawn parent name (None for the root), read from the module docstring."""
    lines = (errors.__doc__ or "").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == NestEggError.__name__)
    root_column = lines[start].index(NestEggError.__name__)
    parents: dict[str, str | None] = {NestEggError.__name__: None}
    stack = [NestEggError.__name__]
    for line in lines[start + 1 :]:
        if BRANCH not in line:
            break
        column = line.index(BRANCH) + len(BRANCH)
        match = TREE_NAME.match(line, column)
        assert match, f"no class name in the tree line {line!r}"
        depth = (column - root_column) // INDENT
        del stack[depth:]
        parents[match.group()] = stack[-1]
        stack.append(match.group())
    return parents


def error_classes() -> dict[str, type[BaseException]]:
    """Every exception class defined in nestegg.errors (warnings excluded)."""
    return {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if cls.__module__ == errors.__name__
        and issubclass(cls, BaseException)
        and not issubclass(cls, Warning)
    }


def test_the_tree_is_drawn() -> None:
    assert len(drawn_tree()) > 10


def test_tree_lists_every_class_and_no_other() -> None:
    assert set(drawn_tree()) == set(error_classes())


def test_every_class_is_a_nestegg_error() -> None:
    for name, cls in error_classes().items():
        assert issubclass(cls, NestEggError), name


def test_drawn_parents_are_the_real_parents() -> None:
    classes = error_classes()
    for name, parent in drawn_tree().items():
        if parent is None:
            continue
        tree_bases = [
            base for base in classes[name].__bases__ if base.__module__ == errors.__name__
        ]
        assert tree_bases[0] is classes[parent], name
        for other in tree_bases[1:]:  # a second parent is named on the class's line
            assert f"a {other.__name__} too" in drawn_line(name), name


def drawn_line(name: str) -> str:
    """The line of the docstring's tree that draws class ``name``."""
    return next(line for line in (errors.__doc__ or "").splitlines() if f"── {name} " in line)


def test_a_store_refusal_is_a_storage_error_and_a_configuration_error() -> None:
    refused = errors.StoreRefusedError("Redis at redis://u@db:6379/0 refused the settings")
    assert isinstance(refused, errors.StorageError)
    assert isinstance(refused, errors.ConfigurationError)
    assert not isinstance(refused, errors.StorageUnavailableError)


def test_every_class_has_a_docstring() -> None:
    for name, cls in error_classes().items():
        assert cls.__doc__ and cls.__doc__.strip(), name


def test_the_warning_is_named_and_is_a_user_warning() -> None:
    assert issubclass(CheckpointFallbackWarning, UserWarning)
    assert not issubclass(CheckpointFallbackWarning, NestEggError)
    assert CheckpointFallbackWarning.__name__ in (errors.__doc__ or "")


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("ConfigurationError", ValueError),
        ("MissingDependencyError", ImportError),
        ("InvalidIdentifierError", ValueError),
        ("NoActiveContextError", RuntimeError),
        ("NoActiveRunError", RuntimeError),
        ("RunNotFoundError", LookupError),
        ("CheckpointNotFoundError", LookupError),
        ("CheckpointSerializationError", TypeError),
        ("StorageUnavailableError", ConnectionError),
    ],
)
def test_builtin_bases_let_callers_catch_the_usual_exception(
    name: str, builtin: type[BaseException]
) -> None:
    assert issubclass(error_classes()[name], builtin)


def test_run_error_carries_the_run_id() -> None:
    error = RunError("run r1 is gone", run_id="r1")
    assert error.run_id == "r1" and str(error) == "run r1 is gone"
    assert RunError("no id").run_id is None


def test_serialization_error_names_path_and_type() -> None:
    error = CheckpointSerializationError("data.items[2]", "socket", "not JSON")
    assert error.path == "data.items[2]" and error.type_name == "socket"
    assert "data.items[2]" in str(error) and "socket" in str(error) and "not JSON" in str(error)


def test_record_too_large_error_names_what_its_size_and_the_limit() -> None:
    error = RecordTooLargeError("result of fetch", "str", 70_000_000, 67_108_864)
    assert isinstance(error, CheckpointSerializationError)
    assert not isinstance(error, errors.StorageError)
    assert (error.path, error.type_name, error.size, error.limit) == (
        "result of fetch",
        "str",
        70_000_000,
        67_108_864,
    )
    assert str(error) == (
        "cannot store result of fetch: it is 70,000,000 bytes encoded, over the 67,108,864 "
        "bytes a store takes at once"
    )


def test_journaled_call_error_keeps_the_original_error() -> None:
    error = JournaledCallError("fetch", "TimeoutError", "slow")
    assert (error.function, error.error_type, error.error_message) == (
        "fetch",
        "TimeoutError",
        "slow",
    )
    assert str(error) == "fetch failed: TimeoutError: slow"
