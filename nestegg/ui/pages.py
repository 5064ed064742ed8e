"""The HTML pages: runs, a run, one step, a state and a diff."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.common import check_status
from nestegg.cli.paths import PathNotFoundError, select
from nestegg.cli.wait_words import placeholder_options
from nestegg.clutch import Clutch
from nestegg.constants import FORK_SCAN, LARGEST_NUMBER, LISTED_STATUSES
from nestegg.errors import CheckpointNotFoundError, ConfigurationError, InvalidIdentifierError
from nestegg.identifiers import check_pipeline_filter
from nestegg.ui import queries

if TYPE_CHECKING:  # the application imports this module
    from nestegg.ui.app import UISettings

TOKEN_PARAMETER = "token"
"""Taken by every HTML page: the page's script keeps the write token and drops it from the
address."""
FRAGMENTS = ("rows",)
"""What ``?fragment=`` of the runs page may ask for (the table's rows alone)."""
Endpoint = Callable[[Request], Awaitable[Response]]


def store_of(request: Request) -> CheckpointStorage:
    """The store the application opened."""
    store: CheckpointStorage = request.app.state.store
    return store


def now_of(request: Request) -> float:
    """The time leases are judged by, from the application's clock."""
    now: float = request.app.state.settings.clock()
    return now


def _flags(request: Request) -> dict[str, Any]:
    """What the templates offer: writes, and resume and fork (they need the Clutch); the
    options a command the page suggests needs (``app_options(pipeline)``: the pipeline's
    --app, and the --store this page reads; ``--app MODULE:CLUTCH`` when no --app of that
    pipeline was given)."""
    settings = request.app.state.settings
    return {
        "writes": settings.allow_writes,
        "can_run": settings.allow_writes and settings.clutch is not None,
        "app_options": functools.partial(_app_options, settings),
    }


def _app_options(settings: UISettings, pipeline: str) -> str:
    """The options of a command that runs a run of ``pipeline``: those ``nestegg ui --app``
    gave, for its Clutch's pipeline; else ``--app MODULE:CLUTCH``, to be filled in."""
    clutch = settings.clutch
    if settings.app_options and clutch is not None and clutch.name == pipeline:
        return settings.app_options
    return placeholder_options(settings.store_url)


def _runner(request: Request) -> Clutch | None:
    """The Clutch whose resumes and forks the page offers (None: it offers none)."""
    clutch: Clutch | None = request.app.state.settings.clutch
    return clutch if _flags(request)["can_run"] else None


def _render(request: Request, name: str, **context: Any) -> HTMLResponse:
    context.update(_flags(request))
    html = request.app.state.templates.get_template(name).render(**context)
    return HTMLResponse(html)


def takes(*names: str) -> Callable[[Endpoint], Endpoint]:
    """Declare the query parameters an endpoint reads. A request with any other, or with
    one of them more than once, is refused before the endpoint runs (ConfigurationError,
    400, naming the parameter), so a misspelt filter or a parameter the endpoint does not
    have (``?limit=``) is not silently ignored."""

    def declare(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def checked(request: Request) -> Response:
            check_params(request, names)
            return await endpoint(request)

        return checked

    return declare


def check_params(request: Request, names: tuple[str, ...]) -> None:
    """Refuse a query parameter that is not one of ``names``, is given more than once, or
    whose value is not UTF-8 (``%ED%A0%80``, which the server's decoding turns into
    U+FFFD, a value that is not the one sent).

    Raises:
        ConfigurationError: naming the unknown parameters, or the first one given twice.
        InvalidIdentifierError: naming the parameter and its value, lone surrogates for
            the bytes that are not UTF-8 (as the command gets such an argument).
    """
    raw = request.scope.get("query_string", b"").decode("latin-1")
    for name, value in parse_qsl(raw, keep_blank_values=True, errors="surrogateescape"):
        if any("\udc80" <= char <= "\udcff" for char in value):  # what surrogateescape made
            raise InvalidIdentifierError(
                f"?{name}= {value!r} is not valid Unicode text (bytes that are not UTF-8)"
            )
    given = request.query_params
    if unknown := [name for name in given if name not in names]:
        raise ConfigurationError(
            f"unknown parameter{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; this address takes "
            f"{', '.join(names) or 'none'}"
        )
    for name in names:
        if (count := len(given.getlist(name))) > 1:
            raise ConfigurationError(f"{name} is given {count} times; give it once")


def pipeline_param(request: Request) -> str | None:
    """The pipeline filter in ``?pipeline=`` (None if absent or empty).

    Raises:
        InvalidIdentifierError: a name no pipeline can have (a NUL), as ``nestegg runs
            --pipeline`` refuses it.
    """
    return check_pipeline_filter(request.query_params.get("pipeline") or None)


def int_param(request: Request, name: str, least: int = 0) -> int | None:
    """The whole number from ``least`` to LARGEST_NUMBER in query parameter ``name`` (None
    if absent); bad input otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    # as the pages write numbers: not 01, +1, " 1" or 1_0, which int() takes; and not
    # read past the largest's digits (int() refuses over 4,300)
    if not queries.WHOLE_NUMBER.fullmatch(raw):
        number = least - 1
    elif len(raw.lstrip("-")) > len(str(LARGEST_NUMBER)):
        number = -LARGEST_NUMBER if raw.startswith("-") else LARGEST_NUMBER + 1
    else:
        number = int(raw)
    if number < least:
        raise ConfigurationError(f"{name} must be a whole number >= {least}, got {raw!r}")
    if number > LARGEST_NUMBER:
        raise ConfigurationError(f"{name} must be at most {LARGEST_NUMBER}, got {raw!r}")
    return number


def status_param(request: Request) -> str | None:
    """The status filter in ``?status=`` (None if absent): a run status or ``interrupted``.

    Raises:
        ConfigurationError: another value.
    """
    status = request.query_params.get("status") or None
    if status is not None:
        check_status(status, LISTED_STATUSES)
    return status


def fragment_param(request: Request) -> str | None:
    """The part of the page ``?fragment=`` asks for alone (None: the whole page).

    Raises:
        ConfigurationError: a part the page does not have.
    """
    fragment = request.query_params.get("fragment") or None
    if fragment is not None and fragment not in FRAGMENTS:
        raise ConfigurationError(f"unknown fragment {fragment!r}; one of {', '.join(FRAGMENTS)}")
    return fragment


@takes("status", "pipeline", "before", "fragment", TOKEN_PARAMETER)
async def runs_page(request: Request) -> HTMLResponse:
    """The runs table: filters by status and pipeline, a page at a time (``?before=``);
    ``?fragment=rows``: the table's rows alone."""
    status = status_param(request)
    pipeline = pipeline_param(request)
    cursor = request.query_params.get("before")
    name = "runs_rows.html" if fragment_param(request) else "runs.html"
    page = await queries.runs_page(
        store_of(request),
        status=status,
        pipeline=pipeline,
        before=queries.decode_cursor(cursor),
        now=now_of(request),
    )
    return _render(
        request,
        name,
        page=page,
        status=status,
        pipeline=pipeline or "",
        statuses=LISTED_STATUSES,
        paged=bool(cursor),
        waits=queries.waits_token(r["run_id"] for r in page.rows if queries.wait_over(r)),
    )


@takes("before", TOKEN_PARAMETER)
async def run_page(request: Request) -> HTMLResponse:
    """A run: summary, input, result or error, a window of its timeline, its forks."""
    store = store_of(request)
    details = await queries.run_window(
        store,
        request.path_params["run_id"],
        int_param(request, "before", least=1),
        now_of(request),
        resumer=_runner(request),
    )
    relatives = await queries.family(store, details["run"], now_of(request))
    return _render(
        request,
        "run.html",
        d=details,
        family=relatives,
        window=queries.STEP_WINDOW,
        fork_scan=FORK_SCAN,
        range=queries.range_text(details),
    )


@takes("after")
async def run_live(request: Request) -> JSONResponse:
    """What the run page replaces and appends after a change: its summary and the steps
    after ``?after=``, as HTML."""
    after = int_param(request, "after") or 0
    details = await queries.run_window(
        store_of(request),
        request.path_params["run_id"],
        None,
        now_of(request),
        resumer=_runner(request),
    )
    bars = [[s["seq"], s["bar"]] for s in details["steps"]]
    shown = queries.range_text(details)
    details["steps"] = [s for s in details["steps"] if s["seq"] > after]
    templates = request.app.state.templates
    flags = _flags(request)
    return JSONResponse(
        {
            "summary": templates.get_template("run_summary.html").render(d=details, **flags),
            "rows": templates.get_template("run_steps.html").render(d=details, **flags),
            "high": details["high"],
            "range": shown,
            "bars": bars,
            "status": details["run"]["shown_status"],
        }
    )


@takes(TOKEN_PARAMETER)
async def step_page(request: Request) -> HTMLResponse:
    """One step's data and journaled calls (loaded when its row is opened); a 404 page
    naming the run, the step and the run's steps for an address of no step (out of range,
    negative, not a number)."""
    detail = await queries.step_detail(
        store_of(request), request.path_params["run_id"], request.path_params["seq"]
    )
    return _render(request, "step.html", s=detail)


def _part(state: dict[str, Any], path: str | None) -> Any:
    if not path:
        return state
    try:
        return select(state, path)
    except ValueError as error:
        raise ConfigurationError(f"bad path: {error}") from error
    except PathNotFoundError as error:
        raise CheckpointNotFoundError(str(error)) from error


@takes("path", TOKEN_PARAMETER)
async def state_page(request: Request) -> HTMLResponse:
    """The state a checkpoint restores, as a tree (``?path=`` shows a part of it), and the
    fork form the app's Clutch offers from it."""
    checkpoint_id = request.path_params["checkpoint_id"]
    loaded = await queries.state_of(store_of(request), checkpoint_id, forker=_runner(request))
    state = loaded["state"]
    path = request.query_params.get("path") or ""
    return _render(
        request,
        "state.html",
        state=state,
        part=_part(state, path),
        path=path,
        previous=queries.previous_checkpoint(loaded["checkpoint_ids"], checkpoint_id),
        checkpoint_ids=loaded["checkpoint_ids"],
        next_agent=loaded["next"],
        fork=loaded["fork"],
    )


@takes("old", "new", TOKEN_PARAMETER)
async def diff_page(request: Request) -> HTMLResponse:
    """What changed between checkpoints ``?old=`` and ``?new=``."""
    old = request.query_params.get("old") or ""
    new = request.query_params.get("new") or ""
    if not old or not new:
        raise ConfigurationError("a diff needs two checkpoints: ?old=ID&new=ID")
    result = await queries.diff_of(store_of(request), old, new)
    return _render(request, "diff.html", **result)
