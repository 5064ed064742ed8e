"""The Starlette application of ``nestegg ui``: routes, the store's lifetime, errors.

Everything it needs is served from the package (templates and static files beside this
module); it binds where it is told (the command refuses a non-loopback host unless asked),
answers only requests whose Host is one it serves, and writes only with ``allow_writes``
and the start-up token in the ``X-Nestegg-Token`` header.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote_to_bytes

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.clutch import Clutch
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    ConfigurationError,
    EventLogDamagedError,
    IncompatibleCheckpointError,
    InvalidIdentifierError,
    NestEggError,
    RunExistsError,
    RunLockedError,
    RunNotFoundError,
    RunWaiting,
    StorageUnavailableError,
    StoreRefusedError,
)
from nestegg.identifiers import check_name
from nestegg.ui import actions, live, pages
from nestegg.ui.render import STATIC, environment

log = logging.getLogger("nestegg.ui")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]", "::1")
_STATUS_BY_ERROR: tuple[tuple[type[NestEggError], int], ...] = (
    (RunNotFoundError, 404),
    (CheckpointNotFoundError, 404),
    (InvalidIdentifierError, 400),
    (StoreRefusedError, 503),  # the store's server refused the inspector's settings
    (ConfigurationError, 400),
    (RunExistsError, 409),
    (RunLockedError, 409),
    (RunWaiting, 409),
    (IncompatibleCheckpointError, 409),
    (EventLogDamagedError, 409),  # a run refused, unchanged: not the store's failure
    (StorageUnavailableError, 503),
    (CheckpointCorruptedError, 500),
)


@dataclass(frozen=True, slots=True)
class UISettings:
    """What the application serves and may do.

    Attributes:
        store_url: the store's URL (None: the embedded default); the command passes what
            ``--store`` or ``$NESTEGG_STORE`` chose.
        store: an open store to use instead of opening ``store_url`` (not closed here).
        clutch: the user's Clutch (``--app``), needed to resume and fork; only with
            ``allow_writes`` (it opens its store for writing, and serves nothing else).
        allow_writes: whether resume, fork, cancel, delete and prune are offered; without
            it ``store_url`` is opened read-only, as the commands that only read open it
            (nothing created or migrated; a PostgreSQL role allowed only to SELECT reads it).
        token: the secret a write must carry in ``X-Nestegg-Token``.
        hosts: the Host header values served (``*``: any).
        clock: the time leases are judged by (``time.time``; a test passes a FakeClock).
        app_options: the options of the commands the pages suggest that run the pipeline
            (``--app module:attr``, and ``--store`` when the Clutch needs it): ``nestegg
            ui --app`` passes its own; None: ``--app MODULE:CLUTCH``, to be filled in.
    """

    store_url: str | None = None
    store: CheckpointStorage | None = None
    clutch: Clutch | None = None
    allow_writes: bool = False
    token: str = ""
    hosts: Sequence[str] = field(default=LOOPBACK_HOSTS)
    clock: Callable[[], float] = time.time
    app_options: str | None = None


SECURITY_HEADERS = [
    # Only this application's own script runs, and no other site may frame its pages (a
    # framed page could be clicked into a write).
    (
        b"content-security-policy",
        b"default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    ),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


class SentPaths:
    """Gives the routes a path that is not UTF-8 (``/runs/%ED%A0%80``) with lone
    surrogates for those bytes, as the command gets such an argument, so that an id in it
    is refused as the command refuses it (400, ``run id '\\udced...' is not valid Unicode
    text``); the server's decoding made them U+FFFD, an id no run has (404). An id that
    holds an encoded slash (``/runs/a%2Fb``), which that decoding made two segments of
    (404, ``no page at /runs/a/b``), is refused so too (400, ``run id 'a/b' contains '/'
    ...``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        raw = scope.get("raw_path") if scope["type"] == "http" else None
        if raw:
            sent = [unquote_to_bytes(part.decode("latin-1")) for part in raw.split(b"/")]
            whole = b"/".join(sent)
            try:
                whole.decode()
            except UnicodeDecodeError:
                scope = {**scope, "path": whole.decode("utf-8", "surrogateescape")}
            segments = [segment.decode("utf-8", "surrogateescape") for segment in sent]
            if (refused := _slashed_id(scope, segments)) is not None:
                response = await _error(Request(scope), refused)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


ID_PARAMETERS = {"run_id": "run id", "checkpoint_id": "checkpoint id", "seq": "step"}
"""The path parameters that hold an id, and what a refusal of one calls it."""


def _slashed_id(scope: Scope, segments: list[str]) -> InvalidIdentifierError | None:
    """The refusal of the first segment of the path sent (``segments``, decoded) that
    holds a slash where a route takes an id; None when none does (or no route takes the
    path with each such segment as one: ``/nowhere/a%2Fb`` stays 404)."""
    slashed = [i for i, segment in enumerate(segments) if "/" in segment]
    if not slashed:
        return None
    stand_ins = [f"\0{i}" if i in slashed else segment for i, segment in enumerate(segments)]
    probe = {**scope, "path": "/".join(stand_ins)}
    for route in scope["app"].routes:
        matched, child = route.matches(probe) if isinstance(route, Route) else (Match.NONE, {})
        if matched is Match.NONE:
            continue
        named = {value: name for name, value in child["path_params"].items()}
        for i in slashed:
            if named.get(stand_ins[i]) in ID_PARAMETERS:
                try:
                    check_name(segments[i], ID_PARAMETERS[named[stand_ins[i]]])
                except InvalidIdentifierError as error:
                    return error
    return None


def status_for(error: BaseException) -> int:
    """The HTTP status a nestegg error answers with."""
    for kind, status in _STATUS_BY_ERROR:
        if isinstance(error, kind):
            return status
    return 500


async def _error(request: Request, error: Exception) -> Response:
    if isinstance(error, HTTPException):  # no such route, or a method it does not take
        status = error.status_code
        message = f"no page at {request.url.path}" if status == 404 else str(error.detail)
        return _answer(request, status, message, error.headers)
    status = status_for(error)
    if status >= 500 and not isinstance(error, NestEggError):
        log.error("error serving %s", request.url.path, exc_info=error)
    return _answer(request, status, " ".join(str(error).split()) or type(error).__name__)


def _answer(
    request: Request, status: int, message: str, headers: Mapping[str, str] | None = None
) -> Response:
    """An error as JSON (for the API, the live endpoints and streams) or as a page; a lone
    surrogate in it (a path that is not UTF-8) as its escape."""
    message = message.encode("utf-8", "backslashreplace").decode()
    if request.url.path.startswith(("/api/", "/events/")) or request.url.path.endswith("/live"):
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    templates = request.app.state.templates
    html = templates.get_template("error.html").render(status=status, message=message)
    return HTMLResponse(html, status_code=status, headers=headers)


@contextlib.asynccontextmanager
async def _opened(settings: UISettings) -> AsyncIterator[CheckpointStorage]:
    if settings.store is not None:
        yield settings.store
        return
    from nestegg.cli.apps import bound

    if settings.clutch is not None:  # with allow_writes (create_app refuses it without)
        async with bound(settings.clutch, settings.store_url) as store:
            yield store
        return
    from nestegg.cli.app import opened_store

    # Without writes, as the commands that only read open it: nothing created or migrated.
    async with opened_store(settings.store_url, read_only=not settings.allow_writes) as store:
        yield store


async def _close_transport(settings: UISettings) -> None:
    """Close the connection of the Clutch's transport that the resumes handed back over
    (the next use connects again): left open, its broker client's own tasks are left for
    the event loop's end to cancel."""
    transport = settings.clutch.transport if settings.clutch is not None else None
    if transport is not None:
        with contextlib.suppress(Exception):
            await transport.close()


def create_app(settings: UISettings) -> Starlette:
    """The ``nestegg ui`` application for ``settings``.

    Example:
        >>> app = create_app(UISettings(store_url="sqlite:///runs.db"))
        >>> # uvicorn.run(app, host="127.0.0.1", port=8765)

    Raises:
        ConfigurationError: a ``clutch`` without ``allow_writes``.
    """
    if settings.clutch is not None and not settings.allow_writes:
        raise ConfigurationError(
            "a clutch only resumes and forks runs, which need allow_writes=True; leave it "
            "out to browse the store read-only"
        )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with _opened(settings) as store:
            app.state.store = store
            try:
                yield
            finally:
                await actions.stop_background(app)
                await _close_transport(settings)

    app = Starlette(
        routes=[
            Route("/", pages.runs_page),
            Route("/runs/{run_id:str}", pages.run_page),
            Route("/runs/{run_id:str}/live", pages.run_live),
            Route("/runs/{run_id:str}/steps/{seq:str}", pages.step_page),
            Route("/checkpoints/{checkpoint_id:str}", pages.state_page),
            Route("/diff", pages.diff_page),
            Route("/events/runs", live.runs_events),
            Route("/events/runs/{run_id:str}", live.run_events),
            Route("/api/runs/{run_id:str}/resume", actions.resume, methods=["POST"]),
            Route("/api/runs/{run_id:str}/cancel", actions.cancel_run, methods=["POST"]),
            Route("/api/runs/{run_id:str}", actions.delete, methods=["DELETE"]),
            Route("/api/checkpoints/{checkpoint_id:str}/fork", actions.fork, methods=["POST"]),
            Route("/api/prune", actions.prune, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(TrustedHostMiddleware, allowed_hosts=list(settings.hosts)),
            Middleware(SentPaths),
        ],
        exception_handlers={HTTPException: _error, NestEggError: _error, Exception: _error},
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.templates = environment()
    app.state.background = set()
    app.state.resuming = set()  # the runs a resume of this application executes
    return app
