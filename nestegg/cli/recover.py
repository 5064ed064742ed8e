"""nestegg recover: resume every interrupted run of a Clutch's pipeline, and its waiting
runs that are due, N at a time, with a progress bar and a summary."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import (
    JsonOption,
    StoreOption,
    app,
    error_line,
    run_async,
    store_url,
)
from nestegg.cli.apps import bound
from nestegg.cli.operate import (
    RESUMED_AND_WAITS,
    AppOption,
    _wait_ender,
    app_options,
    load_app,
    waits_for,
)
from nestegg.cli.replayed import replayed_failure
from nestegg.constants import (
    CLI_RECOVER_CONCURRENCY,
    EXIT_FAILED,
    QUEUED,
    RUNNING,
)
from nestegg.errors import (
    EventLogDamagedError,
    IncompatibleCheckpointError,
    JournaledCallError,
    RunLockedError,
    RunWaiting,
)
from nestegg.wording import RUNS, counted

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.cli.render import Output
    from nestegg.clutch import Clutch

REFUSED = "refused"
"""The outcome of a run ``nestegg recover`` did not resume: the pipeline changed (an agent
it goes on with is gone, or its data no longer fits the agent's model), or its event log
is torn (what it waits for is unknown: ``"event_log": "damaged"``); nothing stored
changed."""


def _recover_detail(outcome: dict[str, Any], options: str) -> str:
    """The DETAIL cell of a run ``nestegg recover`` resumed."""
    wait = outcome.get("waits_for")
    if "replayed" in outcome:
        return replayed_failure(outcome["run_id"], outcome["error"], options)
    if wait is None:
        return str(outcome.get("error", ""))
    from nestegg.cli.wait_words import wait_text

    ender = _wait_ender(outcome["run_id"], wait, options)
    return f"{RESUMED_AND_WAITS} {wait_text(wait)}: {ender}"


async def _resume_each(
    clutch: Clutch, run_ids: list[str], concurrency: int, advance: Callable[[], None]
) -> list[dict[str, Any]]:
    import asyncio

    limit = asyncio.Semaphore(concurrency)

    async def one(run_id: str) -> dict[str, Any]:
        async with limit:
            try:
                result = await clutch.resume_latest(run_id, reopen_cancelled=False, here=True)
                outcome = {"run_id": run_id, "outcome": "completed", "result": result}
            except RunLockedError:
                outcome = {"run_id": run_id, "outcome": "skipped", "error": "taken by another"}
            except RunWaiting as waiting:
                outcome = {"run_id": run_id, "outcome": "waiting", "error": str(waiting)}
                outcome["waits_for"] = waits_for(waiting)
            except IncompatibleCheckpointError as refused:  # before anything was stored
                outcome = {"run_id": run_id, "outcome": REFUSED, "error": error_line(refused)}
            except EventLogDamagedError as refused:  # before anything was stored
                outcome = {"run_id": run_id, "outcome": REFUSED, "error": error_line(refused)}
                outcome["event_log"] = "damaged"
            except Exception as error:
                outcome = {"run_id": run_id, "outcome": "failed", "error": error_line(error)}
                if isinstance(error, JournaledCallError):  # replayed: the next resume calls
                    outcome["replayed"] = error.function
            advance()
            return outcome

    return list(await asyncio.gather(*(one(run_id) for run_id in run_ids)))


async def _with_bar(
    out: Output, total: int, work: Callable[[Callable[[], None]], Awaitable[list[Any]]]
) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(
        TextColumn("recovering"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=out.errors,
        transient=True,
        disable=not out.errors.is_terminal,
    )
    with progress:
        task = progress.add_task("runs", total=total)
        return await work(lambda: progress.advance(task))


@app.command("recover")
def recover_command(
    ctx: typer.Context,
    app_spec: AppOption,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Runs resumed at the same time.")
    ] = CLI_RECOVER_CONCURRENCY,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Resume every interrupted run of the app's pipeline, and its waiting runs that are due.

    Interrupted: marked running, but the process that ran it is gone. Due: a waiting run
    whose deadline or timer has passed, or whose signal is stored (`nestegg signal`
    without --app); one that waits again is reported as waiting. A run stored for workers
    that none took yet (queued) is left to them: a worker's sweep publishes it (nestegg
    resume RUN --here --app ... runs it here on purpose). A run whose resume is refused because
    the pipeline changed (an agent it goes on with is gone, or its data no longer fits the
    agent's model), or a waiting run whose event log is damaged (what it waits for is
    unknown), is reported as refused: nothing stored of it changes.

    Exits 1 if any of them failed again or was refused.
    """
    from nestegg.cli.render import Output

    out = Output(as_json)
    clutch = load_app(ctx, app_spec, store, out)

    async def work() -> tuple[list[dict[str, Any]], list[str]]:
        async with bound(clutch, store_url(ctx, store)) as opened:
            run_ids = [info.run_id for info in await clutch.list_resumable()]
            queued = await _queued(opened, clutch.name)
            if not run_ids:
                return [], queued
            outcomes = await _with_bar(
                out,
                len(run_ids),
                lambda advance: _resume_each(clutch, run_ids, concurrency, advance),
            )
            return outcomes, queued

    outcomes, queued = run_async(work)
    kinds = ("completed", "failed", REFUSED, "skipped", "waiting")
    counts = {k: sum(o["outcome"] == k for o in outcomes) for k in kinds}
    left = [f"{counted(len(queued), RUNS)} queued for workers left to them"] if queued else []
    if as_json:
        summary = {"pipeline": clutch.name, "runs": outcomes, **counts}
        out.json({**summary, "queued": len(queued), "queued_runs": queued})
    elif not outcomes:
        out.line("; ".join([f"no interrupted runs of pipeline {clutch.name!r}", *left]))
    else:
        options = app_options(ctx, app_spec, store, clutch)
        rows = [[o["run_id"], o["outcome"], _recover_detail(o, options)] for o in outcomes]
        columns = ("RUN", "OUTCOME", "DETAIL")
        out.table(columns, rows, status_column=1, whole=(0, 1), sentences=(2,))
        parts = [f"{counts['failed']} failed", f"{counts['skipped']} taken by another process"]
        parts.extend(_refusals(outcomes))
        if counts["waiting"]:
            parts.append(f"{counts['waiting']} waiting again")
        out.line(
            f"recovered {counts['completed']} of {counted(len(outcomes), RUNS)}; "
            + ", ".join([*parts, *left])
        )
    if counts["failed"] or counts[REFUSED]:
        raise typer.Exit(EXIT_FAILED)


def _refusals(outcomes: list[dict[str, Any]]) -> list[str]:
    """How many runs ``nestegg recover`` refused, by why, for its summary."""
    refused = [o for o in outcomes if o["outcome"] == REFUSED]
    damaged = sum("event_log" in o for o in refused)
    changed = len(refused) - damaged
    parts = [f"{changed} refused as the pipeline changed"] if changed else []
    if damaged:
        whose = "its" if damaged == 1 else "their"
        parts.append(f"{damaged} refused as {whose} event log is damaged")
    return parts


async def _queued(store: CheckpointStorage, pipeline: str) -> list[str]:
    """The runs of ``pipeline`` stored for workers that none took yet (shown ``queued``),
    which ``nestegg recover`` leaves to them, newest first."""
    from nestegg.checkpoint.ownership import run_state

    runs = await store.list_runs(pipeline=pipeline, statuses=[RUNNING])
    now = time.time()  # a command judges leases by the wall clock
    return [run.run_id for run in runs if run_state(run, now) == QUEUED]
