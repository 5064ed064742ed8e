"""Bounded retries with exponential backoff for store operations that are safe to repeat."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from nestegg.constants import STORE_RETRY_BASE_DELAY, STORE_RETRY_MAX_DELAY
from nestegg.errors import StorageUnavailableError

T = TypeVar("T")


def backoff_delay(attempt: int, base: float = STORE_RETRY_BASE_DELAY) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): ``base``, doubling,
    capped at STORE_RETRY_MAX_DELAY."""
    return float(min(base * 2**attempt, STORE_RETRY_MAX_DELAY))


async def retry_unavailable(
    operation: Callable[[], Awaitable[T]],
    retries: int,
    on_failure: Callable[[], Awaitable[None]] | None = None,
    deadline: float | None = None,
) -> T:
    """Run ``operation``; while it raises StorageUnavailableError, retry up to ``retries``
    times with backoff, calling ``on_failure`` (for example a pool check) before each wait.

    Args:
        operation: an idempotent operation (safe to apply twice).
        retries: how many times to retry after the first failure.
        on_failure: called after each failure; its own errors are ignored.
        deadline: seconds after the first try past which no retry starts (an attempt
            that itself waited for a connection that long has waited enough).

    Returns:
        What ``operation`` returned.

    Raises:
        StorageUnavailableError: the last failure, once the retries are used up.
    """
    attempt = 0
    started = time.monotonic()
    while True:
        try:
            return await operation()
        except StorageUnavailableError:
            late = deadline is not None and time.monotonic() - started >= deadline
            if attempt >= retries or late:
                raise
        if on_failure is not None:
            with contextlib.suppress(Exception):  # best effort: the retry reports failures
                await on_failure()
        await asyncio.sleep(backoff_delay(attempt))
        attempt += 1
