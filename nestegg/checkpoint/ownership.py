"""Who owns a run, and whether that owner is still alive.

On the owner's own host a run is interrupted as soon as its process is gone (the pid no
longer exists, or now belongs to a process started at another time). Elsewhere the
owner's lease decides: a heartbeat renews it, and once it has expired the run is
interrupted.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from pathlib import Path
from typing import Any

from nestegg.checkpoint.formats import opening_payload
from nestegg.checkpoint.records import Owner, RunRecord
from nestegg.constants import (
    INTERRUPTED,
    QUEUED,
    RUN_INTERRUPTED,
    RUN_RESUMED,
    RUN_STARTED,
    RUNNING,
)

# Runs this process is executing right now: run_id -> fence.
active_runs: dict[str, int] = {}


@cache
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return "noboot"


def host_id() -> str:
    """This machine: its host name and boot id."""
    return f"{socket.gethostname()}#{_boot_id()}"


def process_start_token(pid: int) -> str | None:
    """A token of when process ``pid`` started, None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return _pid_exists_token(pid)
    # Fields 3 (state) and 22 (starttime) count from the end of the parenthesised name.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # it has exited: a zombie only waits for its parent to reap it
        return None
    return fields[19]


def _pid_exists_token(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return "alive"
    return "alive"


_this_process: list[Owner] = []


def current_owner() -> Owner:
    """The owner record of this process (read from /proc once per process, not per run)."""
    pid = os.getpid()
    if not _this_process or _this_process[0].pid != pid:  # the first call, or a forked child
        started = process_start_token(pid) or "alive"
        _this_process[:] = [Owner(host=host_id(), pid=pid, started=started)]
    return _this_process[0]


def owner_alive(run: RunRecord, now: float) -> bool:
    """Whether the owner of a running run is still there to finish it."""
    owner = run.owner
    if run.status != RUNNING or owner is None:
        return False
    if owner.host == host_id():
        if owner.pid == os.getpid():
            return active_runs.get(run.run_id) == run.fence
        token = process_start_token(owner.pid)
        return token is not None and (token == owner.started or token == "alive")
    return run.lease_until is not None and run.lease_until > now


def is_interrupted(run: RunRecord, now: float) -> bool:
    """A run that is marked running but whose owner is gone."""
    return run.status == RUNNING and not owner_alive(run, now)


def run_state(run: RunRecord, now: float) -> str:
    """What ``run`` is at ``now`` as listings, ``show`` and a cancel name it: its stored
    status, or for a running run ``queued`` (no owner ever: stored for workers, none took
    it yet), ``interrupted`` (its owner is gone) or ``running``."""
    if run.status != RUNNING:
        return str(run.status)
    if is_queued(run):
        return QUEUED
    return INTERRUPTED if is_interrupted(run, now) else RUNNING


def is_queued(run: RunRecord) -> bool:
    """A run stored for workers that none took yet: running, no owner ever."""
    return run.status == RUNNING and run.owner is None


def owner_payload(owner: Owner | None) -> dict[str, Any] | None:
    """An owner as events name it: host, pid, process start (None: no owner)."""
    return {"host": owner.host, "pid": owner.pid, "started": owner.started} if owner else None


def interruption(run: RunRecord, *, released: bool = False) -> dict[str, Any]:
    """What a ``run_interrupted`` event says of a run whose owner is gone: that owner (host,
    pid, process start) and the steps it had committed; ``released`` when that owner gave
    the step under way back itself (a worker's drain) instead of dying in it."""
    payload = {"owner": owner_payload(run.owner), "steps": run.step_seq}
    if released:
        payload["released"] = True
    return payload


def resumption(
    run: RunRecord,
    checkpoint_id: str | None,
    seq: int,
    *,
    interrupted: bool,
    released: bool = False,
    trace: dict[str, str] | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """The events that open a resume of ``run`` (as read before it was claimed) from
    checkpoint ``checkpoint_id`` at step ``seq``: ``run_resumed``, after a
    ``run_interrupted`` naming the owner that died when the run was ``interrupted`` (a
    takeover), after a ``run_started`` (with ``trace``) when the run's log is empty (its
    owner died before writing it). A run ``released`` by its owner in a step (a worker's
    drain, which wrote its ``run_interrupted`` then) is resumed as an interrupted one,
    without a second ``run_interrupted``; a run queued for workers that none took (running,
    no owner ever) as a queued one, no owner having died in it."""
    resumed: dict[str, Any] = {"checkpoint_id": checkpoint_id, "seq": seq, "previous": run.status}
    events: list[tuple[str, dict[str, Any]]] = [(RUN_RESUMED, resumed)]
    if not released and is_queued(run):
        resumed["previous"] = QUEUED
    elif interrupted or released:
        lost = interruption(run)
        if not released:
            events.insert(0, (RUN_INTERRUPTED, lost))
        resumed["previous"] = INTERRUPTED
        resumed["previous_owner"] = lost["owner"]
    if run.event_seq == 0:
        events.insert(0, (RUN_STARTED, opening_payload(trace)))
    return events
