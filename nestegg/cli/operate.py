"""Commands that execute runs with the user's Clutch: resume (from a chosen checkpoint too)
and fork; recover is recover.py's."""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import (
    CommandError,
    JsonOption,
    StoreOption,
    app,
    error_line,
    explicit_store,
    id_argument,
    run_async,
    store_url,
)
from nestegg.cli.apps import APP_HELP, bound, import_app, own_store
from nestegg.cli.replayed import replayed_failure_error
from nestegg.constants import (
    CANCELLED,
    COMPLETED,
    EXIT_FAILED,
    EXIT_USAGE,
    EXIT_WAITING,
    WAITING,
)
from nestegg.errors import (
    ConfigurationError,
    JournaledCallError,
    ModuleNameMismatchError,
    NestEggError,
    RunExistsError,
    RunWaiting,
)
from nestegg.identifiers import check_name
from nestegg.urls import without_password
from nestegg.wording import STEPS, counted

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.cli.render import Output
    from nestegg.clutch import Clutch

AppOption = Annotated[str, typer.Option("--app", "-a", help=APP_HELP, show_default=False)]
PROGRESS_POLL_SECONDS = 0.2


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
    from nestegg.cli.wait_words import wait_text

    run_id = waiting.run_id or ""
    wait = waits_for(waiting)
    what = wait_text(wait)
    head = (
        f"run {run_id!r} {ran} {what}"
        if ran is not None
        else f"run {run_id!r} waits for {what}; nothing was run"
    )
    details = {"run_id": run_id, "status": WAITING, "waits_for": wait}
    ender = _wait_ender(run_id, wait, options, on_workers=waiting.on_workers)
    return CommandError(f"{head}: {ender}", EXIT_WAITING, details)


def waits_for(waiting: RunWaiting) -> dict[str, Any]:
    """What a run waits for, as ``runs --status waiting`` gives it: ``signal`` (None for a
    timer) and ``deadline``, or ``unreadable`` and ``deadline`` when what it waits for
    cannot be read; ``received`` and ``due`` false, the run waiting (again)."""
    from nestegg.checkpoint.views import to_datetime

    deadline = to_datetime(waiting.deadline)
    if waiting.unreadable is not None:
        return {"unreadable": waiting.unreadable, "deadline": deadline, "due": False}
    return {"signal": waiting.signal, "deadline": deadline, "received": False, "due": False}


def _wait_ender(
    run_id: str, wait: dict[str, Any], options: str, *, on_workers: bool = False
) -> str:
    """The command that ends the wait of ``run_id`` (:func:`waits_for`'s ``wait``); for a
    run on workers (``on_workers``) whose wait ends with time, that a sweep resumes it."""
    from nestegg.cli.wait_words import unreadable_text

    if wait.get("signal") is None:
        unreadable = unreadable_text(wait)
        due = "the timer is due" if unreadable is None else "its deadline passes"
        how = (
            "a worker's sweep resumes it then"
            if on_workers
            else f"nestegg resume {shlex.quote(run_id)} {options} (or nestegg recover {options})"
        )
        return f"{'' if unreadable is None else f'{unreadable}; '}it goes on once {due}: {how}"
    how = f"send it with: nestegg signal {shlex.quote(run_id)} {shlex.quote(wait['signal'])}"
    how += f" VALUE {options}"
    if wait["deadline"] is not None:
        how += " (or resume it once the deadline has passed)"
    return how


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
    import asyncio

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


@contextlib.asynccontextmanager
async def told_when_handed_back(
    out: Output, clutch: Clutch, run_id: str, *, here: bool = True
) -> AsyncIterator[None]:
    """With a Clutch with a transport: one line on stderr once the run is handed back to
    its workers, since the command then waits for a worker to run it, for as long as none
    runs (``here``: the command has --here, which runs it in this process instead)."""
    if clutch.transport is None:
        yield
        return
    import asyncio

    from nestegg.transport.handback import HANDED_BACK

    handed_back = asyncio.Event()
    token = HANDED_BACK.set(handed_back)

    async def tell() -> None:
        await handed_back.wait()
        instead = "; --here runs it in this process instead" if here else ""
        out.note(
            f"run {run_id} was handed back to the workers of pipeline {clutch.name!r}: waiting "
            f"for its result (a worker runs it: nestegg worker with this --app{instead})"
        )

    teller = asyncio.ensure_future(tell())
    try:
        yield
    finally:
        HANDED_BACK.reset(token)
        if not handed_back.is_set():
            teller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await teller


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
    from nestegg.checkpoint.admission import check_checkpoint_run
    from nestegg.cli.reading import get_checkpoint

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
    run_id: Annotated[
        str,
        id_argument("The run to resume."),
    ],
    app_spec: AppOption,
    from_checkpoint: FromOption = None,
    here: HereOption = False,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Resume one run with the app's Clutch.

    It continues from its newest valid checkpoint; a failed run retries the failed step;
    a completed one is not run again: it says so and prints its stored result. The run
    executes in this process, with the store of the app's Clutch if it names one, else
    with the --store one; when
    the app's Clutch has a transport, it is handed back to its workers instead (a failed
    run reopened) and the command waits for its result: --here runs it in this process.

    With --from CHECKPOINT_ID it continues from that checkpoint of the run instead (as
    Clutch.resume does), a completed run too: what came after it is dropped and runs
    again. A checkpoint of another run is refused (fork from it instead: nestegg fork).

    A waiting run whose wait is not over (its signal not stored, its deadline or timer
    not passed) is not run: the command says what it waits for and exits 5.

    The failed step of a failed run replays its journaled calls up to the first that
    failed for good, and makes that call and those after it again. An interrupted run
    replays such failures; one that fails on a replayed failure exits 1 saying that
    resuming it again makes the call again.
    """
    from nestegg.checkpoint.ownership import run_state
    from nestegg.cli.reading import get_run
    from nestegg.cli.render import Output, to_json

    out = Output(as_json)
    clutch = load_app(ctx, app_spec, store, out)
    options = app_options(ctx, app_spec, store, clutch)

    async def work() -> dict[str, Any]:
        async with bound(clutch, store_url(ctx, store)) as opened:
            before = await get_run(opened, run_id)
            try:
                async with (
                    _spinner(out, opened, run_id),
                    told_when_handed_back(out, clutch, run_id),
                ):
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
            except JournaledCallError as error:
                raise replayed_failure_error(run_id, error, options) from error
            except Exception as error:
                raise _failure(run_id, error) from error
            after = await get_run(opened, run_id)
        summary = {
            "run_id": run_id,
            "status": after.status,
            "previous_status": run_state(before, time.time()),  # as show says it
            "previous_steps": before.step_seq,
            "steps": after.step_seq,
            # a completed run's resume returns its stored result and runs nothing
            "resumed": before.status != COMPLETED or from_checkpoint is not None,
            "result": result,
        }
        if from_checkpoint is not None:
            summary |= {"from_checkpoint": from_checkpoint, "from_step": from_step}
        return summary

    summary = run_async(work)
    if as_json:
        out.json(summary)
        return
    out.line(_resumed_line(summary, from_checkpoint))
    out.line(f"result: {to_json(summary['result'], indent=False)}")


def _resumed_line(summary: dict[str, Any], from_checkpoint: str | None) -> str:
    """What ``nestegg resume`` says of the run its ``summary`` tells: what it is now and
    was, or that it was completed already and nothing ran."""
    run_id, steps = summary["run_id"], counted(summary["steps"], STEPS)
    if not summary["resumed"]:
        return f"run {run_id} was completed already ({steps}): nothing to resume"
    resumed = (
        f"; resumed from checkpoint {from_checkpoint} at step {summary['from_step']}"
        if from_checkpoint is not None
        else ""
    )
    return (
        f"run {run_id} {summary['status']}: {steps} "
        f"(was {summary['previous_status']} at step {summary['previous_steps']}{resumed})"
    )


DataOption = Annotated[
    str | None,
    typer.Option(
        "--data",
        help="The data to continue with instead of the checkpoint's, as JSON "
        '(\'{"draft": "v2"}\'), a value JSON has no type for tagged as `nestegg inspect '
        "--stored` prints it; null keeps the checkpoint's, as Clutch.fork's data=None.",
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


STORED_FORM = "nestegg inspect CHECKPOINT --path data --stored"
"""The command that prints a checkpoint's data as ``fork --data`` reads it back exactly."""
_NON_FINITE_ADVICE = (
    'give one as {"$ne":"float","v":"NaN"} ("Infinity", "-Infinity"); '
    f"{STORED_FORM} prints the data in the form fork reads back exactly"
)


def _fork_data(data: str | None, data_file: str | None) -> tuple[Any, str]:
    """The JSON --data or --data-file gives and what names it (None: neither; the
    checkpoint's is kept), for :func:`given_data` to rebuild once the app is imported (an
    enum of its module is rebuilt then).

    Raises:
        CommandError: (bad usage) both are given, the text or file is not JSON (a bare
            NaN, as inspect prints it, says how to give it), or the file cannot be read.
        ConfigurationError: it holds a value ``nestegg inspect`` cut (without --full),
            which the fork would run with, cut, or an object with a key twice.
    """
    from nestegg.checkpoint.given import refuse_key_twice
    from nestegg.cli.json_input import parse_json, read_json_text, source_name
    from nestegg.cli.render import cut_at

    if data is not None and data_file is not None:
        raise CommandError("give --data or --data-file, not both", EXIT_USAGE)
    if data is not None:
        raw: str | bytes = data
        given, what = parse_json(data, "--data", _NON_FINITE_ADVICE), "--data"
    elif data_file is not None:
        what = source_name(data_file, "--data-file")
        given, raw = read_json_text(data_file, "--data-file", _NON_FINITE_ADVICE)
    else:
        return None, ""
    refuse_key_twice(raw, what)  # orjson kept the last value
    try:
        at = cut_at(given)
    except RecursionError:  # too deep to be stored: given_data refuses it, as the inspector's
        at = None
    if at is not None:
        raise ConfigurationError(
            f"{what} holds at {at} a value nestegg inspect cut (it cuts long strings, lists "
            "and dicts unless --full, saying how much it left out): the fork would run with "
            f"it cut; give the data whole, as {STORED_FORM} prints it"
        )
    return given, what


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
        id_argument(
            "The checkpoint to fork from (`nestegg checkpoints RUN_ID` lists a run's).",
            "checkpoint id",
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
    there, with the checkpoint's data or the data --data or --data-file gives instead (as
    JSON, a value JSON has no type for tagged: nestegg inspect CHECKPOINT --path data
    --stored prints the checkpoint's so, which an unedited fork continues with exactly;
    a value inspect printed cut is refused). It
    executes in this process (with the store of the app's Clutch if it names one, else with
    the --store one); its id (--run-id, else a new one) and result are printed.

    A fork that cannot start (an unknown checkpoint, a checkpoint of another pipeline's run,
    one that continues with an agent the Clutch no longer has, data that does not fit the
    model of the agent it goes to, a --run-id a run has already) stores nothing. A fork
    that fails in a step stays, failed: nestegg resume NEW_RUN_ID --app ... retries it.
    """
    from nestegg.checkpoint.forks import fork_id_taken
    from nestegg.checkpoint.given import given_data
    from nestegg.checkpoint.records import new_run_id
    from nestegg.cli.reading import get_checkpoint, get_run
    from nestegg.cli.render import Output, to_json

    out = Output(as_json)
    given = _fork_data(data, data_file)
    new_id = check_name(run_id, "run id") if run_id is not None else new_run_id()
    clutch = load_app(ctx, app_spec, store, out)
    # rebuilt as the codec rebuilds what it stores ({"$ne": "map", "v": [[1, "a"]]} is
    # {1: "a"}, as nestegg show writes it); a tag the codec does not write is refused
    replaced = given_data(*given)  # encoded once: the fork stores the JSON checked
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
