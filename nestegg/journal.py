"""Journaled calls: never pay twice for an LLM call inside a step.

Inside an agent of a checkpointed run, ``await call(fn, ...)`` (or a function decorated
with :func:`durable`) commits the call's result to the run's journal as soon as it
returns. When the step runs again after a crash or a failure, recorded results are
returned in order without calling the function again. A call is identified by its step,
its position among the step's calls and the function's qualified name; its arguments
are hashed, and a re-execution that calls something else at a position raises
:class:`NonDeterminismError` (unless the call says ``replay="rerun"``).

A replayed result comes back as stored, or rebuilt from the function's return annotation
when that holds a pydantic model, a dataclass or a TypedDict (see
:mod:`nestegg.journal_results`).
Calls made while a journaled call runs (a durable function calling another) are plain
calls: the outer call's result is what the journal holds.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import inspect
import math
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass, fields, is_dataclass
from typing import (
    Any,
    Literal,
    NamedTuple,
    ParamSpec,
    Protocol,
    TypeVar,
    overload,
)

import orjson

from nestegg.context import current_context
from nestegg.errors import ConfigurationError
from nestegg.journal_results import rebuild_result, underlying
from nestegg.module_names import stable_module_name
from nestegg.options import is_count, shown

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
    if not is_count(value):
        raise ConfigurationError(f"RetryPolicy.attempts must be an int >= 1, got {shown(value)}")


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


def _check_callable(fn: object, needs: str) -> None:
    if not callable(fn):
        raise ConfigurationError(f"{needs}, got {fn!r} (type {type(fn).__name__}, not callable)")


def _check_name(name: object) -> None:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigurationError(f"durable(name=...) must be a non-empty str, got {name!r}")


def _check_options(replay: object, retry: object) -> None:
    if replay not in ("record", "rerun"):
        raise ConfigurationError(f"replay must be 'record' or 'rerun', got {replay!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"retry must be a nestegg.RetryPolicy or None, got {retry!r}")


# ------------------------------------------------------------------- identity


def function_name(fn: Callable[..., Any]) -> str:
    """The qualified name that identifies a journaled function: ``module.qualname``.

    Decorators that set ``__wrapped__`` (such as :func:`durable`) and
    ``functools.partial`` are seen through: the name is the underlying function's. The
    module is named as it is imported, however the program was started: a function of a
    script run as ``python mypipe.py`` (module ``__main__``) is ``mypipe.<qualname>``,
    as when ``nestegg recover --app mypipe:clutch`` imports it (see
    :mod:`nestegg.module_names`).
    """
    target = underlying(fn)
    module = stable_module_name(getattr(target, "__module__", None) or "?")
    qualname = getattr(target, "__qualname__", None) or type(target).__qualname__
    return f"{module}.{qualname}"


_HASH_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _hash_default(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, set | frozenset):  # iteration order depends on PYTHONHASHSEED
        return sorted(value, key=_canonical)
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, bytes | bytearray):
        return value.hex()
    return f"<{type(value).__qualname__}>"


def _canonical(value: Any) -> bytes:
    """``value`` as the JSON its hash is made of (dict keys sorted, sets in sorted order)."""
    try:
        return orjson.dumps(value, default=_hash_default, option=_HASH_OPTIONS)
    except orjson.JSONEncodeError:  # an int past 64 bits, which orjson does not write
        return orjson.dumps(wide_ints(value), default=_hash_default, option=_HASH_OPTIONS)


def _wide(value: Any) -> bool:
    """Whether ``value`` is an int orjson does not write (past 64 bits)."""
    return isinstance(value, int) and not -(2**63) <= value < 2**64


def _bare(value: int) -> bytes:
    """The int ``value`` written bare in hexadecimal (``0x...``, ``-0x...``), which Python
    writes at once at any size: not JSON, so no value orjson writes (a string included)
    reads the same."""
    return f"{value:#x}".encode()


def wide_ints(value: Any, text: Callable[[int], str] | None = None) -> Any:
    """``value`` with each int past 64 bits, which orjson does not write, wherever it is:
    in containers, pydantic models, dataclasses and enums (as orjson writes them), or as a
    dict key; as ``text(int)``, or by default written bare (see :func:`_bare`: what a
    call's argument hash is made of, only for a value orjson refused, so what it writes
    hashes as it did)."""
    if _wide(value):
        return orjson.Fragment(_bare(value)) if text is None else text(value)
    if isinstance(value, dict):
        if text is None and any(map(_wide, value)):
            return _wide_keyed(value)
        return {wide_ints(k, text): wide_ints(v, text) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [wide_ints(v, text) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((wide_ints(v, text) for v in value), key=_canonical)
    if hasattr(value, "model_dump"):
        return wide_ints(value.model_dump(), text)
    if is_dataclass(value) and not isinstance(value, type):  # its fields, as orjson's
        names = (f.name for f in fields(value) if not f.name.startswith("_"))
        return {name: wide_ints(getattr(value, name), text) for name in names}
    if isinstance(value, enum.Enum):
        return wide_ints(value.value, text)
    return value


def _wide_keyed(value: dict[Any, Any]) -> orjson.Fragment:
    """The dict ``value``, some of whose keys are ints past 64 bits, written as orjson
    writes a dict (its entries sorted) but those keys bare."""
    entries = sorted(_key(k) + b":" + _canonical(v) for k, v in value.items())
    return orjson.Fragment(b"{" + b",".join(entries) + b"}")


def _key(key: Any) -> bytes:
    """The dict key ``key`` as orjson writes it (the text of an int), bare past 64 bits."""
    if _wide(key):
        return _bare(key)
    return orjson.dumps({key: 0}, option=_HASH_OPTIONS)[1:-3]


def argument_hash(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A short hash of a call's arguments, the same in every process (objects JSON cannot
    hold count by type)."""
    return hashlib.sha256(_canonical([list(args), kwargs])).hexdigest()[:24]


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
    name: str | None = None


class _Call(NamedTuple):
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    replay: Replay
    retry: RetryPolicy | None
    name: str | None = None


def _resolve(call: _Call) -> _Call:
    """The call with partials applied and durable wrappers replaced by their function.

    A durable function's options apply unless the call sets its own: ``retry`` of the
    call wins, and the call reruns when either says ``replay="rerun"``; the outermost
    durable ``name=`` names the call.
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
        call = call._replace(
            fn=spec.target,
            replay=replay,
            retry=call.retry or spec.retry,
            name=call.name or spec.name,
        )


async def _call_journaled(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    replay: Replay,
    retry: RetryPolicy | None,
    name: str | None = None,
) -> Any:
    """What :func:`call` and a :func:`durable` function do, with options already checked
    (so that the called function's own arguments can be named anything)."""
    call = _resolve(_Call(fn, args, kwargs, replay, retry, name))
    fn, args, kwargs, replay, retry, given = call
    ctx = current_context()
    execution = ctx._execution if ctx is not None else None
    if execution is None or not execution.journaling or _inside_call.get():
        return await _with_retry(fn, args, kwargs, retry)
    name = given or function_name(fn)
    digest = argument_hash(args, kwargs)
    invoke = functools.partial(_outermost, fn, args, kwargs, retry)
    rebuild = functools.partial(rebuild_result, fn, name)
    if execution.telemetry is not None:
        return await execution.telemetry.call(
            execution, name, digest, replay, invoke, rebuild, (args, kwargs)
        )
    return await execution.journaled(name, digest, replay, invoke, rebuild)


async def call(
    fn: Callable[..., Any],
    /,
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
    A replayed result comes back as stored, or rebuilt as ``fn``'s return annotation when
    that holds a pydantic model, a dataclass or a TypedDict (``Model``, ``list[Model]``,
    ``Model | None``, ...). ``fn`` is positional-only: ``call(f, fn=1)`` passes ``fn=1`` to
    ``f``; ``replay`` and ``retry`` are the call's own.

    Args:
        fn: the function (sync or async) to call.
        replay: "record" replays a recorded outcome; "rerun" calls again and records anew.
        retry: retries before the outcome is recorded.

    Returns:
        The function's result, or on re-execution the recorded one.

    Raises:
        ConfigurationError: ``fn`` is not callable (naming what was given), or ``replay``
            or ``retry`` is not one of the allowed values; nothing is called or journaled.
        NonDeterminismError: the journal recorded another call at this position, or a
            result that cannot be rebuilt as ``fn``'s return annotation.
        JournaledCallError: replaying a call that failed for good; an instance of the
            failure's exception class too, so that the ``except`` clauses that caught
            the failure catch it (see :mod:`nestegg.journal_failures`).

    Example:
        >>> answer = await nestegg.call(llm.complete, prompt)
    """
    _check_callable(fn, "call() calls a function (sync or async)")
    _check_options(replay, retry)
    return await _call_journaled(fn, args, kwargs, replay, retry)


# -------------------------------------------------------------------- durable


class DurableDecorator(Protocol):
    """What ``durable(replay=..., retry=..., name=...)`` returns: a decorator that keeps the
    decorated function's parameters and makes it awaitable."""

    @overload
    def __call__(self, fn: AsyncFunction[P, T], /) -> AsyncFunction[P, T]: ...

    @overload
    def __call__(self, fn: Callable[P, T], /) -> AsyncFunction[P, T]: ...


@overload
def durable(
    fn: AsyncFunction[P, T],
    *,
    replay: Replay = ...,
    retry: RetryPolicy | None = ...,
    name: str | None = ...,
) -> AsyncFunction[P, T]: ...


@overload
def durable(
    fn: Callable[P, T],
    *,
    replay: Replay = ...,
    retry: RetryPolicy | None = ...,
    name: str | None = ...,
) -> AsyncFunction[P, T]: ...


@overload
def durable(
    *, replay: Replay = ..., retry: RetryPolicy | None = ..., name: str | None = ...
) -> DurableDecorator: ...


def durable(
    fn: Callable[..., Any] | None = None,
    *,
    replay: Replay = "record",
    retry: RetryPolicy | None = None,
    name: str | None = None,
) -> Any:
    """Decorate a function so that every call inside a checkpointed step is journaled.

    Works bare (``@durable``) and with options (``@durable(retry=...)``). The decorated
    function keeps its parameters (whatever their names: ``retry``, ``replay`` and ``fn``
    are the function's own) and is awaited (``await fetch(url)``), whether ``fn`` is sync
    or async; outside a checkpointed run it is a plain call.

    Args:
        fn: the function to decorate (sync or async).
        replay: "record" replays a recorded outcome; "rerun" calls again and records anew.
        retry: retries before the outcome is recorded.
        name: the name its calls are journaled under (default: the function's
            ``module.qualname``, see :func:`function_name`); a recorded call replays
            when the name and the arguments match, so a function with a fixed name can
            be renamed or moved while runs that called it are unfinished.

    Returns:
        The awaitable function, or (without ``fn``) a decorator that makes one.

    Raises:
        ConfigurationError: ``fn`` is not callable, or ``replay``, ``retry`` or ``name``
            is not one of the allowed values (checked when decorating).

    Example:
        >>> @nestegg.durable(retry=RetryPolicy(attempts=3), name="llm.ask")
        ... async def ask_llm(prompt: str) -> str: ...
    """
    _check_options(replay, retry)
    _check_name(name)

    def decorate(target: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
        _check_callable(target, "durable() decorates a function")

        @functools.wraps(target)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _call_journaled(target, args, kwargs, replay, retry, name)

        setattr(wrapper, _DURABLE_ATTRIBUTE, _Durable(wrapper, target, replay, retry, name))
        return wrapper

    return decorate(fn) if fn is not None else decorate
