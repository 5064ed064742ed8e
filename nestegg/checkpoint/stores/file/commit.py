"""Applying one commit to a run's directory, so that a crash never leaves half of it.

A commit touches several files (the logs, checkpoint files, the index, run.json), which
no file system replaces at once. So the whole commit is first written to the run's
``pending-commit.json`` (atomically, fsynced): that write is the commit point. Then it is
applied, and the pending file removed. A commit cut short by a crash is found by the next
claim, commit or read of the run and applied again: applying is idempotent (readers keep
the last record of a seq, truncation and checkpoint files are rewritten whole, run fields
are set, not added). Everything runs under the run's lock.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from nestegg.checkpoint.records import CheckpointRecord, Commit, RunRecord
from nestegg.checkpoint.stores.common import ChangeSet, change_set, set_run_fields
from nestegg.checkpoint.stores.file.format import (
    checkpoint_file_name,
    checkpoint_files,
    decode_commit,
    decode_run,
    encode_checkpoint,
    encode_commit,
    encode_run,
    event_line,
    journal_line,
    read_log_lines,
    record_seq,
    step_line,
)
from nestegg.checkpoint.stores.file.io import append_durably, sync_directory, write_atomically
from nestegg.constants import (
    FILE_CHECKPOINTS_DIR,
    FILE_EVENTS_LOG,
    FILE_JOURNAL_LOG,
    FILE_PENDING_COMMIT,
    FILE_RUN,
    FILE_RUNS_DIR,
    FILE_STEPS_LOG,
)


def commit_durably(run_dir: Path, index: Path, commit: Commit, run: RunRecord) -> None:
    """Write ``commit`` as pending (the commit point), apply it to ``run``, drop the pending
    file. ``index`` is the store's checkpoint-index directory."""
    pending = run_dir / FILE_PENDING_COMMIT
    write_atomically(pending, encode_commit(commit))
    sync_directory(run_dir)
    apply_commit(run_dir, index, change_set(commit), run)
    pending.unlink()


def redo_pending_commit(run_dir: Path, index: Path) -> None:
    """Apply again a commit a crash cut short, if there is one."""
    pending = run_dir / FILE_PENDING_COMMIT
    try:
        data = pending.read_bytes()
    except FileNotFoundError:
        return
    run = decode_run((run_dir / FILE_RUN).read_bytes(), b"", run_dir / FILE_RUN)
    apply_commit(run_dir, index, change_set(decode_commit(data, pending)), run)
    pending.unlink()


def apply_commit(run_dir: Path, index: Path, changes: ChangeSet, run: RunRecord) -> None:
    """Apply ``changes`` in their order; ``run`` is the run row they update."""
    if changes.truncate_after is not None and changes.journal_after is not None:
        truncate_after(run_dir, index, changes.truncate_after, changes.journal_after)
    for name, lines in (
        (FILE_STEPS_LOG, [step_line(s) for s in changes.steps]),
        (FILE_EVENTS_LOG, [event_line(e) for e in changes.events]),
        (FILE_JOURNAL_LOG, [journal_line(j) for j in changes.journal]),
    ):
        if lines:
            append_durably(run_dir / name, b"".join(lines))
    write_checkpoints(run_dir, index, changes.checkpoints)
    remove_checkpoints(run_dir, index, changes.prune, written=bool(changes.checkpoints))
    set_run_fields(run, changes)
    write_run(run_dir, run)


def write_run(run_dir: Path, run: RunRecord) -> None:
    """Replace run.json durably."""
    write_atomically(run_dir / FILE_RUN, encode_run(run))
    sync_directory(run_dir)


def write_checkpoints(run_dir: Path, index: Path, checkpoints: Sequence[CheckpointRecord]) -> None:
    """Index entries first (durable; a dangling one is harmless), then the files."""
    if not checkpoints:
        return
    target = Path("..", FILE_RUNS_DIR, run_dir.name, FILE_CHECKPOINTS_DIR)
    for checkpoint in checkpoints:
        entry = index / checkpoint.checkpoint_id
        entry.unlink(missing_ok=True)
        entry.symlink_to(target / checkpoint_file_name(checkpoint.seq, checkpoint.checkpoint_id))
    sync_directory(index)
    folder = run_dir / FILE_CHECKPOINTS_DIR
    for checkpoint in checkpoints:
        path = folder / checkpoint_file_name(checkpoint.seq, checkpoint.checkpoint_id)
        write_atomically(path, encode_checkpoint(checkpoint))


def remove_checkpoints(
    run_dir: Path, index: Path, checkpoint_ids: Collection[str], *, written: bool = False
) -> int:
    """Delete the run's checkpoint files, make that (and files ``written`` just before)
    durable, then drop their index entries; how many went."""
    folder = run_dir / FILE_CHECKPOINTS_DIR
    gone = []
    if checkpoint_ids:
        wanted = set(checkpoint_ids)
        for name, (_, checkpoint_id) in checkpoint_files(folder).items():
            if checkpoint_id in wanted:
                (folder / name).unlink(missing_ok=True)
                gone.append(checkpoint_id)
    if gone or written:
        sync_directory(folder)
    for checkpoint_id in gone:
        (index / checkpoint_id).unlink(missing_ok=True)
    return len(gone)


def truncate_after(run_dir: Path, index: Path, after: int, journal_after: int) -> None:
    """Drop step records and checkpoints past step ``after`` and journal entries past step
    ``journal_after`` (steps.log is rewritten, and journal.log when it holds entries to
    drop)."""
    steps_log = run_dir / FILE_STEPS_LOG
    kept = [line for header, line in read_log_lines(steps_log) if record_seq(header) <= after]
    write_atomically(steps_log, b"".join(line + b"\n" for line in kept))
    _truncate_journal(run_dir / FILE_JOURNAL_LOG, journal_after)
    files = checkpoint_files(run_dir / FILE_CHECKPOINTS_DIR).values()
    remove_checkpoints(run_dir, index, [cid for seq, cid in files if seq > after])


def _truncate_journal(journal_log: Path, after: int) -> None:
    """Drop the entries of steps past ``after`` (unreadable lines stay, as in steps.log)."""
    try:
        lines = list(read_log_lines(journal_log))
    except FileNotFoundError:
        return
    kept = [line for header, line in lines if _journal_step(header) <= after]
    if len(kept) < len(lines):
        write_atomically(journal_log, b"".join(line + b"\n" for line in kept))


def _journal_step(header: dict[str, Any]) -> int:
    step = header.get("step")
    return step if isinstance(step, int) else -1
