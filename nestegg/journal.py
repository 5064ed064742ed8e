"""Journaled calls: never pay twice for an LLM call inside a step.

Inside an agent of a checkpointed run, ``await call(fn, ...)`` (or a function decorated
with :func:`durable`) commits the call's result to the run's journal as soon as it
returns. When the step runs again after a crash or a failure, recorded results are
returned in order without calling the function again. A call is identified by its step,
its position among the step's calls and the function's qualified name; its arguments
are hashed, and a re-execution that calls something else at a position raises
:class:`NonDeterminismError` (unless the call says ``replay="rerun"``).

A replayed result is rebuilt from the function's return annotation with pydantic's
``TypeAdapter`` (a model comes back as the model, ``list[Model]`` as a list of them);
without a usable annotation it comes back as stored (a model as its ``model_dump()``).
Calls made while a journaled call runs (a durable function calling another) are plain
calls: the outer call's result is what the journal holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import math
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import (
    Any,
    Literal,
    NamedTuple,
    ParamSpec,
    Protocol,
    TypeVar,
    get_args,
    get_origin,
    overload,
)

import orjson
from pydantic import TypeAdapter, ValidationError

from nestegg.context import current_context
from nestegg.errors import ConfigurationError, NonDeterminismError

P = ParamSpec("P")
T = TypeVar("T")
Replay = Literal["record", "rerun"]
AsyncFunction = Callable[P, Coroutine[Any, Any, T]]
"""An async function with parameters P returning T (what :func:`durable` returns)."""

_DURABLE_ATTRIBUTE = "__nestegg_durable__"
_inside_call: ContextVar[bool] = ContextVar("nestegg_inside_journaled_call", default=False)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a journaled call before its outcome is recorded.

    Args:
        attempts: how many tries in all (1: no retry); an int >= 1.
        backoff: seconds before the second try (a finite number >= 0); doubled before
            each further one.
        on: a tuple of exception classes (subclasses of Exception) that are retried;
            others are recorded at once.

    Raises:
        ConfigurationError: a field has a value the policy cannot use (named with it).

    Example:
        >>> await call(llm.complete, prompt, retry=RetryPolicy(attempts=3, backoff=0.5))
    """

    attempts: int = 3
    backoff: float = 0.5
    on: tuple[type[Exception], ...] = (Exception,)

    def __post_init__(self) -> None:
        _check_attempts(self.attempts)
        _check_backoff(self.backoff)
        _check_on(self.on)


def _check_attempts(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"RetryPolicy.attempts must be an int >= 1, got {value!r}")


def _check_backoff(value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigurationError(
            f"RetryPolicy.backoff must be a finite number of seconds >= 0, got {value!r}"
        )


def _check_on(value: object) -> None:
    expected = "RetryPolicy.on must be a tuple of exception classes (subclasses of Exception)"
    if not isinstance(value, tuple):
        raise ConfigurationError(f"{expected}, got {value!r}")
    for item in value:
        if not (isinstance(item, type) and issubclass(item, Exception)):
            raise ConfigurationError(f"{expected}, got {value!r}: {item!r} is not one")


def _check_options(replay: object, retry: object) -> None:
    if replay not in ("record", "rerun"):
        raise ConfigurationError(f"replay must be 'record' or 'rerun', got {replay!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"retry must be a nestegg.RetryPolicy or None, got {retry!r}")


# ------------------------------------------------------------------- identity


def _underlying(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` without the decorators that set ``__wrapped__`` and without partials."""
    while True:
        fn = inspect.unwrap(fn)
        if not isinstance(fn, functools.partial):
            return fn
        fn = fn.func


def function_name(fn: Callable[..., Any]) -> str:
    """The qualified name that identifies a journaled function.

    Decorators that set ``__wrapped__`` (such as :func:`durable`) and
    ``functools.partial`` are seen through: the name is the underlying function's.
    """
    target = _underlying(fn)
    module = getattr(target, "__module__", None) or "?"
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


def _hash_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return f"<{type(value).__qualname__}>"


def argument_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A short stable hash of a call's arguments (objects JSON cannot hold count by type)."""
    option = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
    raw = orjson.dumps([list(args), kwargs], default=_hash_default, option=option)
    return hashlib.sha256(raw).hexdigest()[:24]


# ------------------------------------------------------------- replayed types


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
    target = _underlying(fn)
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


def _adapter(hint: Any) -> TypeAdapter[Any] | None:
    if get_origin(hint) in (Awaitable, Coroutine):
        hint = get_args(hint)[-1] if get_args(hint) else None
    if hint is None or hint is Any or hint is object or isinstance(hint, TypeVar):
        return None
    try:
        return TypeAdapter(hint)
    except Exception:  # a type pydantic cannot validate: the value stays as stored
        return None


def _describe(hint: Any) -> str:
    return hint.__qualname__ if isinstance(hint, type) else repr(hint)


_result_types: weakref.WeakKeyDictionary[Any, tuple[Any, TypeAdapter[Any] | None]] = (
    weakref.WeakKeyDictionary()
)
"""Function (or class) -> its return annotation and the adapter that validates it: built
once per function, since a replay of many calls would otherwise pay for both each time."""


def _result_type(fn: Callable[..., Any]) -> tuple[Any, TypeAdapter[Any] | None]:
    target = _underlying(fn)
    key = target if isinstance(target, type) else _function_of(target)
    known = _result_types.get(key) if key is not None else None
    if known is None:
        hint = return_annotation(fn)
        known = (hint, _adapter(hint))
        if key is not None:
            _result_types[key] = known
    return known


def rebuild_result(fn: Callable[..., Any], function: str, value: Any, where: str) -> Any:
    """A replayed ``value`` validated as ``fn``'s return annotation (unchanged without one).

    Raises:
        NonDeterminismError: the recorded value does not fit the annotation.
    """
    hint, adapter = _result_type(fn)
    if adapter is None:
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors()[:3]
        )
        raise NonDeterminismError(
            f"{where}: the journal recorded a result of {function} that does not fit its "
            f"return annotation {_describe(hint)} ({problems}); pass replay='rerun' to call "
            "again"
        ) from error


# ----------------------------------------------------------------------- calls


async def _invoke(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


async def _with_retry(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    retry: RetryPolicy | None,
) -> Any:
    attempts = retry.attempts if retry else 1
    delay = retry.backoff if retry else 0.0
    for attempt in range(1, attempts + 1):
        try:
            return await _invoke(fn, args, kwargs)
        except Exception as error:
            if retry is None or attempt == attempts or not isinstance(error, retry.on):
                raise
            await asyncio.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")


async def _outermost(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    retry: RetryPolicy | None,
) -> Any:
    """The journaled call itself: calls made while it runs are plain calls."""
    token = _inside_call.set(True)
    try:
        return await _with_retry(fn, args, kwargs, retry)
    finally:
        _inside_call.reset(token)


@dataclass(frozen=True)
class _Durable:
    """What :func:`durable` made of a function (kept on the wrapper it returned)."""

    wrapper: Callable[..., Any]
    target: Callable[..., Any]
    replay: Replay
    retry: RetryPolicy | None


class _Call(NamedTuple):
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    replay: Replay
    retry: RetryPolicy | None


def _resolve(call: _Call) -> _Call:
    """The call with partials applied and durable wrappers replaced by their function.

    A durable function's options apply unless the call sets its own: ``retry`` of the
    call wins, and the call reruns when either says ``replay="rerun"``.
    """
    while True:
        fn = call.fn
        if isinstance(fn, functools.partial):
            kwargs = {**fn.keywords, **call.kwargs}
            call = call._replace(fn=fn.func, args=(*fn.args, *call.args), kwargs=kwargs)
            continue
        spec = getattr(fn, _DURABLE_ATTRIBUTE, None)
        if not isinstance(spec, _Durable) or spec.wrapper is not fn:
            return call
        replay: Replay = "rerun" if "rerun" in (call.replay, spec.replay) else "record"
        call = call._replace(fn=spec.target, replay=replay, retry=call.retry or spec.retry)


async def call(
    fn: Callable[..., Any],
    *args: Any,
    replay: Replay = "record",
    retry: RetryPolicy | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` once per run step, journaled.

    Sync functions run in a worker thread. Outside a checkpointed run, in the
    ``on_request`` and ``on_response`` hooks and inside another journaled call this is a
    plain call. A ``functools.partial`` is journaled as its function, with its bound
    arguments hashed along with the call's; a :func:`durable` function is journaled once.
    A replayed result is rebuilt as ``fn``'s return annotation when pydantic can validate
    it (a model, ``list[Model]``, ...); without an annotation a model replays as its dict.

    Args:
        fn: the function (sync or async) to call.
        replay: "record" replays a recorded outcome; "rerun" calls again and records anew.
        retry: retries before the outcome is recorded.

    Returns:
        The function's result, or on re-execution the recorded one.

    Raises:
        ConfigurationError: ``replay`` or ``retry`` is not one of the allowed values.
        NonDeterminismError: the journal recorded another call at this position, or a
            result that does not fit ``fn``'s return annotation.
        JournaledCallError: replaying a call that failed for good.

    Example:
        >>> answer = await nestegg.call(llm.complete, prompt)
    """
    _check_options(replay, retry)
    fn, args, kwargs, replay, retry = _resolve(_Call(fn, args, kwargs, replay, retry))
    ctx = current_context()
    execution = ctx._execution if ctx is not None else None
    if execution is None or not execution.journaling or _inside_call.get():
        return await _with_retry(fn, args, kwargs, retry)
    name = function_name(fn)
    digest = argument_hash(args, kwargs)
    return await execution.journaled(
        name,
        digest,
        replay,
        lambda: _outermost(fn, args, kwargs, retry),
        lambda value, where: rebuild_result(fn, name, value, where),
    )


# -------------------------------------------------------------------- durable


class DurableDecorator(Protocol):
    """What ``durable(replay=..., retry=...)`` returns: a decorator that keeps the
    decorated function's parameters and makes it awaitable."""

    @overload
    def __call__(self, fn: AsyncFunction[P, T], /) -> AsyncFunction[P, T]: ...

    @overload
    def __call__(self, fn: Callable[P, T], /) -> AsyncFunction[P, T]: ...


@overload
def durable(
    fn: AsyncFunction[P, T], *, replay: Replay = ..., retry: RetryPolicy | None = ...
) -> AsyncFunction[P, T]: ...


@overload
def durable(
    fn: Callable[P, T], *, replay: Replay = ..., retry: RetryPolicy | None = ...
) -> AsyncFunction[P, T]: ...


@overload
def durable(*, replay: Replay = ..., retry: RetryPolicy | None = ...) -> DurableDecorator: ...


def durable(
    fn: Callable[..., Any] | None = None,
    *,
    replay: Replay = "record",
    retry: RetryPolicy | None = None,
) -> Any:
    """Decorate a function so that every call inside a checkpointed step is journaled.

    Works bare (``@durable``) and with options (``@durable(retry=...)``). The decorated
    function keeps its parameters and is awaited (``await fetch(url)``), whether ``fn``
    is sync or async; outside a checkpointed run it is a plain call.

    Args:
        fn: the function to decorate (sync or async).
        replay: "record" replays a recorded outcome; "rerun" calls again and records anew.
        retry: retries before the outcome is recorded.

    Returns:
        The awaitable function, or (without ``fn``) a decorator that makes one.

    Raises:
        ConfigurationError: ``fn`` is not callable, or ``replay`` or ``retry`` is not one
            of the allowed values (checked when decorating).

    Example:
        >>> @nestegg.durable(retry=RetryPolicy(attempts=3))
        ... async def ask_llm(prompt: str) -> str: ...
    """
    _check_options(replay, retry)

    def decorate(target: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
        if not callable(target):
            raise ConfigurationError(f"durable() decorates a function, got {target!r}")

        @functools.wraps(target)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await call(target, *args, replay=replay, retry=retry, **kwargs)

        setattr(wrapper, _DURABLE_ATTRIBUTE, _Durable(wrapper, target, replay, retry))
        return wrapper

    return decorate(fn) if fn is not None else decorate
