"""The stores the contract suite runs against: :func:`register_store` adds one.

A registered store is a name and a factory. The factory gets a :class:`StoreSite` (a temp
dir, a tag unique to the test, the pytest request) and returns an opener: a callable that
opens a new handle on that one isolated location each time it is called (every handle sees
the same data). An optional ``cleanup`` removes what the location left on a server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import ConfigurationError

StoreOpener = Callable[[], CheckpointStorage]
"""Opens a new (not yet set up) handle on one isolated store location."""


@dataclass(frozen=True)
class StoreSite:
    """Where one test keeps its store: ``tmp_path`` (the test's temp dir), ``tag`` (a short
    hex string unique to the test, for a table or key prefix) and ``request`` (the pytest
    request, for fixtures such as a server URL)."""

    tmp_path: Path
    tag: str
    request: Any


StoreFactory = Callable[[StoreSite], StoreOpener]
StoreCleanup = Callable[[StoreSite], Awaitable[None]]


@dataclass(frozen=True)
class RegisteredStore:
    """One store the suite runs against; ``server`` marks its tests ``server``."""

    name: str
    factory: StoreFactory
    cleanup: StoreCleanup | None = None
    server: bool = False


_REGISTERED: dict[str, RegisteredStore] = {}


def register_store(
    name: str,
    factory: StoreFactory,
    *,
    cleanup: StoreCleanup | None = None,
    server: bool = False,
) -> None:
    """Run the contract suite against the store ``factory`` opens.

    Args:
        name: the test id of the store (``test_x[name]``); registering a name again
            replaces its entry.
        factory: given a :class:`StoreSite`, returns a callable that opens a new handle on
            one location isolated from every other test.
        cleanup: awaited after the test, once every handle is closed (drop a schema, delete
            keys).
        server: the store needs a server; its tests are marked ``server``.

    Example:
        >>> register_store("mine", lambda site: lambda: MyStore(site.tmp_path / "db"))
    """
    _REGISTERED[name] = RegisteredStore(name, factory, cleanup, server)


def registered_stores() -> list[RegisteredStore]:
    """Every registered store, in the order they were registered."""
    return list(_REGISTERED.values())


def registered_store(name: str) -> RegisteredStore:
    """The store registered as ``name``.

    Raises:
        ConfigurationError: no store has that name.
    """
    try:
        return _REGISTERED[name]
    except KeyError:
        known = ", ".join(_REGISTERED) or "none"
        raise ConfigurationError(f"no store registered as {name!r}; registered: {known}") from None
