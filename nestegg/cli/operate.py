"""Commands that execute runs with the user's Clutch: resume (from a chosen checkpoint too),
fork and recover."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from nestegg.agents import check_name
from nestegg.checkpoint.admission import check_checkpoint_run
from nestegg.checkpoint.codec import from_given
from nestegg.checkpoint.forks import fork_id_taken
from nestegg.checkpoint.ownership import run_state
from nestegg.checkpoint.records import RunRecord, new_run_id
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.views import to_datetime
from nestegg.cli.app import (
    CommandError,
    JsonOption,
    StoreOption,
    app,
    error_line,
    explicit_store,
    run_async,
    store_url,
)
from nestegg.cli.apps import APP_HELP, bound, import_app, own_store
from nestegg.cli.json_input import parse_json, read_json
from nestegg.cli.reading import get_checkpoint, get_run
from nestegg.cli.render import RUNS, STEPS, Output, counted, to_json
from nestegg.cli.runs import wait_text
from nestegg.clutch import Clutch
from nestegg.constants import (
    CANCELLED,
    CLI_RECOVER_CONCURRENCY,
    EXIT_FAILED,
    EXIT_USAGE,
    EXIT_WAITING,
    QUEUED,
    RUNNING,
    WAITING,
)
from nestegg.errors import (
    EventLogDamagedError,
    IncompatibleCheckpointError,
    ModuleNameMismatchError,
    NestEggError,
    RunExistsError,
    RunLockedError,
    RunWaiting,
)
from nestegg.urls import without_password

AppOption = Annotated[str, typer.Option("--app", "-a", help=APP_HELP, show_default=False)]
PROGRESS_POLL_SECONDS = 0.2
REFUSED = "refused"
"""The outcome of a run ``nestegg recover`` did not resume: the pipeline changed (an agent
it goes on with is gone, or its data no longer fits the agent's model), or its event log
is torn (what it waits for is unknown: ``"event_log": "damaged"``); nothing stored
changed."""


def load_app(ctx: typer.Context, spec: str, store: str | None, out: Output) -> Clutch:
    clutch = import_app(spec)
    if own_store(clutch) is not None and explicit_store(ctx, store):
        out.note(f"note: the Clutch at {spec} names its own store; --store is ignored")
    return clutch


def _failure(run_id: str, error: BaseException) -> BaseException:
    """A NestEggError as it is; anything an agent raised as a failed operation."""
    if isinstance(error, NestEggError):
        return error
    return CommandError(f"run {run_id!r} failed: {error_line(error)}", EXIT_FAILED)


def _journaled_app(spec: str, error: ModuleNameMismatchError) -> str:
    """The --app ``spec`` with its module named as the run's journal names the function's
    module: with the package prefix the journal has, or without the one it has not."""
    module, colon, attribute = spec.partition(":")
    journaled, imported = error.journaled_module, error.imported_module
    if journaled.endswith("." + imported):
        module = journaled[: -len(imported)] + module
    elif module.startswith(prefix := imported[: -len(journaled)]):
        module = module[len(prefix) :]
    return f"{module}{colon}{attribute}"


RESUMED_AND_WAITS = "was resumed and waits again, for"


def waits_error(waiting: RunWaiting, ran: str | None, options: str) -> CommandError:
    """What ``nestegg resume``, ``fork`` and ``signal --app`` say of a run that waits
    (exit 5): for what and until when, what ran before it waits (``ran``:
    ``RESUMED_AND_WAITS``, say; None: nothing ran), and the command that ends the wait
    (``options``: the --app and --store to give it)."""
    run_id = waiting.run_id or ""
    wait = waits_for(waiting)
    what = wait_text(wait)
    head = (
        f"run {run_id!r} {ran} {what}"
        if ran is not None
        else f"run {run_id!r} waits for {what}; nothing was run"
    )
    details = {"run_id": run_id, "status": WAITING, "waits_for": wait}
    return CommandError(f"{head}: {_wait_ender(run_id, wait, options)}", EXIT_WAITING, details)


def waits_for(waiting: RunWaiting) -> dict[str, Any]:
    """What a run waits for, as ``runs --status waiting`` gives it: ``signal`` (None for a
    timer) and ``deadline``."""
    return {"signal": waiting.signal, "deadline": to_datetime(waiting.deadline)}


def _wait_ender(run_id: str, wait: dict[str, Any], options: str) -> str:
    """The command that ends the wait of ``run_id`` (:func:`waits_for`'s ``wait``)."""
    if wait["signal"] is None:
        return (
            f"it goes on once the timer is due: nestegg resume {shlex.quote(run_id)} {options}"
            f" (or nestegg recover {options})"
        )
    how = f"send it with: nestegg signal {shlex.quote(run_id)} {shlex.quote(wait['signal'])}"
    how += f" VALUE {options}"
    if wait["deadline"] is not None:
        how += " (or resume it once the deadline has passed)"
    return how


def _recover_detail(outcome: dict[str, Any], options: str) -> str:
    """The DETAIL cell of a run ``nestegg recover`` resumed."""
    wait = outcome.get("waits_for")
    if wait is None:
        return str(outcome.get("error", ""))
    ender = _wait_ender(outcome["run_id"], wait, options)
    return f"{RESUMED_AND_WAITS} {wait_text(wait)}: {ender}"


def app_options(ctx: typer.Context, spec: str, store: str | None, clutch: Clutch) -> str:
    """The options that reach this run again: --app, and --store when it was given and
    the Clutch names no store of its own (its password left out)."""
    options = f"--app {shlex.quote(spec)}"
    url = store_url(ctx, store)
    if url and explicit_store(ctx, store) and own_store(clutch) is None:
        options += f" --store {shlex.quote(without_password(url))}"
    return options


@contextlib.asynccontextmanager
async def _spinner(
    out: Output, store: CheckpointStorage, run_id: str, doing: str = "resuming"
) -> AsyncIterator[None]:
    """A spinner on stderr (terminals only) counting the run's committed steps."""
    if not out.errors.is_terminal:
        yield
        return
    with out.errors.status(f"{doing} run {run_id}") as status:

        async def watch() -> None:
            while True:
                await asyncio.sleep(PROGRESS_POLL_SECONDS)
                run = await store.get_run(run_id)
                if run is not None:
                    status.update(f"{doing} run {run_id}: {counted(run.step_seq, STEPS)} committed")

        watcher = asyncio.ensure_future(watch())
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher


FromOption = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="Resume from this checkpoint of the run (`nestegg checkpoints RUN_ID` lists them) "
        "instead of its newest: the steps after it are dropped and run again, their "
        "journaled calls too.",
        show_default=False,
    ),
]


HereOption = Annotated[
    bool,
    typer.Option(
        "--here",
        help="Run it in this process even when the app's Clutch has a transport (by "
        "default its workers get it back and this waits for its result).",
    ),
]


async def _resume_from(
    store: CheckpointStorage,
    clutch: Clutch,
    before: RunRecord,
    checkpoint_id: str | None,
    here: bool = False,
) -> tuple[Any, int | None]:
    """Resume the run read as ``before`` from ``checkpoint_id`` (a checkpoint of that run;
    None: its newest valid one, on the workers of a Clutch with a transport unless
    ``here``); the result, and the step the checkpoint covers (None for the newest). A
    cancel that came after the read wins: the run is not reopened."""
    reopen = before.status == CANCELLED
    if checkpoint_id is None:
        result = await clutch.resume_latest(before.run_id, reopen_cancelled=reopen, here=here)
        return result, None
    checkpoint = await get_checkpoint(store, checkpoint_id)
    check_checkpoint_run(checkpoint, before.run_id)
    return await clutch.resume(checkpoint_id, reopen_cancelled=reopen), checkpoint.seq


@app.command("resume")
def resume_command(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run to resume.", show_default=False)],
    app_spec: AppOption,
    from_checkpoint: FromOption = None,
    here: HereOption = False,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Resume one run with the app's Clutch.

    It continues from its newest valid checkpoint; a failed run retries the failed step,
    a completed one just prints its stored result. The run executes in this process,
    with the store of the app's Clutch if it names one, else with the --store one; when
    the app's Clutch has a transport, it is handed back to its workers instead (a failed
    run reopened) and the command waits for its result: --here runs it in this process.

    With --from CHECKPOINT_ID it continues from that checkpoint of the run instead (as
    Clutch.resume does), a completed run too: what came after it is dropped and runs
    again. A checkpoint of another run is refused (fork from it instead: nestegg fork).

    A waiting run whose wait is not over (its signal not stored, its deadline or timer
    not passed) is not run: the command says what it waits for and exits 5.
    """
    out = Output(as_json)
    clutch = load_app(ctx, app_spec, store, out)
    options = app_options(ctx, app_spec, store, clutch)

    async def work() -> dict[str, Any]:
        async with bound(clutch, store_url(ctx, store)) as opened:
            before = await get_run(opened, run_id)
            try:
                async with _spinner(out, opened, run_id):
                    result, from_step = await _resume_from(
                        opened, clutch, before, from_checkpoint, here
                    )
            except RunWaiting as waiting:
                ran = (await get_run(opened, run_id)).fence != before.fence
                raise waits_error(waiting, RESUMED_AND_WAITS if ran else None, options) from waiting
            except ModuleNameMismatchError as error:
                again = app_options(ctx, _journaled_app(app_spec, error), store, clutch)
                raise CommandError(
                    f"{error_line(error)}; run {run_id!r} failed: resume it with: "
                    f"nestegg resume {shlex.quote(run_id)} {again}",
                    EXIT_FAILED,
                ) from error
            except Exception as error:
                raise _failure(run_id, error) from error
            after = await get_run(opened, run_id)
        summary = {
            "run_id": run_id,
            "status": after.status,
            "previous_status": before.status,
            "previous_steps": before.step_seq,
            "steps": after.step_seq,
            "result": result,
        }
        if from_checkpoint is not None:
            summary |= {"from_checkpoint": from_checkpoint, "from_step": from_step}
        return summary

    summary = run_async(work)
    if as_json:
        out.json(summary)
        return
    resumed = (
        f"; resumed from checkpoint {from_checkpoint} at step {summary['from_step']}"
        if from_checkpoint is not None
        else ""
    )
    out.line(
        f"run {run_id} {summary['status']}: {counted(summary['steps'], STEPS)} "
        f"(was {summary['previous_status']} at step {summary['previous_steps']}{resumed})"
    )
    out.line(f"result: {to_json(summary['result'], indent=False)}")


DataOption = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="The data to continue with instead of the checkpoint's, as JSON "
        "('{\"draft\": \"v2\"}'); null keeps the checkpoint's, as Clutch.fork's data=None.",
        show_default=False,
    ),
]
DataFileOption = Annotated[
    str | None,
    typer.Option(
        "--data-file",
        help="As --data, from a JSON file (- for stdin).",
        show_default=False,
    ),
]


def _fork_data(data: str | None, data_file: str | None) -> Any:
    """The data --data or --data-file gives (None: neither; the checkpoint's is kept).

    Raises:
        CommandError: (bad usage) both are given, the text or file is not JSON, or the
            file cannot be read.
        ConfigurationError: it holds a tagged value (``{"$ne": ...}``) the codec does not
            write; the others are rebuilt as the codec rebuilds them (``{"$ne": "map", "v":
            [[1, "a"]]}`` is ``{1: "a"}``, as ``nestegg show`` writes it).
    """
    if data is not None and data_file is not None:
        raise CommandError("give --data or --data-file, not both", EXIT_USAGE)
    if data is not None:
        return from_given(parse_json(data, "--data"), "--data")
    if data_file is not None:
        return from_given(read_json(data_file, "--data-file"), f"--data-file {data_file}")
    return None


ForkRunIdOption = Annotated[
    str | None,
    typer.Option(
        "--run-id",
        help="The new run's id (default: a new one), as Clutch.fork's run_id=; an id a run "
        "already has is refused and nothing is stored.",
        show_default=False,
    ),
]


@app.command("fork")
def fork_command(
    ctx: typer.Context,
    checkpoint_id: Annotated[
        str,
        typer.Argument(
            help="The checkpoint to fork from (`nestegg checkpoints RUN_ID` lists a run's).",
            show_default=False,
        ),
    ],
    app_spec: AppOption,
    data: DataOption = None,
    data_file: DataFileOption = None,
    run_id: ForkRunIdOption = None,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Fork a new run from a checkpoint with the app's Clutch; the original run is unchanged.

    As Clutch.fork does: the new run copies the steps up to the checkpoint and goes on from
    there, with the checkpoint's data or the data --data or --data-file gives instead. It
    executes in this process (with the store of the app's Clutch if it names one, else with
    the --store one); its id (--run-id, else a new one) and result are printed.

    A fork that cannot start (an unknown checkpoint, a checkpoint of another pipeline's run,
    one that continues with an agent the Clutch no longer has, a --run-id a run has already)
    stores nothing. A fork that fails in a step stays, failed: nestegg resume NEW_RUN_ID
    --app ... retries it.
    """
    out = Output(as_json)
    replaced = _fork_data(data, data_file)
    new_id = check_name(run_id, "run id") if run_id is not None else new_run_id()
    clutch = load_app(ctx, app_spec, store, out)
    options = app_options(ctx, app_spec, store, clutch)

    async def work() -> dict[str, Any]:
        async with bound(clutch, store_url(ctx, store)) as opened:
            checkpoint = await get_checkpoint(opened, checkpoint_id)
            try:
                async with _spinner(out, opened, new_id, "forking"):
                    result = await clutch.fork(checkpoint_id, replaced, run_id=new_id)
            except RunWaiting as waiting:
                forked = f"was forked from checkpoint {checkpoint_id!r} and waits for"
                raise waits_error(waiting, forked, options) from waiting
            except RunExistsError as taken:
                if run_id is None or taken.run_id != new_id:
                    raise
                raise fork_id_taken(new_id, "--run-id") from None
            except Exception as error:
                raise _failure(new_id, error) from error
            after = await get_run(opened, new_id)
        return {
            "run_id": new_id,
            "status": after.status,
            "parent_run": checkpoint.run_id,
            "parent_checkpoint": checkpoint_id,
            "from_step": checkpoint.seq,
            "steps": after.step_seq,
            "result": result,
        }

    summary = run_async(work)
    if as_json:
        out.json(summary)
        return
    out.line(
        f"run {new_id} {summary['status']}: {counted(summary['steps'], STEPS)} (forked from "
        f"run {summary['parent_run']} at checkpoint {checkpoint_id}, step {summary['from_step']})"
    )
    out.line(f"result: {to_json(summary['result'], indent=False)}")


async def _resume_each(
    clutch: Clutch, run_ids: list[str], concurrency: int, advance: Callable[[], None]
) -> list[dict[str, Any]]:
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
            advance()
            return outcome

    return list(await asyncio.gather(*(one(run_id) for run_id in run_ids)))


async def _with_bar(
    out: Output, total: int, work: Callable[[Callable[[], None]], Awaitable[list[Any]]]
) -> list[Any]:
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
    runs = await store.list_runs(pipeline=pipeline, statuses=[RUNNING])
    now = time.time()  # a command judges leases by the wall clock
    return [run.run_id for run in runs if run_state(run, now) == QUEUED]
