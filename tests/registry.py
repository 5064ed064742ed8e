"""The project's stores, registered once with :mod:`nestegg.testing` for every test that
runs against several kinds of store.

``store_target`` is the one place that decides where a test keeps a store of each kind:
embedded stores in the test's temp dir, PostgreSQL under its own table prefix, Redis under
its own key prefix. The contract suite (tests/stores), the checkpoint behaviour tests
(tests/checkpoint) and the crash tests (tests/crash) all open stores through it; the command
line tests (tests/cli) use it for the embedded stores (a command cannot name a prefix).
"""

from __future__ import annotations

from dataclasses import dataclass

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.testing import StoreOpener, StoreSite, register_store
from tests.crash.child import open_test_store
from tests.servers import delete_redis_keys, drop_postgres_tables

EMBEDDED_KINDS = ("memory", "file", "sqlite")
SERVER_KINDS = ("postgres", "redis")
SQLITE_FILE = "nestegg.db"
FILE_STORE_DIR = "filestore"


@dataclass(frozen=True)
class StoreTarget:
    """Where a store keeps its runs: a URL and, for a server, its own table or key prefix."""

    kind: str
    url: str
    prefix: str | None = None

    def open(self) -> CheckpointStorage:
        """A new handle on the store (the caller sets it up and closes it)."""
        return open_test_store(self.url, self.prefix)

    def args(self) -> list[str]:
        """Command-line arguments of the crash child naming this store."""
        return ["--store", self.url] + (["--prefix", self.prefix] if self.prefix else [])


def store_target(kind: str, site: StoreSite) -> StoreTarget:
    """The isolated location of a ``file``, ``sqlite``, ``postgres`` or ``redis`` store for
    the test of ``site``."""
    if kind == "file":
        return StoreTarget(kind, (site.tmp_path / FILE_STORE_DIR).as_uri())
    if kind == "sqlite":
        return StoreTarget(kind, f"sqlite:///{site.tmp_path / SQLITE_FILE}")
    if kind == "postgres":
        return StoreTarget(kind, site.request.getfixturevalue("pg_url"), f"t{site.tag}_")
    return StoreTarget(kind, site.request.getfixturevalue("redis_url"), f"nestegg-test:{site.tag}:")


async def clean_server(site: StoreSite, kind: str) -> None:
    """Remove what a test left under its prefix on the server of ``kind``."""
    target = store_target(kind, site)
    if kind == "postgres":
        await drop_postgres_tables(target.url, target.prefix or "")
    else:
        await delete_redis_keys(target.url, target.prefix or "")


def _open_memory(_: StoreSite) -> StoreOpener:
    shared = MemoryCheckpointStorage()
    return lambda: shared


async def _clean_postgres(site: StoreSite) -> None:
    await clean_server(site, "postgres")


async def _clean_redis(site: StoreSite) -> None:
    await clean_server(site, "redis")


register_store("memory", _open_memory)
register_store("file", lambda site: store_target("file", site).open)
register_store("sqlite", lambda site: store_target("sqlite", site).open)
register_store(
    "postgres",
    lambda site: store_target("postgres", site).open,
    cleanup=_clean_postgres,
    server=True,
)
register_store(
    "redis", lambda site: store_target("redis", site).open, cleanup=_clean_redis, server=True
)
