"""Writes from the page: resume, fork, cancel, delete and prune.

Each needs the application started with ``allow_writes`` and the start-up token in the
``X-Nestegg-Token`` header: a page from another origin cannot send that header without a
CORS preflight this application never answers, and cannot read the token. Resume and fork
run the user's Clutch (``--app``) in this process, in the background; cancel needs the
store alone, as ``nestegg cancel`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse

from nestegg.cancellation import cancel
from nestegg.checkpoint.admission import check_not_owned, executed_by, fork_start, resume_refusal
from nestegg.checkpoint.given import given_data, refuse_key_twice
from nestegg.checkpoint.ownership import current_owner, owner_alive
from nestegg.checkpoint.records import new_run_id
from nestegg.checkpoint.stores.common import check_status
from nestegg.cli.app import CommandError
from nestegg.cli.cancel import cancel_line, cancel_stored
from nestegg.cli.housekeeping import apply_prune, parse_duration, plan_prune
from nestegg.cli.reading import get_run
from nestegg.clutch import Clutch
from nestegg.constants import CANCELLED, FINISHED
from nestegg.errors import ConfigurationError, RunLockedError, RunWaiting
from nestegg.options import is_count, shown
from nestegg.transport.handback import HANDED_BACK
from nestegg.ui.pages import now_of, store_of, takes
from nestegg.ui.queries import checkpoint_run

log = logging.getLogger("nestegg.ui")

TOKEN_HEADER = "X-Nestegg-Token"
FORK_FIELDS = {"data"}
"""What a fork request's JSON body may hold."""
PRUNE_FIELDS = ("keep", "older_than", "status", "pipeline", "dry_run")
"""What a prune request's JSON body may hold."""
NO_FIELD = "no field (send no body, or {})"
"""What a resume, cancel or delete request's JSON body may hold, as its refusal says."""
START_SECONDS = 5.0
"""How long a resume waits for the run to be claimed, and a fork for the new run to be
stored (or for either to fail)."""
Handler = Callable[[Request], Awaitable[JSONResponse]]


def _refused(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=403)


def _check(request: Request, needs_app: bool = False) -> JSONResponse | None:
    settings = request.app.state.settings
    if not settings.allow_writes:
        return _refused("writes are disabled: start nestegg ui with --allow-writes")
    given = request.headers.get(TOKEN_HEADER, "")
    if not settings.token or not secrets.compare_digest(given, settings.token):
        return _refused(f"missing or wrong {TOKEN_HEADER} header (printed at start-up)")
    if needs_app and settings.clutch is None:
        return _refused("resume and fork need your Clutch: start nestegg ui with --app")
    return None


async def _body(request: Request, what: str, fields: Collection[str], takes: str) -> dict[str, Any]:
    """The JSON object the ``what`` request carries (none: ``{}``); ConfigurationError for
    a body that is not one (not UTF-8 either: the byte that is not, named), holds a field
    not in ``fields`` (``takes`` says what it takes) or a field twice, or whose ``data``
    has an object with a key twice, before anything is read or started."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        raw.decode()  # orjson would say "surrogates not allowed" of any byte not UTF-8
    except UnicodeDecodeError as error:
        raise ConfigurationError(
            f"the request body is not UTF-8 JSON: byte {error.start} "
            f"({raw[error.start]:#04x}) is not UTF-8"
        ) from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise ConfigurationError(f"the request body is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise ConfigurationError(
            f"the request body must be a JSON object, got {_json_kind(body)}: {_cut(raw)}"
        )
    if unknown := sorted(set(body) - set(fields)):
        raise ConfigurationError(
            f"unknown field {', '.join(map(_shown, unknown))} in the {what} request: it takes "
            + takes
        )
    # A field given twice (orjson kept its last value), or a key twice in a fork's data.
    refuse_key_twice(raw, f"the {what}'s data", field="data")
    return body


JSON_KINDS = ((list, "a JSON array"), (str, "a JSON string"), (bool, "true or false"))
SHOWN_BODY_CHARS = 60
"""How much of a refused request body its error shows."""


def _json_kind(value: Any) -> str:
    """What JSON value ``value`` was (``a JSON array``, ``a number``, ``null``)."""
    if value is None:
        return "null"
    kind = next((name for python, name in JSON_KINDS if isinstance(value, python)), None)
    return kind or "a number"


def _cut(raw: bytes) -> str:
    """The start of a request body, as its refusal shows it."""
    text = raw.decode(errors="replace").strip()
    return text if len(text) <= SHOWN_BODY_CHARS else text[:SHOWN_BODY_CHARS] + "..."


def _shown(value: Any) -> str:
    """A value of a request's JSON body as JSON writes it (``true``, ``null``, ``"text"``),
    for its error messages: the body was JSON, not Python."""
    return orjson.dumps(value).decode()


def _start(request: Request, work: Awaitable[Any], what: str) -> asyncio.Task[Any]:
    background: set[asyncio.Task[Any]] = request.app.state.background

    async def guarded() -> Any:
        try:
            return await work
        except RunWaiting as waiting:  # stored waiting, as nestegg resume says it (exit 5)
            log.info("%s: %s", what, waiting)
            raise
        except Exception as error:
            log.warning("%s failed: %s", what, error)
            raise

    task = asyncio.ensure_future(guarded())
    background.add(task)
    task.add_done_callback(background.discard)
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning
    return task


async def _until_started(task: asyncio.Task[Any], started: Callable[[], Awaitable[bool]]) -> None:
    """Wait until ``started()`` says the work is stored, or it ended, or START_SECONDS
    passed. Raises what the work raised if it ended without being stored (it could not
    start)."""
    deadline = time.monotonic() + START_SECONDS
    while not task.done() and time.monotonic() < deadline:
        if await started():
            return
        await asyncio.sleep(0.02)
    if await started() or not task.done() or task.cancelled():
        return
    if (error := task.exception()) is not None:
        raise error


async def stop_background(app: Starlette) -> None:
    """Cancel the runs this application started and wait for them (at shutdown)."""
    tasks = list(app.state.background)
    for task in tasks:
        cancel(task)
    for task in tasks:
        with contextlib.suppress(BaseException):
            await task


@takes()
async def resume(request: Request) -> JSONResponse:
    """Resume a run with the Clutch, in the background, after the checks of
    :func:`~nestegg.checkpoint.admission.resume_refusal`, which are all that
    ``Clutch.resume_latest`` makes before it claims the run (a refusal is 400 or 409, 500
    for a run with no valid state); 202 once this resume claimed the run (so that its
    page, which follows it from then on, sees it running), or, with a transport, handed
    it back to the workers (a worker may take it, and fail it again, at once), the error
    if it could not start: 409 as ``nestegg resume`` says it for a run another request
    of this application resumes, or another process claimed first; the run's own errors
    show on its page. It takes no body, or ``{}``: a body that is not
    JSON or holds a field is refused (400), as the fork's and prune's are."""
    if (refusal := _check(request, needs_app=True)) is not None:
        return refusal
    await _body(request, "resume", (), NO_FIELD)
    store = store_of(request)
    run = await get_run(store, request.path_params["run_id"])
    clutch: Clutch = request.app.state.settings.clutch
    refused = await resume_refusal(store, clutch, run, now_of(request))
    if refused is not None:
        raise refused
    resuming: set[str] = request.app.state.resuming
    if run.run_id in resuming:  # another request resumes it in this process: it may not
        raise executed_by(run.run_id, os.getpid())  # have claimed it yet
    resuming.add(run.run_id)
    reopen = run.status == CANCELLED  # a cancel after this read wins
    resuming_it = clutch.resume_latest(run.run_id, reopen_cancelled=reopen)
    handed_back = asyncio.Event()  # with a transport: the run went to the workers
    token = HANDED_BACK.set(handed_back)
    try:
        task = _start(request, resuming_it, f"resume of run {run.run_id!r}")
    finally:
        HANDED_BACK.reset(token)
    task.add_done_callback(lambda _: resuming.discard(run.run_id))

    async def claimed() -> bool:  # by this process: another one's claim is a refusal
        if handed_back.is_set():  # a worker may hold it already, or have failed it again
            return True
        current = await store.get_run(run.run_id)
        return current is None or (current.fence > run.fence and current.owner == current_owner())

    try:
        await _until_started(task, claimed)
    except RunLockedError:  # another process claimed it first: say so as nestegg resume does
        check_not_owned(await get_run(store, run.run_id), now_of(request))
        raise
    return JSONResponse({"run_id": run.run_id, "started": True}, status_code=202)


@takes()
async def fork(request: Request) -> JSONResponse:
    """Fork from a checkpoint with ``{"data": ...}`` (absent: the checkpoint's data) on a
    new run, after the checks of :func:`~nestegg.checkpoint.admission.fork_start`, which
    are all that ``Clutch.fork`` makes before it stores the run (a refusal is 400 or 409;
    another pipeline's checkpoint is refused before its state is read); 201 with its id
    once it is stored, the error if it could not start. The data's tagged values (the
    codec's form, which the editor shows) are rebuilt as the codec rebuilds them; a tag it
    does not write, or an object with a key twice, is refused (400)."""
    if (refusal := _check(request, needs_app=True)) is not None:
        return refusal
    body = await _body(
        request, "fork", FORK_FIELDS, '{"data": ...} (absent: the checkpoint\'s data)'
    )
    data = given_data(body.get("data"), "the fork's data")  # encoded once, stored so
    checkpoint_id = request.path_params["checkpoint_id"]
    clutch: Clutch = request.app.state.settings.clutch
    store = store_of(request)
    parent, record = await checkpoint_run(store, checkpoint_id)
    await fork_start(store, clutch, parent, record, data)  # the pipeline before the state
    run_id = new_run_id()
    task = _start(
        request,
        clutch.fork(checkpoint_id, data, run_id=run_id),
        f"fork of checkpoint {checkpoint_id!r}",
    )

    async def stored() -> bool:
        return await store.get_run(run_id) is not None

    await _until_started(task, stored)  # stored: it started; a step that fails shows there
    return JSONResponse({"run_id": run_id}, status_code=201)


@takes()
async def cancel_run(request: Request) -> JSONResponse:
    """Cancel a running or waiting run (queued or interrupted too) as ``nestegg cancel``
    does (:func:`~nestegg.cli.cancel.cancel_stored`): 200 with what its ``--json`` prints
    and the line it prints (``message``); ``cancelled`` is false for a run cancelled
    already, which is left as it is. A completed or failed run is refused (409), an
    unknown one is 404, a body as a resume's refuses (400); nothing changes then."""
    if (refusal := _check(request)) is not None:
        return refusal
    await _body(request, "cancel", (), NO_FIELD)
    summary = await cancel_stored(store_of(request), request.path_params["run_id"], now_of(request))
    return JSONResponse({**summary, "message": cancel_line(summary)})


@takes()
async def delete(request: Request) -> JSONResponse:
    """Delete a run and everything of it, unless a live process executes it (409); it
    takes no body, or ``{}``, as a resume: another is refused (400), nothing deleted."""
    if (refusal := _check(request)) is not None:
        return refusal
    await _body(request, "delete", (), NO_FIELD)
    store = store_of(request)
    run = await get_run(store, request.path_params["run_id"])
    if owner_alive(run, now_of(request)):
        raise RunLockedError(f"run {run.run_id!r} is executing; not deleted", run.run_id)
    await store.delete_run(run.run_id)
    return JSONResponse({"deleted": run.run_id})


def _prune_options(body: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(body.get("dry_run", False), bool):
        raise ConfigurationError(f"dry_run must be true or false, got {_shown(body['dry_run'])}")
    for name in ("older_than", "status", "pipeline"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise ConfigurationError(f"{name} must be a string, got {_shown(body[name])}")
    keep, older, status = body.get("keep"), body.get("older_than"), body.get("status")
    if keep is not None and not is_count(keep):
        raise ConfigurationError(f"keep must be a whole number >= 1, got {shown(keep, _shown)}")
    if status is not None:  # named before the rest, as nestegg prune names it
        check_status(status, shown=_shown)
    if keep is None and not older:
        raise ConfigurationError("prune needs keep and/or older_than")
    try:
        age = parse_duration(str(older), _shown) if older else None
    except CommandError as error:
        raise ConfigurationError(str(error)) from error
    statuses = [status] if status else list(FINISHED)
    return {"keep": keep, "older_than": age, "statuses": statuses,
            "pipeline": body.get("pipeline")}  # fmt: skip


@takes()
async def prune(request: Request) -> JSONResponse:
    """Delete old runs (``older_than``) and surplus checkpoints (``keep``), as ``nestegg
    prune`` does; ``dry_run`` only lists them; a ``pipeline`` that names no stored run
    adds the ``note`` the command prints. A body with another field, or a field of the
    wrong type, is refused (400) before anything is deleted: a misspelt ``dry_run`` must
    not prune; a ``status`` that is not one is named first, as the command names it."""
    if (refusal := _check(request)) is not None:
        return refusal
    body = await _body(request, "prune", PRUNE_FIELDS, ", ".join(PRUNE_FIELDS))
    store = store_of(request)
    plan = await plan_prune(store, **_prune_options(body))
    if body.get("dry_run"):
        return JSONResponse({"dry_run": True, **plan.to_json()})
    runs, checkpoints = await apply_prune(store, plan)
    deleted = {"deleted_runs": runs, "deleted_checkpoints": checkpoints}
    return JSONResponse({**plan.to_json(), **deleted})
