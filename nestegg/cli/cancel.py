"""``nestegg cancel``: cancel a stored run from outside the process that runs it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import JsonOption, StoreOption, app, id_argument, run_with_store
from nestegg.constants import DEFAULT_LEASE, QUEUED, RUNNING
from nestegg.identifiers import check_name
from nestegg.wording import STEPS, counted

if TYPE_CHECKING:
    from nestegg.checkpoint.cancels import Cancellation
    from nestegg.checkpoint.stores.base import CheckpointStorage


def _summary(cancel: Cancellation) -> dict[str, Any]:
    run = cancel.run
    return {
        "run_id": run.run_id,
        "status": run.status,
        "cancelled": cancel.done,
        "previous": cancel.previous,
        "previous_owner": cancel.previous_owner,
        "steps": run.step_seq,
    }


def _was(summary: dict[str, Any]) -> str:
    """What the run was, as the line of a cancel says it."""
    previous, owner = summary["previous"], summary["previous_owner"]
    if previous == QUEUED:
        return "queued for workers"
    was = f"{previous} after {counted(summary['steps'], STEPS)}"
    if previous == RUNNING and owner is not None:
        was += f"; its owner, pid {owner['pid']} on {owner['host']}, stops at its next commit"
    return was


async def cancel_stored(store: CheckpointStorage, run_id: str, now: float) -> dict[str, Any]:
    """Cancel run ``run_id`` of any pipeline as ``nestegg cancel`` does (the default lease):
    what its ``--json`` prints. The web inspector's cancel makes it too.

    Raises:
        InvalidIdentifierError: an id no run can have (nothing changes).
        RunNotFoundError, RunFinishedError, RunLockedError: as
            :func:`~nestegg.checkpoint.cancels.cancel_run` raises them.
    """
    from nestegg.checkpoint.cancels import cancel_run

    lease = DEFAULT_LEASE.total_seconds()
    chosen = check_name(run_id, "run id")
    return _summary(await cancel_run(store, chosen, now, lease_seconds=lease))


def cancel_line(summary: dict[str, Any]) -> str:
    """The line ``nestegg cancel`` prints for what :func:`cancel_stored` did."""
    run_id = summary["run_id"]
    if summary["cancelled"]:
        return f"run {run_id} cancelled (was {_was(summary)})"
    return f"run {run_id} is cancelled already; nothing was changed"


@app.command("cancel")
def cancel_command(
    ctx: typer.Context,
    run_id: Annotated[
        str,
        id_argument("The run to cancel."),
    ],
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Cancel a running or waiting run, from any process.

    The run is stored cancelled: no sweep, `nestegg recover` or timer takes it up again;
    `nestegg resume RUN --app ...` continues it on purpose. A live owner (a local process,
    a worker) stops at its next commit (with durability "exit", at the next step boundary
    after its lease renewal found the run taken): the step under way finishes its current
    call (a journaled call in flight is paid) and is not recorded. A completed or failed
    run is refused (exit 1); a cancelled one is left as it is.
    """
    from nestegg.cli.render import Output

    out = Output(as_json)

    async def work(opened: CheckpointStorage) -> dict[str, Any]:
        return await cancel_stored(opened, run_id, time.time())

    summary = run_with_store(ctx, store, work, existing=True)
    if as_json:
        out.json(summary)
    else:
        out.line(cancel_line(summary))
