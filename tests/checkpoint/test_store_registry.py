"""The one registry of stores (stores/registry.py): lazy names, schemes, missing drivers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import nestegg.checkpoint
from nestegg.checkpoint.stores import NO_SCHEME, open_store, store_class
from nestegg.checkpoint.stores.base import BlockHistoryStore, CheckpointStorage, DroppableStore
from nestegg.checkpoint.stores.registry import BY_SCHEME, STORES, StoreEntry, import_store
from nestegg.errors import ConfigurationError, MissingDependencyError
from nestegg.urls import UNREADABLE_USER, without_password


@pytest.mark.parametrize("entry", STORES, ids=[entry.name for entry in STORES])
def test_every_entry_is_a_lazy_name_of_nestegg_checkpoint(entry: StoreEntry) -> None:
    assert entry.name in nestegg.checkpoint.__all__
    assert getattr(nestegg.checkpoint, entry.name) is import_store(entry)


@pytest.mark.parametrize("scheme", sorted(BY_SCHEME))
def test_every_scheme_names_a_class_that_fills_the_protocol(scheme: str) -> None:
    cls = store_class(scheme)
    assert cls.__name__ == BY_SCHEME[scheme].name
    assert issubclass(cls, CheckpointStorage)


def test_open_store_builds_the_registered_class(tmp_path: Path) -> None:
    for url in ("memory://", f"sqlite:///{tmp_path / 'a.db'}", (tmp_path / "f").as_uri()):
        store = open_store(url)
        assert type(store) is store_class(url.split(":", 1)[0])


def test_an_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(ConfigurationError, match="unknown store scheme 'mysql'; known: file, "):
        open_store("mysql://x")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (None, "a store URL is a string, got None"),
        (5, "a store URL is a string, got 5"),
        (Path("x.db"), "a store URL is a string, got PosixPath('x.db') (a path: "
         "open_store(f'sqlite:///{path}'))"),
    ],
)  # fmt: skip
def test_a_store_url_that_is_no_string_is_a_configuration_error(
    given: object, message: str
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        open_store(given)  # type: ignore[arg-type]
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("host=127.0.0.1 dbname=test password=s3cret", "host=127.0.0.1 dbname=test password=***"),
        ("host=db password = 's3 cr\\'et' user=app", "host=db password = *** user=app"),
        ("runs.db", "runs.db"),
    ],
)
def test_a_string_with_no_scheme_is_named_without_its_password(given: str, shown: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        open_store(given)
    assert str(raised.value) == f"store URL {shown!r}: {NO_SCHEME}"
    assert "s3" not in str(raised.value)


def test_an_unknown_name_of_nestegg_checkpoint_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="NoSuchStorage"):
        nestegg.checkpoint.NoSuchStorage  # noqa: B018


@pytest.mark.parametrize(
    ("driver", "scheme", "extra"),
    [("psycopg", "postgresql", "postgres"), ("redis", "redis", "redis")],
)
def test_a_missing_driver_names_the_extra_through_the_registry(
    monkeypatch: pytest.MonkeyPatch, driver: str, scheme: str, extra: str
) -> None:
    module = BY_SCHEME[scheme].module_path
    monkeypatch.setitem(sys.modules, driver, None)
    monkeypatch.delitem(sys.modules, module)
    for build in (
        lambda: store_class(scheme),
        lambda: open_store(f"{scheme}://127.0.0.1/0"),
        lambda: getattr(nestegg.checkpoint, BY_SCHEME[scheme].name),
    ):
        with pytest.raises(MissingDependencyError, match=rf"pip install 'nestegg\[{extra}\]'"):
            build()
    assert module not in sys.modules


def test_only_the_sqlite_store_keeps_block_history(tmp_path: Path) -> None:
    stores = {
        "memory": open_store("memory://"),
        "file": open_store((tmp_path / "f").as_uri()),
        "sqlite": open_store(f"sqlite:///{tmp_path / 'a.db'}"),
    }
    kinds = {kind for kind, store in stores.items() if isinstance(store, BlockHistoryStore)}
    assert kinds == {"sqlite"}
    assert not any(isinstance(store, DroppableStore) for store in stores.values())


@pytest.mark.parametrize(
    "url",
    [
        "redis://[bad",
        "rediss://[::1",
        "redis://cache:port/0",
        "redis://u:s3cret/x@cache:6379/0",  # a '/' in the password, not %-escaped
        "postgresql://[bad",
        "postgresql://db:99999/app",
        "postgresql://u:s3cret/x@db/app",
        "file://[bad",
        "sqlite://[bad/x.db",
    ],
)
def test_a_store_url_whose_host_or_port_cannot_be_read_names_it_without_its_password(
    url: str,
) -> None:
    with pytest.raises(ConfigurationError, match="its host or port cannot be read") as refused:
        open_store(url)
    assert str(refused.value).startswith(f"store URL {without_password(url)!r}: ")
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://u:123/s3cret@cache:6379/0",
        "postgresql://u:123/s3cret@db/a",
        "redis://u:123?s3cret=x@cache:6379/0",  # redis-py: "unexpected keyword 's3cret'"
        "postgresql://u:123?sslmode=s3cret@db/a",
    ],
)
def test_a_password_of_digits_then_slash_is_refused_without_quoting_any_of_it(url: str) -> None:
    shown = without_password(url)
    with pytest.raises(ConfigurationError) as opened:
        open_store(url)
    assert str(opened.value) == f"store URL {shown!r}: {UNREADABLE_USER}"
    with pytest.raises(ConfigurationError, match="percent-encode the password") as built:
        store_class(url.partition(":")[0])(url)
    for refused in (opened.value, built.value):
        assert "123" not in str(refused) and "s3cret" not in str(refused)


@pytest.mark.parametrize("url", ["redis://cache:port/0", "postgresql://u:s3cret/x@db/app"])
def test_a_store_built_from_a_url_whose_host_cannot_be_read_says_so(url: str) -> None:
    cls = store_class(url.partition(":")[0])
    with pytest.raises(ConfigurationError, match="its host or port cannot be read") as refused:
        cls(url)
    assert "s3cret" not in str(refused.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///x.db?prefix=app:", "SQLite store URL 'sqlite:///x.db?prefix=app:'"),
        ("sqlite://?read_only", "SQLite store URL 'sqlite://?read_only'"),
        ("file:///tmp/store?prefix=app:", "file store URL 'file:///tmp/store?prefix=app:'"),
        ("memory://?prefix=app:", "memory store URL 'memory://?prefix=app:'"),
    ],
)
def test_a_query_option_of_an_embedded_or_memory_store_url_is_refused(
    url: str, message: str
) -> None:
    # these stores take no option in their URL: one given would be ignored
    option = url.partition("?")[2].partition("=")[0]
    with pytest.raises(ConfigurationError) as refused:
        open_store(url)
    assert str(refused.value) == f"{message}: unknown query option {option!r}"


@pytest.mark.parametrize(
    ("url", "forms"),
    [
        ("sqlite:x.db", "sqlite:///x.db for 'x.db' in the current directory, sqlite:////x.db"),
        (
            "sqlite:/a/x.db",
            "sqlite:///a/x.db for 'a/x.db' in the current directory, sqlite:////a/x.db",
        ),
        ("file:store", "file://./store for 'store' in the current directory, file:///store"),
    ],
)
def test_a_path_url_without_two_slashes_is_refused_showing_the_forms(url: str, forms: str) -> None:
    # sqlite:x.db read as the path '.db', sqlite:/a/x.db as the relative 'a/x.db'
    scheme, _, path = url.partition(":")
    kind = "SQLite" if scheme == "sqlite" else "file"
    with pytest.raises(ConfigurationError) as refused:
        open_store(url)
    assert str(refused.value) == (
        f"{kind} store URL {url!r}: {scheme}: is followed by '//' and the path: {forms} for "
        f"'/{path.lstrip('/')}'"
    )


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://localhost/"])
def test_a_sqlite_url_with_no_path_is_refused_not_opened_in_memory(url: str) -> None:
    # sqlite:/// was a store in memory, which keeps nothing; sqlite:// still is one
    with pytest.raises(ConfigurationError) as refused:
        open_store(url)
    assert str(refused.value) == (
        f"SQLite store URL {url!r}: it names no file: sqlite:///path/to/file.db (relative to "
        "the current directory), sqlite:////path/to/file.db (absolute), or sqlite:// for a "
        "store in memory"
    )


@pytest.mark.parametrize(
    ("url", "host", "path"),
    [
        ("file://relative", "relative", "relative"),
        ("file://runs/x", "runs", "runs/x"),
        ("file://me:s3cret@runs/x", "me@runs", "me@runs/x"),
    ],
)
def test_a_file_url_with_a_host_is_refused_showing_the_forms(
    url: str, host: str, path: str
) -> None:
    # file://relative was read as the host 'relative', and the store created ./relative
    with pytest.raises(ConfigurationError) as refused:
        open_store(url)
    assert str(refused.value) == (
        f"file store URL {without_password(url)!r}: {host!r} would be read as a host, which "
        f"a file URL has none of: file:///absolute/dir, or file://./{path} for {path!r} in "
        "the current directory"
    )


def test_the_forms_of_embedded_and_memory_store_urls_still_open(tmp_path: Path) -> None:
    assert open_store(f"sqlite:///{tmp_path}/x.db").path == tmp_path / "x.db"
    assert open_store("sqlite://").path == ":memory:"
    assert open_store(f"file://{tmp_path}/s").root == tmp_path / "s"
    assert open_store("file://./rel/dir").root == Path("rel/dir")
    assert open_store("file://../rel").root == Path("../rel")
    assert open_store("file://localhost/var/x").root == Path("/var/x")
    open_store("memory://")


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///{tmp}/p.db?max_pending_commits=8",
        "sqlite://?max_pending_commits=8",
        "postgresql://app@db/app?table_prefix=x_&max_pending_commits=8",
        "redis://cache:6379/0?max_pending_commits=8&prefix=app:",
    ],
)
def test_a_store_url_gives_the_stores_max_pending_commits(url: str, tmp_path: Path) -> None:
    # the constructor's max_pending_commits=, reached by --store and NESTEGG_STORE too
    store = open_store(url.format(tmp=tmp_path))
    gate = store._group._gate  # type: ignore[attr-defined]
    assert gate is not None and gate.max_pending == 8
    assert getattr(store, "table_prefix", "x_") == "x_"
    assert getattr(store, "prefix", "app:") == "app:"
    assert open_store(url.format(tmp=tmp_path).partition("?")[0])._group._gate is None  # type: ignore[attr-defined]


@pytest.mark.parametrize("value", ["0", "-1", "x", "1.5", "", "none", "٣"])
@pytest.mark.parametrize(
    "base", ["sqlite:///p.db", "postgresql://app:s3cret@db/app", "redis://:s3cret@cache:6379/0"]
)
def test_a_store_url_refuses_a_max_pending_commits_that_is_no_positive_integer(
    base: str, value: str
) -> None:
    url = f"{base}?max_pending_commits={value}"
    with pytest.raises(ConfigurationError) as refused:
        open_store(url)
    assert str(refused.value) == (
        f"store URL {without_password(url)!r}: the query option max_pending_commits takes a "
        f"positive integer, got {value!r}"
    )
    assert "s3cret" not in str(refused.value)


def test_loaded_class_is_a_store_s_class_once_its_module_is_imported_and_imports_none() -> None:
    code = (
        "import sys\n"
        "from nestegg.checkpoint.stores.registry import loaded_class\n"
        "before = loaded_class('FileCheckpointStorage')\n"
        "imported = 'nestegg.checkpoint.stores.file.store' in sys.modules\n"
        "from nestegg.checkpoint.stores.file import FileCheckpointStorage\n"
        "print(before, imported, loaded_class('FileCheckpointStorage') is FileCheckpointStorage)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["None", "False", "True"]
