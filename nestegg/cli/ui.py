"""The ``nestegg ui`` command: serve the run inspector in the browser."""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import typer

from nestegg.cli.app import (
    CommandError,
    StoreOption,
    app,
    describe_store,
    embedded_absent,
    explicit_store,
    file_store,
    run_async,
    run_with_store,
    server_absent,
    sqlite_store,
    store_url,
)
from nestegg.cli.apps import APP_HELP, import_app, own_store
from nestegg.cli.operate import app_options
from nestegg.constants import EXIT_FAILED, EXIT_USAGE
from nestegg.errors import MissingDependencyError

if TYPE_CHECKING:
    import socket

    from nestegg.checkpoint.stores.base import CheckpointStorage

DEFAULT_PORT = 8765
DEFAULT_HOST = "127.0.0.1"
SHUTDOWN_SECONDS = 2


def is_loopback(host: str) -> bool:
    """Whether ``host`` only answers this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@app.command("ui")
def ui_command(
    ctx: typer.Context,
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free one).")
    ] = DEFAULT_PORT,
    host: Annotated[
        str, typer.Option(help="Address or host name to bind (loopback by default).")
    ] = DEFAULT_HOST,
    app_spec: Annotated[
        str | None, typer.Option("--app", "-a", help=APP_HELP, show_default=False)
    ] = None,
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes",
            help="Offer resume, fork (with --app, which needs it), cancel, delete and prune; "
            "each needs the token printed at start-up.",
        ),
    ] = False,
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow a --host other machines can reach.")
    ] = False,
    store: StoreOption = None,
) -> None:
    """Inspect runs in the browser: runs, timelines, states, diffs, live.

    Serves http://HOST:PORT/ until Ctrl-C. Read-only unless --allow-writes.
    """
    if app_spec and not allow_writes:  # its Clutch would open its own store for writing
        raise CommandError(
            "--app needs --allow-writes: the Clutch only resumes and forks runs; to browse "
            "the store it names, give that store with --store",
            EXIT_USAGE,
        )
    target = resolve(host, port)
    local = is_loopback(target.address[0])
    if not local and not allow_remote:
        raise CommandError(
            f"--host {host} is reachable from other machines; add --allow-remote to mean it",
            EXIT_USAGE,
        )
    import secrets

    from nestegg.cli.render import Output

    try:
        import uvicorn

        from nestegg.ui import UISettings, create_app
    except ImportError as error:
        raise MissingDependencyError(
            f"nestegg ui needs its extra: pip install 'nestegg[ui]' ({error})"
        ) from error
    clutch = import_app(app_spec) if app_spec else None
    url = store_url(ctx, store)
    own = own_store(clutch) if clutch is not None else None
    if own is None:  # the store must be there and answer
        run_with_store(ctx, store, _reachable, existing=True, read_only=not allow_writes)
    else:  # nor is the Clutch's own store created: a wrong path or prefix is an error
        _refuse_absent(own, _own_where(own, app_spec))
    listening = listen(target)
    port = listening.getsockname()[1]
    token = secrets.token_urlsafe(24)
    hosts = ["127.0.0.1", "localhost", "[::1]", host] if local else ["*"]
    settings = UISettings(
        store_url=url, clutch=clutch, allow_writes=allow_writes, token=token, hosts=hosts,
        app_options=app_options(ctx, app_spec, store, clutch) if app_spec and clutch else None,
    )  # fmt: skip
    shown = url_host(host)
    out = Output()
    described = describe_store(url)
    if own is not None:
        described = _own_where(own, app_spec)
        if explicit_store(ctx, store):
            out.note(f"note: the Clutch at {app_spec} names its own store; --store is ignored")
    out.line(f"nestegg ui: http://{shown}:{port}/ (store: {described})")
    if allow_writes:
        out.line(f"write token: {token}")
        out.line(f"open http://{shown}:{port}/?token={quote(token)} to allow writes from the page")
    out.line("Ctrl-C stops it")
    sys.stdout.flush()
    config = uvicorn.Config(
        create_app(settings),
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,  # open live pages do not hold it up
    )
    uvicorn.Server(config).run(sockets=[listening])


def url_host(host: str) -> str:
    """``host`` as a URL names it (an IPv6 address in brackets)."""
    bare = host.strip("[]")
    return f"[{bare}]" if ":" in bare else bare


def _own_where(store: CheckpointStorage, spec: str | None) -> str:
    """Where the store a Clutch names is, as the start line and a refusal show it."""
    files, sqlite = file_store(store), sqlite_store(store)
    where: object = files.root if files is not None else None
    if sqlite is not None:
        where = sqlite.path
    where = getattr(store, "where", where)  # a server store's: its server and prefix
    names = f"the store the Clutch at {spec} names"
    return names if where is None else f"{where} ({names})"


def _refuse_absent(store: CheckpointStorage, where: str) -> None:
    """Refuse (exit 3) the store a Clutch names, shown as ``where``, when it is not there:
    an embedded one never created, a server one never set up; nothing is created.

    Raises:
        CommandError: no store there (exit 3).
        StorageUnavailableError: its server cannot be reached.
    """
    if (absent := embedded_absent(store, where, from_url=False)) is not None:
        raise absent
    if not callable(getattr(store, "exists", None)):
        return

    async def look() -> CommandError | None:
        try:
            return await server_absent(store, where)
        finally:  # the inspector's own event loop opens it again
            await store.close()

    if (absent := run_async(look)) is not None:
        raise absent


async def _reachable(store: CheckpointStorage) -> None:
    await store.list_runs(limit=1)


@dataclass(frozen=True, slots=True)
class BindAddress:
    """Where to listen: ``--host`` and ``--port`` as given, and the address they name."""

    host: str
    port: int
    family: socket.AddressFamily
    kind: socket.SocketKind
    proto: int
    address: tuple[Any, ...]


def resolve(host: str, port: int) -> BindAddress:
    """The address ``host`` names (its first, the one bound and judged loopback or not),
    resolved once, before anything is opened or printed.

    Raises:
        CommandError: (bad usage, exit 2) ``host`` does not resolve to an address.
    """
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM
        )[0]
    except (OSError, UnicodeError) as error:  # UnicodeError: no host name (``a..b``)
        why = error.strerror if isinstance(error, OSError) else "not a host name"
        raise CommandError(f"--host {host!r} does not resolve: {why}", EXIT_USAGE) from None
    return BindAddress(host, port, family, kind, proto, tuple(address))


def listen(target: BindAddress) -> socket.socket:
    """A socket listening on ``target`` (port 0: a free one), before anything is printed:
    an address in use or that cannot be bound is the command's error.

    Raises:
        CommandError: it cannot listen there (exit 1).
    """
    import socket

    shown, port = url_host(target.host), target.port
    try:
        listening = socket.socket(target.family, target.kind, target.proto)
    except OSError as error:
        raise CommandError(
            f"cannot listen on {shown}:{port}: {error.strerror}", EXIT_FAILED
        ) from error
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if target.family == socket.AF_INET6:
            listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        listening.bind(target.address)
        listening.listen(2048)
    except OSError as error:
        listening.close()
        raise CommandError(
            f"cannot listen on {shown}:{port}: {error.strerror}", EXIT_FAILED
        ) from error
    listening.set_inheritable(True)
    return listening
