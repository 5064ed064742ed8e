"""Commands that change what is stored: prune, delete, export and import."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import CommandError, StoreOption, app, id_argument, run_with_store
from nestegg.cli.runs import check_status
from nestegg.constants import (
    EXIT_FAILED,
    EXIT_USAGE,
    FINISHED,
    LARGEST_NUMBER,
    LONGEST_DURATION_DAYS,
)
from nestegg.errors import CheckpointCorruptedError, InvalidIdentifierError, RunLockedError
from nestegg.identifiers import check_pipeline_filter
from nestegg.wording import CHECKPOINTS, EVENTS, JOURNAL_ENTRIES, RUNS, STEPS, counted, numbers_text

if TYPE_CHECKING:
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.cli.render import Output

_UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
"""The units of a duration, the largest first: the order a sum of them is written in."""
_DURATION = re.compile("".join(rf"(?:([0-9]+(?:\.[0-9]+)?){unit})?" for unit in _UNIT_SECONDS))
"""A number of ASCII digits (``\\d`` and ``float`` take other scripts' digits too) and a
unit, or a sum of them, each unit once, the largest first."""
_DURATION_FORMS = (
    "use a number (digits 0-9) and a unit s, m, h, d or w, or a sum of such, each unit "
    "once, the largest first (e.g. 7d, 1.5h, 1d12h)"
)

IMPORTED_NOUNS = {
    "steps": STEPS,
    "checkpoints": CHECKPOINTS,
    "events": EVENTS,
    "journal": JOURNAL_ENTRIES,
}
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Show what would be deleted; change nothing.")
]


def parse_duration(text: str, shown: Callable[[object], str] = repr) -> timedelta:
    """``30s``, ``15m``, ``12h``, ``7d``, ``2w`` or sums like ``1d12h``, each unit once and
    the largest first (``shown`` writes ``text`` in the error: JSON for a JSON body's), up
    to LONGEST_DURATION_DAYS days.

    Raises:
        CommandError: (bad usage) anything else (``1s1s``, ``12h1d``, digits other than
            0-9), or a longer duration.
    """
    compact = text.replace(" ", "").lower()
    match = _DURATION.fullmatch(compact) if compact else None
    if match is None:
        raise CommandError(f"bad duration {shown(text)}: {_DURATION_FORMS}", EXIT_USAGE)
    numbers = zip(match.groups(), _UNIT_SECONDS.values(), strict=True)
    seconds = sum(float(number) * unit for number, unit in numbers if number is not None)
    if seconds > LONGEST_DURATION_DAYS * _UNIT_SECONDS["d"]:
        raise CommandError(
            f"bad duration {shown(text)}: the longest taken is {LONGEST_DURATION_DAYS}d",
            EXIT_USAGE,
        )
    return timedelta(seconds=seconds)


def confirm_or_stop(question: str, yes: bool) -> None:
    """Ask ``question`` unless ``yes``; a no ends the command (exit 1, nothing changed),
    and so does the end of stdin (a closed or empty one: no answer is no), where click
    aborts; Ctrl-C still aborts."""
    if yes:
        return
    try:
        confirmed = typer.confirm(question, default=False, err=True)
    except typer.Abort as abort:
        if not isinstance(abort.__context__, EOFError):  # click raises it from None
            raise
        sys.stderr.write("\n")  # the prompt's line, which no answer ended
        confirmed = False
    if not confirmed:
        raise CommandError("nothing was changed (not confirmed)", EXIT_FAILED)


@dataclass(slots=True)
class PrunePlan:
    """What a prune deletes: whole runs, and surplus checkpoints of the runs it keeps."""

    runs: list[RunRecord] = field(default_factory=list)
    checkpoints: dict[str, list[str]] = field(default_factory=dict)
    note: str | None = None
    """``no runs of pipeline 'nosuch'`` when the pipeline filter names no stored run at all
    (of any status): what the command and the web inspector say of such a prune."""

    @property
    def checkpoint_count(self) -> int:
        """Checkpoints the plan deletes from kept runs."""
        return sum(len(ids) for ids in self.checkpoints.values())

    def to_json(self) -> dict[str, Any]:
        """The plan as plain data."""
        plan: dict[str, Any] = {
            "runs": [r.run_id for r in self.runs],
            "checkpoints": {run_id: ids for run_id, ids in self.checkpoints.items()},
        }
        return plan if self.note is None else {**plan, "note": self.note}


async def plan_prune(
    store: CheckpointStorage,
    *,
    keep: int | None,
    older_than: timedelta | None,
    statuses: list[str],
    pipeline: str | None,
) -> PrunePlan:
    """What to delete; runs a live process executes are never part of it. A ``pipeline``
    that names no stored run (asked only when no run matched, of one run at most) gives
    the plan its note.

    Raises:
        InvalidIdentifierError: a ``pipeline`` no pipeline can have (nothing is deleted).
    """
    from nestegg.checkpoint.ownership import owner_alive
    from nestegg.checkpoint.stores.base import checkpoints_of

    now = time.time()
    runs = await store.list_runs(pipeline=check_pipeline_filter(pipeline), statuses=statuses)
    plan = PrunePlan()
    if pipeline is not None and not runs and not await store.list_runs(pipeline=pipeline, limit=1):
        plan.note = f"no runs of pipeline {pipeline!r}"
    runs = [run for run in runs if not owner_alive(run, now)]
    if older_than is not None:
        cutoff = now - older_than.total_seconds()
        plan.runs = [run for run in runs if run.updated_at < cutoff]
    if keep is not None:
        going = {run.run_id for run in plan.runs}
        kept = [run for run in runs if run.run_id not in going]
        listed = await checkpoints_of(store, [run.run_id for run in kept])
        for run, checkpoints in zip(kept, listed, strict=True):
            surplus = [c.checkpoint_id for c in checkpoints[: max(0, len(checkpoints) - keep)]]
            if surplus:
                plan.checkpoints[run.run_id] = surplus
    return plan


async def apply_prune(store: CheckpointStorage, plan: PrunePlan) -> tuple[int, int]:
    """Carry out a plan; how many runs and checkpoints went."""
    runs = sum([await store.delete_run(run.run_id) for run in plan.runs])
    checkpoints = 0
    for run_id, ids in plan.checkpoints.items():
        checkpoints += await store.delete_checkpoints(run_id, ids)
    return runs, checkpoints


def _print_plan(out: Output, plan: PrunePlan, keep: int | None) -> None:
    for run in plan.runs:
        out.line(f"run {run.run_id} ({run.pipeline}, {run.status}, {counted(run.step_seq, STEPS)})")
    for run_id, ids in plan.checkpoints.items():
        out.line(f"{counted(len(ids), CHECKPOINTS)} of run {run_id} (keeping the newest {keep})")


@app.command("prune")
def prune_command(
    ctx: typer.Context,
    keep: Annotated[
        int | None,
        typer.Option(
            min=1, max=LARGEST_NUMBER, help="Keep only the newest N checkpoints of each run."
        ),
    ] = None,
    older_than: Annotated[
        str | None,
        typer.Option(help="Delete whole runs not updated for this long: 30m, 12h, 7d, 2w."),
    ] = None,
    status: Annotated[
        str | None,
        typer.Option(help="Only runs with this status (default: completed, failed, cancelled)."),
    ] = None,
    pipeline: Annotated[str | None, typer.Option(help="Only runs of this pipeline.")] = None,
    dry_run: DryRunOption = False,
    yes: YesOption = False,
    store: StoreOption = None,
) -> None:
    """Delete old runs and surplus checkpoints.

    --older-than deletes whole runs; --keep deletes all but the newest N checkpoints of
    each run (its steps stay, so it still shows and resumes).

    Only finished runs unless --status says otherwise (--status running means interrupted
    runs); runs a live process executes are never touched.
    """
    from nestegg.cli.render import Output

    statuses = check_status(status) or list(FINISHED)  # a bad value named before the rest
    if keep is None and older_than is None:
        raise CommandError("prune needs --keep N and/or --older-than DURATION", EXIT_USAGE)
    age = parse_duration(older_than) if older_than is not None else None
    check_pipeline_filter(pipeline)  # bad usage before the store is looked at
    out = Output()

    async def work(opened: CheckpointStorage) -> None:
        plan = await plan_prune(
            opened, keep=keep, older_than=age, statuses=statuses, pipeline=pipeline
        )
        total = f"{counted(len(plan.runs), RUNS)} and {counted(plan.checkpoint_count, CHECKPOINTS)}"
        if not plan.runs and not plan.checkpoints:
            out.line(plan.note or "nothing to prune")
            return
        _print_plan(out, plan, keep)
        if dry_run:
            out.line(f"dry run: would delete {total}; nothing was changed")
            return
        confirm_or_stop(f"Delete {total}?", yes)
        runs, checkpoints = await apply_prune(opened, plan)
        out.line(f"deleted {counted(runs, RUNS)} and {counted(checkpoints, CHECKPOINTS)}")

    run_with_store(ctx, store, work, existing=True)


@app.command("delete")
def delete_command(
    ctx: typer.Context,
    run_id: Annotated[
        str,
        id_argument("The run to delete."),
    ],
    dry_run: DryRunOption = False,
    yes: YesOption = False,
    store: StoreOption = None,
) -> None:
    """Delete a run and everything of it.

    That is its steps, checkpoints, events and journal entries.
    """
    from nestegg.checkpoint.ownership import owner_alive
    from nestegg.cli.reading import get_run
    from nestegg.cli.render import Output

    out = Output()

    async def work(opened: CheckpointStorage) -> None:
        run = await get_run(opened, run_id)
        if owner_alive(run, time.time()):
            owner = f"pid {run.owner.pid}" if run.owner else "another process"
            raise RunLockedError(f"run {run_id!r} is executing ({owner}); not deleted", run_id)
        checkpoints = len(await opened.list_checkpoints(run_id))
        what = (
            f"run {run_id} ({run.pipeline}, {run.status}, {counted(run.step_seq, STEPS)}, "
            f"{counted(checkpoints, CHECKPOINTS)})"
        )
        if dry_run:
            out.line(f"dry run: would delete {what}; nothing was changed")
            return
        confirm_or_stop(f"Delete {what}?", yes)
        await opened.delete_run(run_id)
        out.line(f"deleted {what}")

    run_with_store(ctx, store, work, existing=True)


@app.command("export")
def export_command(
    ctx: typer.Context,
    run_id: Annotated[
        str,
        id_argument("The run to export."),
    ],
    output: Annotated[
        str | None,
        typer.Option("--output", "-o", help="Write here instead of stdout (-: stdout)."),
    ] = None,
    store: StoreOption = None,
) -> None:
    """Write a run as one JSON document.

    The document holds the run and everything of it (format: docs/cli.md).
    """
    from nestegg.cli.json_input import STANDARD_STREAM, refuse_empty_path
    from nestegg.cli.render import Output
    from nestegg.cli.transfer import export_run

    if output is not None:  # a str: Path('') would be the current directory
        refuse_empty_path(output, "--output", "standard output")

    async def work(opened: CheckpointStorage) -> dict[str, Any]:
        return await export_run(opened, run_id)

    document = export_text(run_with_store(ctx, store, work, read_only=True))
    if output is None or output == STANDARD_STREAM:
        sys.stdout.buffer.write(document)
        sys.stdout.flush()
        return
    try:
        Path(output).write_bytes(document)
    except OSError as error:
        raise CommandError(f"cannot write {output}: {error.strerror or error}") from error
    Output().note(f"exported run {run_id} to {output}")


def export_text(exported: dict[str, Any]) -> bytes:
    """The file ``nestegg export`` writes of ``exported``: the one writer of its text."""
    from nestegg.cli.render import dump_json

    return dump_json(exported).encode() + b"\n"


def _refuse_key_twice(raw: bytes, document: Any, source: str) -> None:
    """Refuse an export in which an object has a key twice: orjson, which read it, kept the
    last value (a second ``"steps"`` would import the run without the first's steps). An
    export as :func:`export_command` writes it, unedited, is :func:`export_text` of the
    document read, whose objects have each key once: it is not read again (about 10 ms for
    a run of 10,000 steps, instead of about 100)."""
    from nestegg.checkpoint.given import refuse_key_twice

    if export_text(document) != raw:
        refuse_key_twice(raw, source, plain=True)


@app.command("import")
def import_command(
    ctx: typer.Context,
    source: Annotated[
        str, typer.Argument(help="An export file, or - for stdin.", show_default=False)
    ],
    store: StoreOption = None,
) -> None:
    """Re-create an exported run in the store.

    Exactly as it was: same ids and records; checksums are checked first.
    """
    from nestegg.cli.json_input import read_json_text, source_name
    from nestegg.cli.render import Output
    from nestegg.cli.transfer import ExportFormatError, import_run, missing_steps, read_export

    document, raw = read_json_text(source)
    named = source_name(source)
    _refuse_key_twice(raw, document, named)
    try:  # checked before the store is opened: a file refused leaves no store behind
        read = read_export(document)
    except ExportFormatError as error:
        raise CommandError(f"{named}: {error}", EXIT_USAGE) from error
    except InvalidIdentifierError as error:  # an id or signal name of the file: named so too
        raise InvalidIdentifierError(f"{named}: {error}") from error
    except CheckpointCorruptedError as error:
        raise CheckpointCorruptedError(f"{named}: {error}") from error

    async def work(opened: CheckpointStorage) -> RunRecord:
        return await import_run(opened, document, read)

    run = run_with_store(ctx, store, work)
    parts = {k: len(document[k]) for k in ("steps", "checkpoints", "events", "journal")}
    counts = ", ".join(counted(n, IMPORTED_NOUNS[k]) for k, n in parts.items())
    out = Output()
    out.line(f"imported run {run.run_id} ({run.pipeline}, {run.status}): {counts}")
    missing = missing_steps(run, read[1])
    if missing:
        steps, them = ("step", "it") if len(missing) == 1 else ("steps", "them")
        out.note(
            f"note: the export holds no record of {steps} {numbers_text(missing)} of run "
            f"{run.run_id} (the store it came from had lost {them}, or the file was edited): "
            f"nestegg show {run.run_id} marks {them} missing, nestegg checkpoints "
            f"{run.run_id} shows the checkpoints a resume can still use"
        )
