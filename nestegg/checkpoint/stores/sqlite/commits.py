"""How the SQLite store writes a commit: alone, or many runs' commits in one transaction.

A commit alone (:func:`commit_alone`) is one transaction whose fenced update of the run's
row doubles as the fence check. A group commit's batch (:func:`commit_batch`) writes the
commits that can go together in a few multi-row statements
(:mod:`~nestegg.checkpoint.stores.sqlite.group_writes`) and the others one by one, each in
a savepoint of its own, so that a commit whose fence moved on fails alone; a batch whose
commits all go together, in a transaction of its own, needs no savepoint.
:func:`write_size` tells the store where a commit may run (the loop thread or the worker).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.common import (
    ChangeSet,
    change_set,
    commit_outcome,
    run_not_found,
    stale_fence,
)
from nestegg.checkpoint.stores.group import Outcome
from nestegg.checkpoint.stores.sqlite.blocks import (
    blocks_completed,
    pack_completed_blocks,
    truncate_steps,
)
from nestegg.checkpoint.stores.sqlite.errors import is_busy, storage_error
from nestegg.checkpoint.stores.sqlite.events import pack_events
from nestegg.checkpoint.stores.sqlite.group_writes import (
    Unmatched,
    writable_together,
    write_together,
)
from nestegg.checkpoint.stores.sqlite.schema import (
    CHECKPOINTS,
    DELETE_CHECKPOINT,
    DELETE_JOURNAL_AFTER,
    INSERT_CHECKPOINT,
    INSERT_EVENT_BATCH,
    INSERT_JOURNAL,
    INSERT_STEP,
    KEY_AND_FENCE_OF,
    MAX_SEQ,
    RUNS,
    SEQ_SPAN,
    ids_per_query,
    marks,
    update_run,
    write_transaction,
)
from nestegg.constants import SQLITE_INLINE_WRITE_BYTES, STEP_BLOCK_STEPS
from nestegg.errors import NestEggError, StorageError


def _seq(seq: int, changes: ChangeSet) -> int:
    if not 0 < seq <= MAX_SEQ:
        raise StorageError(
            f"run {changes.run_id!r}: sequence number {seq} is outside what the SQLite store "
            f"keeps (1 to {MAX_SEQ})"
        )
    return seq


def commit_alone(conn: sqlite3.Connection, commit: Commit, run_keys: dict[str, int]) -> None:
    """The hot path: one transaction; the fenced row update doubles as the fence check and
    as the check of the run's key, remembered in ``run_keys`` (a run deleted and created
    again under its id gets a new key)."""
    with write_transaction(conn):
        _apply(conn, commit, run_keys)


def commit_batch(
    conn: sqlite3.Connection, commits: Sequence[Commit], run_keys: dict[str, int], path: str
) -> list[Outcome]:
    """Commits of many runs in one transaction, each fenced on its own: most in a few
    statements (see group_writes), the others commit by commit.

    When all of them may go together (the usual batch on the worker thread, which begins
    its own transaction), the transaction holds only their statements: no savepoint, two
    statements fewer, each of which, on the worker thread, waits to take the GIL back from
    the busy loop. If one run's row does not match, that transaction is undone whole and
    the batch is written again commit by commit (a lock held elsewhere is no such case: its
    error is the batch's, as the busy timeout has been waited for already)."""
    changes = [change_set(commit) for commit in commits]
    chosen = writable_together(changes)
    if len(chosen) == len(commits) > 1 and not conn.in_transaction:
        try:
            with write_transaction(conn):
                write_together(conn, changes)
            return [None] * len(commits)
        except sqlite3.Error as exc:
            if is_busy(exc):
                raise
            chosen = []  # undone: each commit on its own below tells its outcome
        except (Unmatched, NestEggError):
            chosen = []
    outcomes: list[Outcome] = [None] * len(commits)
    with write_transaction(conn):
        written = _written_together(conn, changes, chosen)
        rest = [index for index in range(len(commits)) if index not in written]
        if rest:
            apart = _commit_apart(conn, [commits[index] for index in rest], run_keys, path)
            for index, outcome in zip(rest, apart, strict=True):
                outcomes[index] = outcome
    return outcomes


def _written_together(
    conn: sqlite3.Connection, changes: Sequence[ChangeSet], chosen: list[int]
) -> set[int]:
    """The indexes of the ``chosen`` changes, written in a few statements (see
    group_writes) in a savepoint: none if fewer than two are chosen, or one of them did not
    match."""
    if len(chosen) < 2:
        return set()
    conn.execute("SAVEPOINT together")
    try:
        write_together(conn, [changes[index] for index in chosen])
    except (Unmatched, NestEggError, sqlite3.Error):
        conn.execute("ROLLBACK TO together")
        chosen = []
    conn.execute("RELEASE together")
    return set(chosen)


def _commit_apart(
    conn: sqlite3.Connection, commits: Sequence[Commit], run_keys: dict[str, int], path: str
) -> list[Outcome]:
    """Commits written one after the other, inside the caller's transaction.

    The keys and fences of all their runs are read first, in one statement: a commit whose
    run is gone or whose fence moved on is left out with its error, and the others are
    written one after the other. A commit that fails while written (rare: a record the
    store cannot keep) has them undone and written again, each commit in a savepoint of
    its own, so that it fails alone."""
    found = _keys_and_fences(conn, {commit.run_id for commit in commits})
    outcomes = [_fence_outcome(commit, found) for commit in commits]
    conn.execute("SAVEPOINT batch")
    try:
        for commit, outcome in zip(commits, outcomes, strict=True):
            if outcome is None:
                run_keys[commit.run_id] = found[commit.run_id][0]
                _apply(conn, commit, run_keys)
    except (NestEggError, sqlite3.Error):
        conn.execute("ROLLBACK TO batch")
        outcomes = _commit_each(conn, commits, run_keys, path)
    conn.execute("RELEASE batch")
    return outcomes


def _keys_and_fences(conn: sqlite3.Connection, run_ids: set[str]) -> dict[str, tuple[int, int]]:
    """``run_id -> (run_key, fence)`` of those of ``run_ids`` that exist."""
    found: dict[str, tuple[int, int]] = {}
    ids = list(run_ids)
    most = ids_per_query(conn)
    for start in range(0, len(ids), most):
        chunk = ids[start : start + most]
        query = f"SELECT run_id, run_key, fence FROM {RUNS} WHERE run_id IN ({marks(len(chunk))})"
        for run_id, key, fence in conn.execute(query, chunk):
            found[run_id] = (int(key), int(fence))
    return found


def _fence_outcome(commit: Commit, found: dict[str, tuple[int, int]]) -> Outcome:
    """The error of ``commit`` if its run is gone or its fence moved on, else None."""
    key_and_fence = found.get(commit.run_id)
    return commit_outcome(commit, None if key_and_fence is None else key_and_fence[1])


def _commit_each(
    conn: sqlite3.Connection, commits: Sequence[Commit], run_keys: dict[str, int], path: str
) -> list[Outcome]:
    """``commits`` each in a savepoint of its own: one that fails is undone alone and its
    error is its outcome."""
    outcomes: list[Outcome] = []
    for commit in commits:
        conn.execute("SAVEPOINT one_commit")
        try:
            _apply(conn, commit, run_keys)
        except (NestEggError, sqlite3.Error) as exc:
            conn.execute("ROLLBACK TO one_commit")
            outcomes.append(storage_error(exc, path) if isinstance(exc, sqlite3.Error) else exc)
        else:
            outcomes.append(None)
        conn.execute("RELEASE one_commit")
    return outcomes


def write_size(commit: Commit) -> tuple[int, bool]:
    """About how many bytes ``commit`` writes, and whether it may run on the loop thread."""
    size = commit.size()
    small = commit.truncate_after is None and size <= SQLITE_INLINE_WRITE_BYTES
    if packing := len(blocks_completed(commit.steps)):  # rewrites a block: on the worker
        small = False  # (its size is not known before it is read)
        size += 2 * packing * STEP_BLOCK_STEPS * max(len(s.body) for s in commit.steps)
    return size, small


def _apply(conn: sqlite3.Connection, commit: Commit, run_keys: dict[str, int]) -> None:
    """One commit's writes, inside the caller's transaction."""
    changes = change_set(commit)
    run_id = changes.run_id
    update = update_run(tuple(changes.run_fields))
    fields = (*changes.run_fields.values(), run_id, changes.fence)
    key = run_keys.get(run_id)
    if key is None or conn.execute(update, (*fields, key)).rowcount == 0:
        key = run_keys[run_id] = _run_key(conn, changes)
        conn.execute(update, (*fields, key))
    base = key * SEQ_SPAN
    if changes.truncate_after is not None and changes.journal_after is not None:
        after = changes.truncate_after
        truncate_steps(conn, run_id, base, after)
        conn.execute(DELETE_JOURNAL_AFTER, (run_id, changes.journal_after))
        conn.execute(f"DELETE FROM {CHECKPOINTS} WHERE run_id = ? AND seq > ?", (run_id, after))
    _append(conn, changes, base)
    pack_completed_blocks(conn, run_id, changes.steps, base)
    for checkpoint_id in changes.prune:
        conn.execute(DELETE_CHECKPOINT, (checkpoint_id, run_id))


def _run_key(conn: sqlite3.Connection, changes: ChangeSet) -> int:
    """The key of the changes' run, if their fence is the run's."""
    found = conn.execute(KEY_AND_FENCE_OF, (changes.run_id,)).fetchone()
    if found is None:
        raise run_not_found(changes.run_id)
    key, fence = found
    if fence != changes.fence:
        raise stale_fence(changes.run_id, fence, changes.fence)
    return int(key)


def _append(conn: sqlite3.Connection, changes: ChangeSet, base: int) -> None:
    run_id = changes.run_id
    for step in changes.steps:
        conn.execute(INSERT_STEP, (base + _seq(step.seq, changes), step.agent, step.body))
    if changes.events:
        events = changes.events
        last_seq = _seq(max(event.seq for event in events), changes)
        conn.execute(INSERT_EVENT_BATCH, (base + last_seq, pack_events(events)))
    if changes.journal:
        conn.executemany(
            INSERT_JOURNAL, [(run_id, j.step, j.position, j.body) for j in changes.journal]
        )
    for c in changes.checkpoints:
        conn.execute(
            INSERT_CHECKPOINT, (c.checkpoint_id, run_id, c.seq, c.created_at, c.reason, c.body)
        )


__all__ = ["commit_alone", "commit_batch", "write_size"]
