"""Commands for LangGraph threads kept by NestEggSaver: threads, thread, threads prune."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from nestegg.cli.app import (
    CommandError,
    JsonOption,
    StoreOption,
    app,
    open_selected,
    run_with_store,
    store_url,
)
from nestegg.cli.housekeeping import DryRunOption, YesOption, confirm_or_stop, parse_duration
from nestegg.constants import EXIT_NOT_FOUND, EXIT_USAGE
from nestegg.errors import InvalidIdentifierError, MissingDependencyError
from nestegg.wording import CHECKPOINTS, LANGGRAPH_THREADS, ROWS, THREADS, counted

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.checkpoint.stores.threads import ThreadStore

threads_app = typer.Typer(
    help="LangGraph threads kept by NestEggSaver: list them (no subcommand) or prune them.",
    no_args_is_help=False,
    invoke_without_command=True,
)
app.add_typer(threads_app, name="threads")

T = TypeVar("T")


def _langgraph() -> Any:
    try:
        from nestegg.langgraph import inspect
    except ImportError as exc:
        raise MissingDependencyError(
            f"LangGraph threads need langgraph-checkpoint ({exc.name}): "
            "pip install 'nestegg[langgraph]'"
        ) from exc
    return inspect


def _threads(store: CheckpointStorage) -> ThreadStore:
    from nestegg.checkpoint.stores.threads import ThreadStore

    if not isinstance(store, ThreadStore):
        raise CommandError(f"{type(store).__name__} keeps no LangGraph threads", EXIT_USAGE)
    return store


@threads_app.callback()
def threads_command(
    ctx: typer.Context, as_json: JsonOption = False, store: StoreOption = None
) -> None:
    """The LangGraph threads in the store, most recently written first."""
    if ctx.invoked_subcommand is not None:
        return
    from nestegg.cli.render import Output, when

    inspect = _langgraph()

    async def work(opened: CheckpointStorage) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await inspect.thread_summaries(_threads(opened))
        return rows

    rows = run_with_store(ctx, store, work, read_only=True)
    out = Output(as_json)
    if as_json:
        out.json(rows)
        return
    if not rows:
        out.note("no LangGraph threads")
        return
    cells = [
        [
            r["thread_id"],
            str(r["checkpoints"]),
            ", ".join(n or "(root)" for n in r["namespaces"]),
            when(r["updated_at"]),
            r["latest_checkpoint"] or "-",
        ]
        for r in rows
    ]
    out.table(("THREAD", "CHECKPOINTS", "NAMESPACES", "UPDATED", "LATEST CHECKPOINT"), cells)


def _refusal(thread_ids: list[str], where: str) -> InvalidIdentifierError | None:
    """The refusal of the first of ``thread_ids`` :func:`check_thread_id` refuses, None
    when it refuses none: it stands unless the store holds such a thread (an older version
    wrote it), which :func:`_stored_if_refused` checks once the store is open."""
    from nestegg.checkpoint.stores.threads import check_thread_id

    for thread_id in thread_ids:
        try:
            check_thread_id(thread_id, where)
        except InvalidIdentifierError as error:
            return error
    return None


async def _stored_if_refused(threads: ThreadStore, thread_ids: list[str], where: str) -> None:
    """Refuse an id of ``thread_ids`` as :func:`check_thread_id` does unless ``threads``
    holds that thread, as the saver's reads take it."""
    from nestegg.langgraph.ids import thread_to_read

    for thread_id in thread_ids:
        await thread_to_read(threads, thread_id, where)


def _with_threads(
    ctx: typer.Context,
    store: str | None,
    work: Callable[[CheckpointStorage], Awaitable[T]],
    refused: InvalidIdentifierError | None,
    **opening: bool,
) -> T:
    """:func:`run_with_store`, where no store there means no thread of a ``refused`` id:
    then the id is refused (exit 2), not the store missing (exit 3)."""
    try:
        return run_with_store(ctx, store, work, **opening)
    except CommandError as error:
        if refused is None or error.exit_code != EXIT_NOT_FOUND:
            raise
        raise refused from None


@app.command("thread")
def thread_command(
    ctx: typer.Context,
    thread_id: Annotated[str, typer.Argument(help="The LangGraph thread id.", show_default=False)],
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """A LangGraph thread's checkpoints, newest first, with their metadata."""
    from nestegg.cli.render import Output

    where = "the THREAD argument"
    refused = _refusal([thread_id], where)
    inspect = _langgraph()

    async def work(opened: CheckpointStorage) -> tuple[list[dict[str, Any]], bool]:
        threads = _threads(opened)
        await _stored_if_refused(threads, [thread_id], where)
        rows: list[dict[str, Any]] = await inspect.thread_checkpoints(threads, thread_id)
        listed = bool(rows) or any(t.thread_id == thread_id for t in await threads.list_threads())
        return rows, listed

    rows, listed = _with_threads(ctx, store, work, refused, read_only=True)
    if not listed:
        raise CommandError(f"no LangGraph thread {thread_id!r}", EXIT_NOT_FOUND)
    out = Output(as_json)
    if not rows:  # its writes only, as a run that failed before its first checkpoint leaves
        out.note(
            f"thread {thread_id!r} has no checkpoint, only writes waiting for one (as a run "
            "of it that failed before its first checkpoint leaves it)"
        )
    damaged = [r for r in rows if not r["valid"]]
    if damaged:
        out.note(
            f"warning: {len(damaged)} of {counted(len(rows), CHECKPOINTS)} cannot be read "
            f"(CHECK DAMAGED): {damaged[0]['damage']}"
        )
    unread = sorted({r["metadata_type"] for r in rows if r["valid"] and r["metadata"] is None})
    if unread:
        count = sum(r["metadata"] is None for r in rows)
        out.note(
            f"note: the metadata of {count} of {len(rows)} checkpoints is serialized as "
            f"{', '.join(map(repr, unread))}, which LangGraph's default serializer cannot "
            "read (the graph's own serde= wrote it): step, source and metadata not shown"
        )
    if as_json:
        out.json(rows)
        return
    cells = [
        [
            r["checkpoint_id"],
            r["checkpoint_ns"] or "(root)",
            "-" if r["step"] is None else str(r["step"]),
            str(r["source"] or "-"),
            r["run_id"] or "-",
            r["parent_id"] or "-",
            "ok" if r["valid"] else "DAMAGED",
        ]
        for r in rows
    ]
    columns = ("CHECKPOINT", "NAMESPACE", "STEP", "SOURCE", "RUN", "PARENT", "CHECK")
    out.table(columns, cells, whole=(0, 6))


@threads_app.command("prune")
def prune_command(
    ctx: typer.Context,
    thread_ids: Annotated[
        list[str] | None,
        typer.Argument(help="Threads to prune (default: all).", show_default=False),
    ] = None,
    delete: Annotated[
        bool, typer.Option("--delete", help="Delete the threads instead of keeping the latest.")
    ] = False,
    older_than: Annotated[
        str | None,
        typer.Option(
            "--older-than",
            help="Only threads not written for this long (7d, 12h).",
            show_default=False,
        ),
    ] = None,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
    store: StoreOption = None,
) -> None:
    """Keep only each namespace's latest checkpoint of LangGraph threads (and what it needs),
    or delete the threads with --delete."""
    from nestegg.cli.render import Output

    where = "a THREAD argument"
    refused = _refusal(thread_ids or [], where)
    inspect = _langgraph()
    cutoff = time.time() - parse_duration(older_than).total_seconds() if older_than else None

    async def chosen(opened: CheckpointStorage) -> tuple[list[str], list[str], list[str]]:
        threads = _threads(opened)
        await _stored_if_refused(threads, thread_ids or [], where)
        summaries = await inspect.thread_summaries(threads)
        wanted = dict.fromkeys(thread_ids or [])
        stored = {s["thread_id"] for s in summaries}
        matched = [
            s
            for s in summaries
            if (not wanted or s["thread_id"] in wanted)
            and (cutoff is None or s["updated_at"].timestamp() < cutoff)
        ]
        targets = [s["thread_id"] for s in matched if delete or s["superseded"]]
        return [s["thread_id"] for s in matched], targets, [t for t in wanted if t not in stored]

    matched, targets, missing = _with_threads(ctx, store, chosen, refused, existing=True)
    not_found = _not_found(missing)
    if missing and len(missing) == len(set(thread_ids or [])):
        raise not_found  # none of the named threads: nothing to prune
    if matched and not targets:
        Output(False).note(
            f"nothing to prune: no checkpoint of {_these(len(matched))} is superseded by a "
            "newer one of its namespace"
        )
    else:
        _prune(ctx, store, targets, delete=delete, dry_run=dry_run, yes=yes)
    if missing:
        raise not_found  # after pruning those that are there


def _these(count: int) -> str:
    """The threads taken, when none holds anything to prune: ``the thread`` or ``the 7
    threads``."""
    return "the thread" if count == 1 else f"the {count:,} threads"


def _not_found(missing: list[str]) -> CommandError:
    names = ", ".join(map(repr, missing))
    return CommandError(f"no {LANGGRAPH_THREADS[len(missing) > 1]} {names}", EXIT_NOT_FOUND)


def _prune(
    ctx: typer.Context,
    store: str | None,
    targets: list[str],
    *,
    delete: bool,
    dry_run: bool,
    yes: bool,
) -> None:
    from nestegg.cli.render import Output

    out = Output(False)
    strategy = "delete" if delete else "keep_latest"
    action = "delete" if delete else "prune to their latest checkpoints"
    if not targets:
        out.note("no LangGraph threads to prune")
        return
    if dry_run:
        for thread_id in targets:
            out.line(thread_id)
        out.note(f"would {action}: {counted(len(targets), THREADS)} (dry run, nothing changed)")
        return
    threads = counted(len(targets), LANGGRAPH_THREADS)
    keeping = "" if delete else " to the latest checkpoint of each namespace"
    # as prune asks: the verb first, then what it takes ("Delete 2 runs and 1 checkpoint?")
    confirm_or_stop(f"{'Delete' if delete else 'Prune'} {threads}{keeping}?", yes)
    from nestegg.langgraph import NestEggSaver

    with NestEggSaver(open_selected(store_url(ctx, store)), close_storage=True) as saver:
        saver.prune(targets, strategy=strategy)
    for thread_id in targets:
        out.line(thread_id)
    out.note(f"{'deleted' if delete else 'pruned'} {threads}")
    if not delete:
        _note_kept_damage(ctx, store, targets)


def _note_kept_damage(ctx: typer.Context, store: str | None, thread_ids: list[str]) -> None:
    """Name the pruned threads that hold rows that cannot be read: a prune keeps them, and
    what they may need."""
    from nestegg.cli.render import Output
    from nestegg.langgraph.damage import damaged_rows

    async def work(opened: CheckpointStorage) -> dict[str, int]:
        threads = _threads(opened)
        return {thread_id: await damaged_rows(threads, thread_id) for thread_id in thread_ids}

    for thread_id, count in run_with_store(ctx, store, work, read_only=True).items():
        if count:
            Output(False).note(
                f"note: kept {counted(count, ROWS)} of thread {thread_id!r} that cannot be "
                "read (altered or torn) and what they may need; nestegg thread marks DAMAGED "
                "the checkpoints that need them"
            )
