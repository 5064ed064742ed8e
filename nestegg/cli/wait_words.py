"""How the commands word a wait: what a waiting run waits for, whether that wait is over
(its signal stored by the deadline, its deadline or timer passed: the run only needs
resuming), and the command that resumes it. ``runs``, ``show``, ``signal``, ``resume``
and ``recover`` word it from here, and the inspector's pages read a wait with
:func:`add_wait`; the inspector's live views keep what they read of a wait between
looks and judge it over the same way (its signal stored, or its deadline passed: a
signal stored late is past the deadline too)."""

from __future__ import annotations

import shlex
from typing import Any

import typer

from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.views import to_datetime
from nestegg.checkpoint.waiting import signal_in_time, wait_due, wait_known
from nestegg.cli.app import explicit_store, store_url
from nestegg.cli.render import when
from nestegg.urls import without_password


async def add_wait(
    store: CheckpointStorage, run: RunRecord, row: dict[str, Any], now: float
) -> None:
    """Fill in a waiting run's row what it waits for: the signal (None: a timer) and the
    deadline (None: none), and whether that wait is over at ``now``, so that the run only
    needs resuming (:func:`wait_is_over`): ``received`` (its signal is stored by the
    deadline: the wait gets it) and ``due`` (its deadline or timer passed). What the
    command and the web inspector say of a wait both come from here. Reads a few of the
    run's last events and, for a signal, its signals: two reads per waiting run, none for
    another. ``{"unreadable": why, "deadline": …, "due": …}`` when what it waits for
    cannot be read (its ``run_waiting`` event, or its last events, are damaged): no
    timer, and its deadline, known from the run, still ends the wait."""
    wait = await wait_known(store, run)
    if wait is None:
        return
    deadline, due = to_datetime(wait.deadline), wait_due(run, now)
    if wait.unreadable is not None:
        row["waits_for"] = {"unreadable": wait.unreadable, "deadline": deadline, "due": due}
        return
    received = wait.signal is not None and await signal_in_time(
        store, run.run_id, wait.signal, wait.deadline
    )
    row["waits_for"] = {
        "signal": wait.signal,
        "deadline": deadline,
        "received": received,
        "due": due,
    }


def wait_is_over(wait: dict[str, Any] | None) -> bool:
    """Whether a row's ``waits_for`` (:func:`add_wait`) says its wait is over: the run goes
    on once resumed (by ``nestegg resume``, ``recover`` or a worker's sweep)."""
    return bool(wait and (wait.get("received") or wait.get("due")))


def wait_text(wait: dict[str, Any]) -> str:
    """What a waiting run waits for: ``signal 'approval' until <when>``, or its timer;
    once that wait is over (see :func:`add_wait`), that the run only needs
    resuming (``signal 'approval' received: resume it``); ``something unknown`` when
    that cannot be read (never a timer: :func:`unreadable_text` says why), its deadline
    still said. Short enough for a table cell."""
    if "unreadable" in wait:
        return _unknown_text(wait)
    signal, deadline = wait["signal"], wait["deadline"]
    if wait.get("received"):
        return f"signal {signal!r} received: resume it"
    if wait.get("due"):
        if signal is None:
            return f"timer due since {when(deadline)}: resume it"
        return f"no signal {signal!r} by its deadline: resume it"
    what = f"signal {signal!r}" if signal is not None else "timer"
    return f"{what} until {when(deadline)}" if deadline else what


def _unknown_text(wait: dict[str, Any]) -> str:
    what, deadline = "something unknown", wait.get("deadline")
    if wait.get("due"):
        return f"{what}, its deadline passed: resume it"
    return f"{what} until {when(deadline)}" if deadline else what


def unreadable_text(wait: dict[str, Any] | None) -> str | None:
    """Why what a waiting run waits for cannot be read (its row's ``waits_for``, see
    :func:`add_wait`), in the words of ``show`` and of the errors of ``resume`` and
    ``recover``; None when it can."""
    why = wait.get("unreadable") if wait else None
    return (
        None
        if why is None
        else f"what it waits for cannot be read (its event log is damaged: {why})"
    )


APP_PLACEHOLDER = "--app MODULE:CLUTCH"
"""The --app of the pipeline's Clutch, in a command a reading command suggests."""


def app_placeholder(ctx: typer.Context, store: str | None) -> str:
    """The options of a command that runs the pipeline, for a reading command that knows
    no Clutch: :func:`placeholder_options` with the --store given."""
    return placeholder_options(store_url(ctx, store) if explicit_store(ctx, store) else None)


def placeholder_options(url: str | None) -> str:
    """:data:`APP_PLACEHOLDER`, and ``--store url`` (its password left out) unless None."""
    if url:
        return f"{APP_PLACEHOLDER} --store {shlex.quote(without_password(url))}"
    return APP_PLACEHOLDER


def resume_hint(run_id: str, options: str) -> str:
    """How a waiting run whose wait is over goes on (``options``: its --app and --store)."""
    return (
        f"resume it with nestegg resume {shlex.quote(run_id)} {options} (or nestegg recover "
        f"{options}), or a worker of its pipeline takes it"
    )


NAMED_AT_MOST = 10
"""Runs a note of ``runs`` names at most; it counts the others."""


def named_some(run_ids: list[str]) -> str:
    """``run_ids`` joined, the first :data:`NAMED_AT_MOST` of them and how many more."""
    named = ", ".join(run_ids[:NAMED_AT_MOST])
    more = len(run_ids) - NAMED_AT_MOST
    return f"{named} and {more:,} more" if more > 0 else named
