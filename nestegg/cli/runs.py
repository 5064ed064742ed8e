"""Reading commands: runs, show, checkpoints, inspect, diff and events."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import CommandError, JsonOption, StoreOption, app, id_argument, run_with_store
from nestegg.cli.seconds import seconds_parser
from nestegg.constants import (
    CLI_POLL_INTERVAL,
    CLI_RUN_LIMIT,
    CLI_SHOW_FORKS,
    CLI_SHOW_STEPS,
    CLI_VALUE_CHARS,
    CLI_VALUE_ITEMS,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    FORK_SCAN,
    INTERRUPTED,
    LARGEST_NUMBER,
    LISTED_STATUSES,
    QUEUED,
    RUNNING,
    SHOWN_RUNNING,
    STATUSES,
)
from nestegg.identifiers import check_pipeline_filter
from nestegg.wording import counted

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.cli.render import Output

FullOption = Annotated[
    bool,
    typer.Option(
        "--full",
        help=f"Show long values whole (default: strings cut at {CLI_VALUE_CHARS} characters, "
        f"lists and dicts at {CLI_VALUE_ITEMS} items; --json is always whole).",
    ),
]
RUN_COLUMNS = ("RUN", "PIPELINE", "STATUS", "STEPS", "LAST CHECKPOINT", "UPDATED", "OWNER")


def check_status(status: str | None, accepted: tuple[str, ...] = STATUSES) -> list[str] | None:
    """The statuses to filter by; bad usage, naming every ``accepted`` one, for another."""
    from nestegg.checkpoint.stores import common

    if status is None:
        return None
    common.check_status(status, accepted)
    return [status]


def owner_text(owner: dict[str, Any] | None) -> str:
    """``host pid`` of an owner, without the boot id."""
    if not owner:
        return "-"
    return f"{str(owner['host']).split('#', 1)[0]}:{owner['pid']}"


def canceller_text(by: dict[str, Any]) -> str:
    """``host pid`` of who cancelled a run from outside; ``unknown`` when its event log
    cannot be read (see :func:`reading.complete_row`)."""
    return "unknown" if "unreadable" in by else owner_text(by)


def _owner_cell(row: dict[str, Any]) -> str:
    """The owner that last ran the run, and who cancelled it from outside, if anyone."""
    by = row["cancelled_by"]
    shown = owner_text(row["owner"])
    return f"{shown} (cancelled by {canceller_text(by)})" if by else shown


def _status_cell(row: dict[str, Any]) -> str:
    from nestegg.cli import reading
    from nestegg.cli.wait_words import wait_text

    wait = row.get("waits_for")
    status = reading.shown_status(row)
    return f"{status} ({wait_text(wait)})" if wait else status


def _run_cells(row: dict[str, Any]) -> list[str]:
    from nestegg.cli.render import when

    last = row["last_checkpoint"]
    return [
        row["run_id"],
        row["pipeline"],
        _status_cell(row),
        str(row["steps"]),
        f"{last['checkpoint_id']} @{last['seq']}" if last else "-",
        when(row["updated_at"]),
        owner_text(row["owner"]),
    ]


@app.command("runs")
def runs_command(
    ctx: typer.Context,
    status: Annotated[
        str | None,
        typer.Option(
            help=f"Only runs with this status ({', '.join(STATUSES)}; {INTERRUPTED}: as "
            f"--interrupted; {QUEUED}: running, stored for workers, none took it yet)."
        ),
    ] = None,
    pipeline: Annotated[str | None, typer.Option(help="Only runs of this pipeline.")] = None,
    interrupted: Annotated[
        bool, typer.Option("--interrupted", help="Only running runs whose owner is gone.")
    ] = False,
    limit: Annotated[
        int, typer.Option(min=1, max=LARGEST_NUMBER, help="At most this many runs, newest first.")
    ] = (CLI_RUN_LIMIT),
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """List runs, newest first.

    Columns: id, pipeline, status (interrupted: running, but its owner is gone; queued:
    running, stored for workers, none took it yet; waiting: with the signal or timer it
    waits for, and its deadline), steps, last checkpoint, last update, owner.
    """
    from nestegg.cli import reading
    from nestegg.cli.render import Output
    from nestegg.cli.wait_words import app_placeholder, named_some, unreadable_text, wait_is_over

    shown = INTERRUPTED if interrupted else None
    if status in SHOWN_RUNNING and not interrupted:  # as the table shows it: running ones
        status, shown = None, status
    elif interrupted and status not in (None, RUNNING, INTERRUPTED):
        raise CommandError(
            f"--interrupted lists running runs whose owner is gone, none with status {status!r}: "
            "give one of --interrupted and --status",
            EXIT_USAGE,
        )
    statuses = check_status(status, LISTED_STATUSES)  # interrupted, queued taken above
    check_pipeline_filter(pipeline)
    if shown:
        statuses = [RUNNING]

    async def work(opened: CheckpointStorage) -> list[dict[str, Any]]:
        return await reading.list_run_rows(
            opened,
            pipeline=pipeline,
            statuses=statuses,
            shown=shown,
            limit=limit,
            now=time.time(),  # a command judges leases by the wall clock
        )

    rows = run_with_store(ctx, store, work, read_only=True)
    out = Output(as_json)
    if as_json:
        out.json(rows)
    elif not rows:
        out.note("no runs")
    else:
        out.table(RUN_COLUMNS, [_run_cells(r) for r in rows], status_column=2, whole=(0, 2, 3))
        unknown = [r["run_id"] for r in rows if unreadable_text(r["waits_for"])]
        if unknown:
            out.note(
                f"note: the wait of {named_some(unknown)} cannot be read, its event log "
                "damaged: nestegg show RUN says why"
            )
        over = [r["run_id"] for r in rows if wait_is_over(r["waits_for"])]
        if over:
            options = app_placeholder(ctx, store)
            out.note(
                f"note: the wait of {named_some(over)} is over: resume one with nestegg resume "
                f"RUN {options}, all with nestegg recover {options}, or a worker of its "
                "pipeline takes it"
            )


def _fork_lines(details: dict[str, Any], shown: int | None) -> list[str]:
    """A line per run forked from the run, newest first (the first ``shown``; None: all),
    then how many more there are, or that the search for them was cut short."""
    forks = details["forks"]
    from nestegg.cli import reading

    lines = [
        f"{f['run_id']} at {f['checkpoint']} ({reading.shown_status(f)})" for f in forks[:shown]
    ]
    if shown is not None and len(forks) > shown:
        lines.append(f"({len(forks) - shown} more; --all lists them)")
    if not details["forks_complete"]:
        lines.append(f"(the search for forks stopped after {FORK_SCAN} runs: there may be more)")
    return lines


def _show_summary(out: Output, details: dict[str, Any], forks_shown: int | None) -> None:
    from nestegg.cli.render import to_json, when

    run = details["run"]
    items: list[tuple[str, str | list[str]]] = [
        ("run", run["run_id"]),
        ("pipeline", run["pipeline"]),
        ("status", _status_cell(run)),
        ("steps", str(run["steps"])),
        ("created", when(run["created_at"])),
        ("updated", when(run["updated_at"])),
        ("owner", _owner_cell(run)),
    ]
    if run["parent_run"]:
        items.append(("forked from", f"{run['parent_run']} at {run['parent_checkpoint']}"))
    if forks := _fork_lines(details, forks_shown):
        items.append(("forks", forks))
    items.append(("input", to_json(details["input"], indent=False)))
    if run["status"] == "completed":
        items.append(("result", to_json(details["result"], indent=False)))
    error = run["error"]
    if error:  # its lines kept (pydantic's are several), each escaped
        items.append(("error", f"{error.get('type')}: {error.get('message')}".split("\n")))
    out.pairs(items)


def _in_flight_row(step: dict[str, Any], status: str) -> list[str]:
    """The timeline row of the step under way (``interrupted`` when its owner is gone), or
    of the step the run was cancelled in."""
    from nestegg.cli.render import when

    outcome = status if status in ("interrupted", "waiting", "cancelled") else "running"
    calls = step["calls"]
    if calls:
        outcome += f", {len(calls)} call{'' if len(calls) == 1 else 's'} journaled"
    return [str(step["seq"]), str(step["agent"]), when(step["started"]), "-", outcome, ""]


def _show_timeline(out: Output, details: dict[str, Any]) -> None:
    from nestegg.cli import reading
    from nestegg.cli.render import seconds, when

    rows = []
    for step in details["steps"]:
        rows.append(
            [
                str(step["seq"]),
                step["agent"],
                when(step["started"]),
                seconds(step["duration"]),
                step["outcome"],
                ", ".join(step["checkpoints"]),
            ]
        )
    failed = details["failed_step"]
    if failed:
        started, duration = when(failed["started"]), seconds(failed["duration"])
        raised = failed["agent"] or failed["hook"]  # the agent, or the selector picking it
        rows.append([str(failed["seq"]), str(raised), started, duration, "failed", ""])
    in_flight = details["step_in_flight"]
    if in_flight and "unreadable" not in in_flight:
        rows.append(_in_flight_row(in_flight, reading.shown_status(details["run"])))
    out.line()
    if details["steps_before"]:
        before = counted(details["steps_before"], ("earlier step", "earlier steps"))
        out.line(f"({before} not shown; --all shows them)")
    if details["initial_checkpoints"]:
        out.line(f"checkpoint before the first step: {', '.join(details['initial_checkpoints'])}")
    columns = ("STEP", "AGENT", "STARTED", "DURATION", "OUTCOME", "CHECKPOINT")
    out.table(columns, rows, status_column=4, title="timeline", whole=(0, 1, 2, 3, 4))
    if in_flight and "unreadable" in in_flight:
        out.line(f"step in flight: unreadable ({in_flight['unreadable']})")


@app.command("show")
def show_command(
    ctx: typer.Context,
    run_id: Annotated[str, id_argument("The run id.")],
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help=f"All steps and forks (default: the last {CLI_SHOW_STEPS} steps, the newest "
            f"{CLI_SHOW_FORKS} forks).",
        ),
    ] = False,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """A run's summary and the timeline of its steps.

    The summary names the run it was forked from and the runs forked from it, newest first.
    The timeline shows each step's agent, start, duration and outcome, and the checkpoints
    taken after it.
    """
    from nestegg.cli import reading
    from nestegg.cli.render import Output
    from nestegg.cli.wait_words import app_placeholder, resume_hint, unreadable_text, wait_is_over

    tail = None if (show_all or as_json) else CLI_SHOW_STEPS

    async def work(opened: CheckpointStorage) -> dict[str, Any]:
        return await reading.run_details(opened, run_id, tail, time.time())

    details = run_with_store(ctx, store, work, read_only=True)
    out = Output(as_json)
    if as_json:
        out.json(details)
        return
    _show_summary(out, details, None if show_all else CLI_SHOW_FORKS)
    if (unreadable := unreadable_text(details["run"]["waits_for"])) is not None:
        out.line(unreadable)
    if wait_is_over(details["run"]["waits_for"]):
        out.line(f"its wait is over: {resume_hint(run_id, app_placeholder(ctx, store))}")
    _show_timeline(out, details)


@app.command("checkpoints")
def checkpoints_command(
    ctx: typer.Context,
    run_id: Annotated[str, id_argument("The run id.")],
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """A run's checkpoints, oldest first.

    Inspect one with `nestegg inspect ID`; CHECK says whether a resume from it would use
    it (DAMAGED: its record or a step record it rests on fails its checksum, or is missing).
    """
    from nestegg.cli import reading
    from nestegg.cli.render import Output, when

    async def work(opened: CheckpointStorage) -> tuple[RunRecord, list[dict[str, Any]]]:
        run = await reading.get_run(opened, run_id)
        return run, await reading.checkpoint_rows(opened, run)

    run, rows = run_with_store(ctx, store, work, read_only=True)
    out = Output(as_json)
    if as_json:
        out.json(rows)
        return
    if not rows:
        out.note(f"run {run_id!r} has no checkpoints")
        return
    cells = [
        [
            r["checkpoint_id"],
            str(r["seq"]),
            "-" if r["turn"] is None else str(r["turn"]),
            r["reason"],
            when(r["created_at"]),
            reading.next_agent_shown(r["next_agent"], r["position"], run, r["seq"]) or "",
            "ok" if r["valid"] else "DAMAGED",
        ]
        for r in rows
    ]
    columns = ("CHECKPOINT", "STEP", "TURN", "REASON", "CREATED", "NEXT", "CHECK")
    out.table(columns, cells, whole=(0, 1, 2, 3, 6))


def _part(state: dict[str, Any], path: str | None) -> Any:
    from nestegg.cli.paths import PathNotFoundError, select

    if path is None:
        return state
    try:
        return select(state, path)
    except ValueError as error:
        raise CommandError(f"bad --path: {error}", EXIT_USAGE) from error
    except PathNotFoundError as error:
        raise CommandError(str(error), EXIT_NOT_FOUND) from error


@app.command("inspect")
def inspect_command(
    ctx: typer.Context,
    checkpoint: Annotated[
        str,
        id_argument(
            "A checkpoint id, or a run id for its newest checkpoint.", "checkpoint or run id"
        ),
    ],
    path: Annotated[
        str | None,
        typer.Option(help="Only this part of the state, e.g. data.items[0] or metadata."),
    ] = None,
    full: FullOption = False,
    stored: Annotated[
        bool,
        typer.Option(
            "--stored",
            help="Print it whole in the codec's form, which `nestegg fork --data` reads back "
            'exactly: a value JSON has no type for tagged ({"$ne": "datetime", "v": ...}). '
            "An unedited fork continues with the same data: nestegg fork CHECKPOINT --app "
            'APP --data "$(nestegg inspect CHECKPOINT --path data --stored)".',
        ),
    ] = False,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """The state a checkpoint restores, as JSON.

    The state holds data, metadata, history, turn, position and next agent; --path picks
    a part of it. Shown for people, a value JSON has no type for is plain (a datetime as
    its ISO string, NaN bare); with --stored it is tagged as the codec stores it, what
    nestegg fork --data reads back as the same value.
    """
    from nestegg.checkpoint.codec import enums_kept, sets_in_order, to_jsonable
    from nestegg.cli import reading
    from nestegg.cli.render import Output, dump_json, readable, shorten

    async def work(opened: CheckpointStorage) -> dict[str, Any]:
        return reading.state_json(await reading.resolve_state(opened, checkpoint))

    if stored:  # an enum as stored, whether or not its module imports here
        with enums_kept():
            part = _part(run_with_store(ctx, store, work, read_only=True), path)
            text = dump_json(sets_in_order(to_jsonable(part, path or "state")))
        Output(as_json).json_text(text)
        return
    state = run_with_store(ctx, store, work, read_only=True)
    part = _part(state, path)
    Output(as_json).json(part if full or as_json else shorten(readable(part)))


@app.command("diff")
def diff_command(
    ctx: typer.Context,
    old: Annotated[
        str,
        id_argument("The earlier checkpoint (or run) id.", "checkpoint or run id"),
    ],
    new: Annotated[
        str,
        id_argument("The later checkpoint (or run) id.", "checkpoint or run id"),
    ],
    path: Annotated[str | None, typer.Option(help="Compare only this part of the state.")] = None,
    full: FullOption = False,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """What changed between two checkpoints.

    Lists the paths of the state that were added (+), removed (-) or changed (~).
    """
    from nestegg.cli import reading
    from nestegg.cli.diff import ADDED, REMOVED, diff_values, summarize, types_told
    from nestegg.cli.render import Output, readable, shorten, to_json

    async def work(opened: CheckpointStorage) -> tuple[dict[str, Any], dict[str, Any]]:
        return await reading.compared_states(opened, old, new)

    first, second = run_with_store(ctx, store, work, read_only=True)
    keys = ("checkpoint_id", "run_id")
    before = {k: v for k, v in first.items() if k not in keys}
    after = {k: v for k, v in second.items() if k not in keys}
    changes = diff_values(_part(before, path), _part(after, path))
    out = Output(as_json)
    if as_json:
        out.json(
            {"old": first["checkpoint_id"], "new": second["checkpoint_id"], **summarize(changes)}
        )
        return
    if not changes:
        out.line("no differences")

    def shown(value: Any) -> str:
        return to_json(value if full else shorten(readable(value)), indent=False)

    for change in changes:
        if change.kind == ADDED:
            out.line(f"+ {change.path}: {shown(change.new)}")
        elif change.kind == REMOVED:
            out.line(f"- {change.path}: {shown(change.old)}")
        else:
            was, now = shown(change.old), shown(change.new)
            if types := types_told(change.old, change.new, was, now):
                was, now = f"{was} ({types[0]})", f"{now} ({types[1]})"
            out.line(f"~ {change.path}: {was} -> {now}")


@app.command("events")
def events_command(
    ctx: typer.Context,
    run_id: Annotated[str, id_argument("The run id.")],
    since: Annotated[
        int, typer.Option(min=0, max=LARGEST_NUMBER, help="Only events after this sequence number.")
    ] = 0,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until the run ends.")
    ] = False,
    poll_interval: Annotated[
        float,
        typer.Option(parser=seconds_parser(0.01), help="Seconds between polls with --follow."),
    ] = CLI_POLL_INTERVAL,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """A run's event log.

    --follow keeps polling until the run is no longer running, and also prints the calls
    each step journals meanwhile (call_journaled, read from the journal: no event number),
    each at the time it returned and before the line that ends its step. --json writes one
    JSON object per line (JSON Lines).
    """
    from nestegg.checkpoint.event_log import step_facts_for
    from nestegg.cli import events, reading
    from nestegg.cli.render import Output

    out = Output(as_json)

    async def work(opened: CheckpointStorage) -> None:
        if follow:
            await events.follow(opened, out, run_id, since, poll_interval)
            return
        await reading.get_run(opened, run_id)
        records, damage = await reading.readable_events(opened, run_id, since)
        steps = await step_facts_for(opened, run_id, records)
        for record in records:
            events.print_event(out, events.event_row(record, steps))
        if damage is not None:  # after the events before it
            raise damage

    run_with_store(ctx, store, work, read_only=True)
