"""``nestegg signal``: send a signal to a waiting (or not yet waiting) run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nestegg.cli.app import (
    REPLACE_FLAG,
    JsonOption,
    StoreOption,
    app,
    id_argument,
    run_async,
    run_with_store,
    store_url,
)
from nestegg.cli.apps import APP_HELP, bound
from nestegg.cli.operate import (
    RESUMED_AND_WAITS,
    app_options,
    load_app,
    told_when_handed_back,
    waits_error,
)
from nestegg.errors import RunWaiting

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.checkpoint.waiting import SignalNote


@app.command("signal")
def signal_command(
    ctx: typer.Context,
    run_id: Annotated[
        str,
        id_argument("The run to signal."),
    ],
    name: Annotated[
        str,
        id_argument("The signal's name.", "signal name"),
    ],
    value: Annotated[
        str, typer.Argument(help="Its value, as JSON ('true', '{\"ok\": 1}', '\"text\"').")
    ] = "null",
    app_spec: Annotated[
        str | None, typer.Option("--app", "-a", help=APP_HELP, show_default=False)
    ] = None,
    replace: Annotated[
        bool, typer.Option(REPLACE_FLAG, help="Replace a signal of that name sent before.")
    ] = False,
    as_json: JsonOption = False,
    store: StoreOption = None,
) -> None:
    """Send a signal to a run (nestegg.wait_for in an agent receives it).

    It is stored once per run and name (--replace sends another value). With --app, a run
    that waits for it resumes in this process (or, when the app's Clutch has a transport,
    is handed back to its workers) and its result is printed (one that waits again exits
    5, as resume does); without, the signal is only stored, and
    `nestegg recover --app ...` (or a worker) resumes the run.
    """
    from nestegg.checkpoint.given import refuse_key_twice
    from nestegg.checkpoint.waiting import signal_note, signal_resumes, store_signal, wait_known
    from nestegg.cli.json_input import parse_json
    from nestegg.cli.reading import get_run
    from nestegg.cli.render import Output, to_json
    from nestegg.cli.wait_words import app_placeholder

    out = Output(as_json)
    data = parse_json(value, "the signal's value")
    refuse_key_twice(value, "the signal's value", plain=True)  # orjson kept the last value
    if app_spec is None:

        async def store_only(opened: CheckpointStorage) -> tuple[dict[str, Any], SignalNote]:
            note = await store_signal(opened, run_id, name, data, replace=replace, clock=time.time)
            summary = {"run_id": run_id, "signal": name, "stored": True, "resumed": False}
            return summary | note.summary(), note

        summary, note = run_with_store(ctx, store, store_only, existing=True)
        options = app_placeholder(ctx, store)
    else:
        clutch = load_app(ctx, app_spec, store, out)
        options = app_options(ctx, app_spec, store, clutch)

        async def resume() -> tuple[dict[str, Any], SignalNote]:
            async with bound(clutch, store_url(ctx, store)) as opened:
                run = await get_run(opened, run_id)
                outcome = f"its signal {name!r} not stored"
                resumes = await signal_resumes(opened, run, name, time.time(), outcome)
                wait = await wait_known(opened, run)
                try:  # it warns, as the library does, of a signal the run will not take
                    async with told_when_handed_back(out, clutch, run_id, here=False):
                        result = await clutch.signal(run_id, name, data, replace=replace)
                except RunWaiting as waiting:  # as resume says it: exit 5
                    raise waits_error(waiting, RESUMED_AND_WAITS, options) from waiting
                note = await signal_note(opened, run_id, name, wait)
            summary = {"run_id": run_id, "signal": name, "stored": True} | note.summary()
            return (summary | ({"result": result} if resumes else {"resumed": False})), note

        summary, note = run_async(resume)
    if as_json:
        out.json(summary)
    elif "result" in summary:
        out.line(f"signal {name!r} stored; run {run_id} resumed")
        out.line(f"result: {to_json(summary['result'], indent=False)}")
    else:
        out.line(f"signal {name!r} stored for run {run_id}{_still_to_resume(note, options)}")


def _still_to_resume(note: SignalNote, options: str) -> str:
    """What a run the signal was stored for, and not resumed, still needs: a run that
    waits for it goes on once resumed (``options``: the --app and --store to give)."""
    from nestegg.cli.wait_words import resume_hint

    if not note.awaited:
        return ""
    how = resume_hint(note.run_id, options)
    if note.timed_out:
        return f"; its wait for it timed out: {how}"
    return f"; it waits for it: {how}"
