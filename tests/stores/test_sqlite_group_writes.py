"""The SQLite store's group commits: a big batch on the worker thread in a few statements,
and batches that must be written commit by commit (see sqlite/group_writes.py)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.records import RunRecord
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.checkpoint.stores.sqlite import store as sqlite_store
from nestegg.constants import COMPLETED, SQLITE_INLINE_BATCH_COMMITS
from nestegg.testing.builders import (
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_journal,
    make_step,
)

RUNS = SQLITE_INLINE_BATCH_COMMITS + 8


def _step(run: RunRecord, seq: int, **fields: Any) -> Any:
    rid = run.run_id
    return make_commit(
        run,
        steps=[make_step(rid, seq)],
        events=[make_event(rid, seq)],
        checkpoints=[make_checkpoint(rid, seq)],
        step_seq=seq,
        event_seq=seq,
        **fields,
    )


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, list[str]]]:
    """Each batch written: (thread, commits, statements run for it)."""
    seen: list[tuple[int, int, list[str]]] = []
    inner = sqlite_store._commit_batch

    def recorded(conn: Any, commits: Any, *args: Any) -> Any:
        statements: list[str] = []
        seen.append((threading.get_ident(), len(commits), statements))
        conn.set_trace_callback(statements.append)
        try:
            return inner(conn, commits, *args)
        finally:
            conn.set_trace_callback(None)

    monkeypatch.setattr(sqlite_store, "_commit_batch", recorded)
    return seen


async def test_a_big_group_goes_to_the_worker_thread_in_a_few_statements(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"big-{i:02d}") for i in range(RUNS)]
    await asyncio.gather(*(store.commit(_step(run, 1)) for run in runs))
    [(thread, commits, statements)] = batches  # the first run's commit went alone
    assert thread != threading.get_ident() and commits == RUNS - 1
    # BEGIN, SAVEPOINT, the runs' update, steps, events, checkpoints, RELEASE, COMMIT.
    assert len(statements) == 8, statements
    for run in runs:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
        assert [e.seq for e in await store.read_events(run.run_id)] == [1]
        assert [c.seq for c in await store.list_checkpoints(run.run_id)] == [1]
        stored = await store.get_run(run.run_id)
        assert stored is not None and (stored.step_seq, stored.event_seq) == (1, 1)
    await store.close()


async def test_a_group_writes_journals_prunes_and_different_run_fields_together(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"mixed-{i:02d}") for i in range(RUNS)]
    first = [make_checkpoint(run.run_id, 1) for run in runs]
    for run, checkpoint in zip(runs, first, strict=True):
        await store.commit(
            make_commit(run, steps=[make_step(run.run_id, 1)], checkpoints=[checkpoint])
        )

    def second(index: int) -> Any:
        run = runs[index]
        if index % 3 == 1:  # a journaled step that prunes the first checkpoint
            journal = [make_journal(run.run_id, 2, 0), make_journal(run.run_id, 2, 1)]
            return _step(run, 2, journal=journal, prune=[first[index].checkpoint_id])
        if index % 3 == 2:  # the last step: the run completes
            return _step(run, 2, status=COMPLETED, result=b'{"done":true}')
        return _step(run, 2)

    batches.clear()
    await asyncio.gather(*(store.commit(second(i)) for i in range(RUNS)))
    assert [commits for _, commits, _ in batches] == [RUNS - 1]
    assert len(batches[0][2]) <= 12, batches[0][2]  # written together, not commit by commit
    for index, run in enumerate(runs):
        rid = run.run_id
        assert [s.seq for s in await store.load_steps(rid)] == [1, 2]
        kept = [c.seq for c in await store.list_checkpoints(rid)]
        assert kept == ([2] if index % 3 == 1 else [1, 2])
        journal = await store.read_journal(rid, 2)
        assert [j.position for j in journal] == ([0, 1] if index % 3 == 1 else [])
        stored = await store.get_run(rid)
        assert stored is not None and stored.step_seq == 2
        if index % 3 == 2:
            assert (stored.status, stored.result) == (COMPLETED, b'{"done":true}')
        else:
            assert (stored.status, stored.result) == (run.status, None)
    await store.close()


async def test_two_commits_of_one_run_in_a_group_land_in_order(
    tmp_path: Path, batches: list[tuple[int, int, list[str]]]
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    runs = [await create(store, run_id=f"twice-{i:02d}") for i in range(RUNS)]
    twice = runs[1]
    commits = [_step(runs[0], 1), _step(twice, 1), _step(twice, 2)]
    commits += [_step(run, 1) for run in runs[2:]]
    await asyncio.gather(*(store.commit(commit) for commit in commits))
    assert [n for _, n, _ in batches] == [RUNS]  # both of the run's commits in one batch
    assert [s.seq for s in await store.load_steps(twice.run_id)] == [1, 2]
    assert [c.seq for c in await store.list_checkpoints(twice.run_id)] == [1, 2]
    stored = await store.get_run(twice.run_id)
    assert stored is not None and stored.step_seq == 2
    for run in runs[2:]:
        assert [s.seq for s in await store.load_steps(run.run_id)] == [1]
    await store.close()
