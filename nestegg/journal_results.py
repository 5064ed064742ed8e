"""Replayed results of journaled calls, rebuilt from the function's return annotation.

The journal stores a result as plain values (a pydantic model as its ``model_dump()``).
A replayed result is rebuilt with pydantic's ``TypeAdapter`` only when the return
annotation holds, anywhere in its type arguments, a pydantic model, a dataclass or a
TypedDict (``Model``, ``list[Model]``, ``Model | None``, ``dict[str, Model]``, ...);
otherwise it comes back as stored, since lax validation would change stored values (an
int returned as ``-> float`` would replay as a float).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, NamedTuple, TypeVar, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError

from nestegg.agents import validation_problems
from nestegg.errors import NonDeterminismError


def underlying(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` without the decorators that set ``__wrapped__`` and without partials."""
    while True:
        fn = inspect.unwrap(fn)
        if not isinstance(fn, functools.partial):
            return fn
        fn = fn.func


def _function_of(target: Any) -> Any:
    method = getattr(target, "__func__", None)
    for candidate in (target, method, type(target).__call__):
        if inspect.isfunction(candidate):
            return candidate
    return None


def _closure_names(func: Any) -> dict[str, Any]:
    names: dict[str, Any] = {}
    for name, cell in zip(func.__code__.co_freevars, func.__closure__ or (), strict=False):
        with contextlib.suppress(ValueError):  # a cell not filled yet
            names[name] = cell.cell_contents
    return names


def return_annotation(fn: Callable[..., Any]) -> Any:
    """The resolved return annotation of ``fn`` (of a class: the class), or None.

    A string annotation is evaluated in the function's module and closure; None when
    there is no annotation or it cannot be resolved.
    """
    target = underlying(fn)
    if isinstance(target, type):
        return target
    func = _function_of(target)
    if func is None:
        return None
    hint = inspect.get_annotations(func).get("return")
    if isinstance(hint, str):
        try:
            hint = eval(hint, func.__globals__, _closure_names(func))
        except Exception:  # a name only known to type checkers, or not a type at all
            return None
    return hint


def _is_structured(hint: Any) -> bool:
    """Whether ``hint`` itself is a pydantic model, a dataclass or a TypedDict class."""
    if not isinstance(hint, type):
        return False
    typed_dict = issubclass(hint, dict) and hasattr(hint, "__required_keys__")
    return issubclass(hint, BaseModel) or dataclasses.is_dataclass(hint) or typed_dict


def holds_structured_type(hint: Any, seen: frozenset[int] = frozenset()) -> bool:
    """Whether ``hint`` or any of its type arguments (through aliases and NewTypes) is a
    pydantic model, a dataclass or a TypedDict."""
    if id(hint) in seen:  # a recursive type alias
        return False
    if _is_structured(hint):
        return True
    seen = seen | {id(hint)}
    inner = [*get_args(hint), get_origin(hint)]
    inner += [getattr(hint, name, None) for name in ("__value__", "__supertype__")]
    return any(holds_structured_type(t, seen) for t in inner if t is not None)


def _returned(hint: Any) -> Any:
    """What awaiting a value of ``hint`` gives (``hint`` itself when not awaitable)."""
    if get_origin(hint) in (Awaitable, Coroutine):
        return get_args(hint)[-1] if get_args(hint) else None
    return hint


def _adapter(hint: Any) -> TypeAdapter[Any] | None:
    if hint is None or isinstance(hint, TypeVar) or not holds_structured_type(hint):
        return None
    try:
        return TypeAdapter(hint)
    except Exception:  # a type pydantic cannot validate: the value stays as stored
        return None


def _describe(hint: Any) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


class _ResultType(NamedTuple):
    hint: Any
    adapter: TypeAdapter[Any] | None


_result_types: weakref.WeakKeyDictionary[Any, _ResultType] = weakref.WeakKeyDictionary()
"""Function (or class) -> its return annotation and the adapter that rebuilds its results:
built once per function, since a replay of many calls would otherwise pay for both each
time."""


def _result_type(fn: Callable[..., Any]) -> _ResultType:
    target = underlying(fn)
    key = target if isinstance(target, type) else _function_of(target)
    known = _result_types.get(key) if key is not None else None
    if known is None:
        hint = _returned(return_annotation(fn))
        known = _ResultType(hint, _adapter(hint))
        if key is not None:
            _result_types[key] = known
    return known


def _failure(error: Exception, hint: Any) -> str:
    """What went wrong, said after "the journal recorded a result of <function>"."""
    if isinstance(error, ValidationError):
        problems = validation_problems(error)
        return f"that does not fit its return annotation {_describe(hint)} ({problems})"
    cause = f"{type(error).__name__}: {error}"
    return f"that cannot be rebuilt as its return annotation {_describe(hint)} ({cause})"


def rebuild_result(fn: Callable[..., Any], function: str, value: Any, where: str) -> Any:
    """A replayed ``value`` rebuilt as ``fn``'s return annotation.

    Only an annotation that holds a pydantic model, a dataclass or a TypedDict rebuilds
    (fields are accepted by alias and by name); any other value comes back as stored.

    Raises:
        NonDeterminismError: the recorded value cannot be rebuilt as the annotation (a
            value that does not fit it, or a validator or the type itself failing),
            naming ``where``, the function and the cause.
    """
    hint, adapter = _result_type(fn)
    if adapter is None:
        return value
    try:
        return adapter.validate_python(value, by_alias=True, by_name=True)
    except Exception as error:
        raise NonDeterminismError(
            f"{where}: the journal recorded a result of {function} {_failure(error, hint)}; "
            "pass replay='rerun' to call again"
        ) from error
