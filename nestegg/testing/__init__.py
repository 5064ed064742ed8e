"""The store contract suite, shipped with nestegg: run it against your own store.

Every store fills :class:`~nestegg.checkpoint.stores.base.CheckpointStorage`; the suite
checks that it does so the way the built-in stores do (fenced claims and commits,
truncation, pruning, expiry, byte-for-byte bodies, concurrent handles). It needs pytest and
pytest-asyncio (``pip install 'nestegg[testing]'``).

To run it against a store of your own, write one test module::

    from nestegg.testing import register_store
    from nestegg.testing.suite import *  # noqa: F403  (the contract tests and fixtures)

    register_store("mine", lambda site: lambda: MyStore(site.tmp_path / "data"))

The factory gets a :class:`StoreSite` and returns a callable that opens a new handle on one
location isolated from every other test (each call: a new handle on the same data). Each
contract test then runs once per registered store, as ``test_...[mine]``. A server store
passes ``server=True`` (its tests are marked ``server``) and a ``cleanup`` coroutine
function that removes what the test left.

:class:`FakeClock` is a clock for ``CheckpointConfig(clock=...)`` that moves only when a
test advances it: leases, TTL and ``min_interval`` are then tested without sleeping.
"""

from __future__ import annotations

from nestegg.testing.clock import FakeClock
from nestegg.testing.registry import (
    RegisteredStore,
    StoreOpener,
    StoreSite,
    register_store,
    registered_store,
    registered_stores,
)

__all__ = [
    "FakeClock",
    "RegisteredStore",
    "StoreOpener",
    "StoreSite",
    "register_store",
    "registered_store",
    "registered_stores",
]
