"""The exception a journaled failure is replayed as: a JournaledCallError that is also an
instance of the original exception class, found in the loaded modules by its module and
qualified name, or of its nearest base class that allows it; a plain JournaledCallError
when neither can be had.

tests/test_journal.py checks that an agent's ``except`` catches a replay as it caught the
call's failure; tests/crash/test_replayed_failure.py does so across a real kill.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from nestegg.errors import JournaledCallError, JournalError
from nestegg.journal_failures import error_class, replay_class, replayed_failure


class NotFound(LookupError):
    """An exception class of a module, with an ``__init__`` and a ``__str__`` of its own."""

    def __init__(self, key: str, source: str) -> None:
        super().__init__(key, source)
        self.key, self.source = key, source

    def __str__(self) -> str:
        return f"{self.key} not in {self.source}"


class Picky(ValueError):
    """An exception class whose ``__new__`` takes arguments of its own."""

    def __new__(cls, code: int) -> Picky:
        if not isinstance(code, int):
            raise TypeError("Picky needs an int code")
        return super().__new__(cls, code)


class Final(type):
    """A metaclass that refuses to derive a class from its classes."""

    def __new__(mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any]) -> Final:
        if any(isinstance(base, Final) for base in bases):
            raise TypeError(f"{bases[-1].__name__} is final: no class derives from it")
        return super().__new__(mcs, name, bases, namespace)


class Sealed(LookupError, metaclass=Final):
    """An exception class no class can derive from (as a layout conflict refuses it)."""


class Registered(ValueError):
    """An exception class that registers its subclasses."""

    registry: ClassVar[list[type]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Registered.registry.append(cls)


def failure(error: BaseException) -> dict[str, Any]:
    """The failure of a journal entry as the journal stores ``error``."""
    kind = type(error)
    return {"type": kind.__qualname__, "module": kind.__module__, "message": str(error)}


def replay(error: BaseException) -> JournaledCallError:
    return replayed_failure("mod.fn", failure(error))


def test_a_builtin_failure_replays_as_its_class_with_a_readable_message() -> None:
    replayed = replay(KeyError("k"))

    assert isinstance(replayed, KeyError) and isinstance(replayed, JournaledCallError)
    assert str(replayed) == "mod.fn failed: KeyError: 'k'"  # not KeyError's repr of it
    assert repr(replayed) == """JournaledCallError("mod.fn failed: KeyError: 'k'")"""
    assert replayed.args == ("mod.fn failed: KeyError: 'k'",)
    assert (replayed.function, replayed.error_type, replayed.error_message) == (
        "mod.fn",
        "KeyError",
        "'k'",
    )
    with pytest.raises(LookupError):  # every except clause that caught it catches it
        raise replayed


@pytest.mark.parametrize("error", [OSError(2, "gone"), FileNotFoundError("f"), TimeoutError()])
def test_an_os_error_replays_as_its_class_with_the_message_it_had(error: OSError) -> None:
    replayed = replay(error)

    assert isinstance(replayed, type(error)) and isinstance(replayed, JournaledCallError)
    assert str(replayed) == f"mod.fn failed: {type(error).__qualname__}: {error}"


def test_a_class_of_a_module_replays_without_its_init_new_or_str() -> None:
    not_found = replay(NotFound("x", "the index"))
    picky = replay(Picky(7))

    assert isinstance(not_found, NotFound) and isinstance(picky, Picky)
    assert str(not_found) == "mod.fn failed: NotFound: x not in the index"
    assert str(picky) == "mod.fn failed: Picky: 7"
    assert not hasattr(not_found, "key")  # its __init__ did not run with guessed arguments


def test_a_class_nothing_can_derive_from_replays_as_its_nearest_base_that_allows_it() -> None:
    replayed = replay(Sealed("k"))

    assert isinstance(replayed, LookupError) and not isinstance(replayed, Sealed)
    assert isinstance(replayed, JournaledCallError)
    assert str(replayed) == "mod.fn failed: Sealed: k"


def test_a_class_whose_instances_cannot_be_made_so_replays_as_journaled_call_error() -> None:
    group = ExceptionGroup("two", [ValueError("a"), KeyError("b")])
    replayed = replay(group)

    assert type(replayed) is JournaledCallError
    assert str(replayed) == "mod.fn failed: ExceptionGroup: two (2 sub-exceptions)"


def test_deriving_the_replay_class_does_not_register_it_where_the_class_registers() -> None:
    replayed = replay(Registered("r"))

    assert isinstance(replayed, Registered)
    assert Registered.registry == []


def test_a_class_that_is_not_loaded_replays_as_journaled_call_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not_loaded_errors.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    stored = {"type": "Gone", "module": "not_loaded_errors", "message": "m"}

    replayed = replayed_failure("mod.fn", stored)

    assert type(replayed) is JournaledCallError  # and the module was not imported
    assert "not_loaded_errors" not in sys.modules
    assert str(replayed) == "mod.fn failed: Gone: m"


@pytest.mark.parametrize(
    "stored",
    [
        {"type": "ValueError", "message": "journaled before the module was"},
        {"type": "test_journal_failures.<locals>.Local", "module": __name__, "message": "m"},
        {"type": "print", "module": "builtins", "message": "not a class"},
        {"type": "KeyboardInterrupt", "module": "builtins", "message": "no Exception"},
        {"type": "ValueError", "module": 3, "message": "not a name"},
    ],
    ids=["no-module", "local", "function", "base-exception", "bad-module"],
)
def test_what_names_no_loaded_exception_class_replays_as_journaled_call_error(
    stored: dict[str, Any],
) -> None:
    replayed = replayed_failure("mod.fn", stored)

    assert type(replayed) is JournaledCallError
    assert str(replayed) == f"mod.fn failed: {stored['type']}: {stored['message']}"


def test_the_replay_class_is_made_once_per_class_and_named_journaled_call_error() -> None:
    made = replay_class(ValueError)

    assert replay_class(ValueError) is made
    assert (made.__name__, made.__qualname__, made.__module__) == (
        "JournaledCallError",
        "JournaledCallError",
        "nestegg.errors",
    )
    assert issubclass(made, JournalError) and issubclass(made, ValueError)
    assert replay_class(JournaledCallError) is JournaledCallError
    assert error_class("nestegg.errors", "JournaledCallError") is JournaledCallError
    assert error_class("builtins", "print") is None
