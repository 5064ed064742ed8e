"""Replayed failures of journaled calls: caught by the same ``except`` clauses as the
original.

A call that failed for good is journaled with its exception class (qualified name and
module) and its message. Replaying it raises a :class:`~nestegg.errors.JournaledCallError`
that is also an instance of that class: a class made once per exception class, whose
bases are JournaledCallError and the original, so that ``except ValueError`` catches the
replay of a ``ValueError`` as it caught the call's failure the first time.

The class is looked up only in the modules this process has loaded (the agent's module,
which raised it, is loaded when its run resumes); nothing named in stored data is
imported. The instance is made without the original class's ``__new__`` and
``__init__`` (whose arguments the journal does not hold): its ``args`` are
JournaledCallError's, and ``str()`` gives its message, naming the function and the
original type and message (the original class's ``__str__`` and ``__repr__`` are not
used: they may read attributes the instance lacks). When no such class can be made (the
class is not loaded, is no Exception, its subclass cannot be created or instantiated),
the nearest base class of it that can be is used; for none, or for a failure journaled
before the module was recorded, a plain JournaledCallError.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

from nestegg.errors import JournaledCallError
from nestegg.module_names import named_object


class _Replayed(JournaledCallError):
    """The base of a replayed failure's class (whose other base is the original class)."""

    def __new__(cls, *args: Any) -> _Replayed:
        return _native_new(cls)(cls, *args)  # type: ignore[no-any-return]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Runs in place of the original class's hook: deriving a replay class from it
        must not register it wherever that hook registers subclasses."""

    __str__ = BaseException.__str__  # not KeyError's (a repr) nor OSError's
    __repr__ = BaseException.__repr__


def _native_new(cls: type) -> Any:
    """The ``__new__`` of the nearest class in ``cls``'s MRO that is built in (so that no
    ``__new__`` of the original class's, which takes its own arguments, runs)."""
    for base in cls.__mro__:
        new = base.__dict__.get("__new__")
        if isinstance(new, types.BuiltinFunctionType):
            return new
    return BaseException.__new__


def error_class(module: Any, qualname: Any) -> type[Exception] | None:
    """The exception class a journal entry names (``module`` and ``qualname`` as stored),
    if a loaded module defines it; None otherwise."""
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    found = named_object(module, qualname)
    return found if isinstance(found, type) and issubclass(found, Exception) else None


_replay_classes: dict[type, type[JournaledCallError]] = {}
"""Exception class -> the class its failures are replayed as (made once: a class made per
replay would be another class each time, and cost a class's creation)."""


def replay_class(original: type[Exception]) -> type[JournaledCallError]:
    """The JournaledCallError class a failure of class ``original`` is replayed as: a
    subclass of ``original`` or of its nearest base that allows one; JournaledCallError
    itself when none does."""
    known = _replay_classes.get(original)
    if known is None:
        known = _replay_classes[original] = _first_made(original)
    return known


def _first_made(original: type[Exception]) -> type[JournaledCallError]:
    for base in original.__mro__:
        if issubclass(JournaledCallError, base):  # Exception, or a base of nestegg's own
            continue
        made = _made(base)
        if made is not None:
            return made
    return JournaledCallError


def _made(base: type) -> type[JournaledCallError] | None:
    """A class derived from JournaledCallError and ``base`` whose instances can be made,
    or None (a layout or metaclass conflict, a base that refuses it)."""
    namespace = {"__module__": JournaledCallError.__module__, "__qualname__": "JournaledCallError"}
    try:
        made = type("JournaledCallError", (_Replayed, base), namespace)
        made("function", "Error", "message")  # a class whose instances fail is of no use
    except Exception:
        return None
    return made


def replayed_failure(function: str, failure: Mapping[str, Any]) -> JournaledCallError:
    """The exception that replays a journaled ``failure`` of ``function`` (its stored
    ``type``, ``module`` and ``message``)."""
    error_type, message = str(failure.get("type")), str(failure.get("message"))
    original = error_class(failure.get("module"), failure.get("type"))
    kind = JournaledCallError if original is None else replay_class(original)
    return kind(function, error_type, message)
