"""Journaled calls: never pay twice for an LLM call inside a step.

Inside an agent of a checkpointed run, ``await call(fn, ...)`` (or a function decorated
with :func:`durable`) commits the call's result to the run's journal as soon as it
returns. When the step runs again after a crash or a failure, recorded results are
returned in order without calling the function again. A call is identified by its step,
its position among the step's calls and the function's qualified name; its arguments
are hashed, and a re-execution that calls something else at a position raises
:class:`NonDeterminismError` (unless the call says ``replay="rerun"``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, ParamSpec, TypeVar

import orjson

from nestegg.context import current_context
from nestegg.errors import ConfigurationError

P = ParamSpec("P")
T = TypeVar("T")
Replay = Literal["record", "rerun"]


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a journaled call before its outcome is recorded.

    Args:
        attempts: how many tries in all (1: no retry).
        backoff: seconds before the second try; doubled before each further one.
        on: exception types that are retried; others are recorded at once.

    Example:
        >>> await call(llm.complete, prompt, retry=RetryPolicy(attempts=3, backoff=0.5))
    """

    attempts: int = 3
    backoff: float = 0.5
    on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise ConfigurationError(f"RetryPolicy.attempts must be >= 1, got {self.attempts!r}")
        if self.backoff < 0:
            raise ConfigurationError(f"RetryPolicy.backoff must be >= 0, got {self.backoff!r}")


def function_name(fn: Callable[..., Any]) -> str:
    """The qualified name that identifies a journaled function."""
    target = inspect.unwrap(fn)
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


async def call(
    fn: Callable[..., Any],
    *args: Any,
    replay: Replay = "record",
    retry: RetryPolicy | None = None,
    **kwargs: Any,
) -> Any:
    """Call ``fn(*args, **kwargs)`` once per run step, journaled.

    Sync functions run in a worker thread. Outside a checkpointed run this is a plain
    call.

    Args:
        fn: the function (sync or async) to call.
        replay: "record" replays a recorded outcome; "rerun" calls again and records anew.
        retry: retries before the outcome is recorded.

    Returns:
        The function's result, or on re-execution the recorded one.

    Raises:
        NonDeterminismError: the journal recorded another call at this position.
        JournaledCallError: replaying a call that failed for good.

    Example:
        >>> answer = await nestegg.call(llm.complete, prompt)
    """
    if replay not in ("record", "rerun"):
        raise ConfigurationError(f"replay must be 'record' or 'rerun', got {replay!r}")
    ctx = current_context()
    execution = ctx._execution if ctx is not None else None
    if execution is None or not execution.journaling:
        return await _with_retry(fn, args, kwargs, retry)
    name = function_name(fn)
    digest = argument_hash(args, kwargs)
    return await execution.journaled(
        name, digest, replay, lambda: _with_retry(fn, args, kwargs, retry)
    )


def durable(
    fn: Callable[P, Any] | None = None,
    *,
    replay: Replay = "record",
    retry: RetryPolicy | None = None,
) -> Any:
    """Decorate a function so that every call inside a checkpointed step is journaled.

    The decorated function is awaited (``await fetch(url)``), whether ``fn`` is sync or
    async; outside a checkpointed run it is a plain call.

    Example:
        >>> @nestegg.durable(retry=RetryPolicy(attempts=3))
        ... async def ask_llm(prompt: str) -> str: ...
    """

    def decorate(target: Callable[P, Any]) -> Callable[P, Any]:
        @functools.wraps(target)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            return await call(target, *args, replay=replay, retry=retry, **kwargs)

        return wrapper

    return decorate(fn) if fn is not None else decorate
