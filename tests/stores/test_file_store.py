"""What only the file store does: readable files, torn and damaged records, identifiers
checked before the disk is touched, private modes, no temp files left, flock'ed writers."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest

from nestegg.checkpoint.codec import seal_json, unseal
from nestegg.checkpoint.records import CheckpointRecord, Commit, RunRecord
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.file import FileCheckpointStorage
from nestegg.checkpoint.stores.file.format import decode_record, encode_commit, encode_record
from nestegg.checkpoint.stores.threads import CHECKPOINT, KEY_END, ThreadChange, ThreadRow
from nestegg.constants import FILE_LEFTOVER_SECONDS, FILE_UNREADABLE_REASON
from nestegg.errors import (
    CheckpointCorruptedError,
    ConfigurationError,
    InvalidIdentifierError,
    StorageError,
    StorageUnavailableError,
)
from nestegg.testing.builders import (
    OWNER,
    commit_steps,
    create,
    make_checkpoint,
    make_commit,
    make_event,
    make_run,
    make_step,
)
from tests.stores.test_sqlite_store import REPO, finish, race_claims_in_processes, spawn


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id


def checkpoint_path(root: Path, checkpoint: CheckpointRecord) -> Path:
    """The file of one checkpoint: ``checkpoints/<seq, zero-padded>-<id>.json``."""
    name = f"{checkpoint.seq:010d}-{checkpoint.checkpoint_id}.json"
    return run_dir(root, checkpoint.run_id) / "checkpoints" / name


def cut_points(data: bytes) -> list[int]:
    """Offsets inside the last line of ``data`` (every one near its ends, a stride between)."""
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    end = len(data)
    inner = range(start + 1, end)
    return sorted({start + 1, *inner[:8], *inner[-8:], *inner[::7]})


# --- the files are readable ---------------------------------------------------------------


async def test_logs_are_json_lines_with_the_sealed_body_embedded(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 4), checkpoints=True)
    lines = (run_dir(tmp_path, run.run_id) / "steps.log").read_bytes().splitlines()
    assert [orjson.loads(line) for line in lines] == [
        {"seq": s.seq, "agent": s.agent, "body": orjson.loads(s.body)} for s in steps
    ]
    doc = orjson.loads((run_dir(tmp_path, run.run_id) / "run.json").read_bytes())
    assert (doc["run_id"], doc["step_seq"], doc["fence"]) == (run.run_id, 3, run.fence)
    for checkpoint in await store.list_checkpoints(run.run_id):
        path = checkpoint_path(tmp_path, checkpoint)
        assert orjson.loads(path.read_bytes())["body"] == orjson.loads(checkpoint.body)


def test_records_that_are_not_one_line_json_are_base64() -> None:
    for body in (b"\x00\xff raw", b'{"a":\n1}', b"", b"{", b'"\\ud800"'):
        line = encode_record({"seq": 1}, body)
        assert b"\n" not in line
        assert decode_record(line) == ({"seq": 1, "encoding": "base64"}, body)
    assert decode_record(encode_record({"seq": 2}, b'{"a":1}')) == ({"seq": 2}, b'{"a":1}')


def test_from_url() -> None:
    assert FileCheckpointStorage.from_url("file:///var/lib/x").root == Path("/var/lib/x")
    assert FileCheckpointStorage.from_url("file://./rel/dir").root == Path("rel/dir")
    assert isinstance(open_store("file:///tmp/a%20b"), FileCheckpointStorage)
    with pytest.raises(ConfigurationError):
        FileCheckpointStorage.from_url("file://")


# --- torn and damaged records -------------------------------------------------------------


async def test_a_torn_last_step_is_left_out_and_the_next_append_works(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 4))
    log_path = run_dir(tmp_path, run.run_id) / "steps.log"
    intact = log_path.read_bytes()
    for cut in cut_points(intact):
        log_path.write_bytes(intact[:cut])
        assert await store.load_steps(run.run_id) == steps[:2], cut
        await store.commit(make_commit(run, steps=[steps[2]]))
        assert await store.load_steps(run.run_id) == steps, cut
        assert log_path.read_bytes() == intact, cut


async def test_a_torn_last_event_is_left_out_and_the_next_append_works(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    await commit_steps(store, run, range(1, 4))
    events = await store.read_events(run.run_id)
    log_path = run_dir(tmp_path, run.run_id) / "events.log"
    intact = log_path.read_bytes()
    for cut in cut_points(intact):
        log_path.write_bytes(intact[:cut])
        assert await store.read_events(run.run_id) == events[:2], cut
        await store.commit(make_commit(run, events=[make_event(run.run_id, 3)]))
        assert await store.read_events(run.run_id) == events, cut
        assert log_path.read_bytes() == intact, cut


async def test_a_line_that_is_not_json_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 4))
    log_path = run_dir(tmp_path, run.run_id) / "steps.log"
    lines = log_path.read_bytes().splitlines(keepends=True)
    log_path.write_bytes(lines[0] + b"\x00\x01 not json at all\n" + lines[2])
    with caplog.at_level(logging.WARNING, logger="nestegg"):
        assert await store.load_steps(run.run_id) == [steps[0], steps[2]]
    assert "unreadable" in caplog.text


async def test_a_damaged_body_is_returned_as_it_is(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    steps = await commit_steps(store, run, range(1, 4))
    log_path = run_dir(tmp_path, run.run_id) / "steps.log"
    data = bytearray(log_path.read_bytes())
    second = data.index(b"\n") + 1
    flip = data.index(b'"data"', second)  # inside step 2's sealed body
    data[flip + 1] ^= 0x20
    log_path.write_bytes(bytes(data))
    loaded = await store.load_steps(run.run_id)
    assert [s.seq for s in loaded] == [1, 2, 3]
    assert (loaded[0], loaded[2]) == (steps[0], steps[2])
    with pytest.raises(CheckpointCorruptedError):
        unseal(loaded[1].body, "step 2")


async def test_garbage_in_a_checkpoint_file_comes_back_as_bytes(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    first, second = await store.list_checkpoints(run.run_id)
    path = checkpoint_path(tmp_path, second)
    garbage = b"\x00\xffnot a checkpoint{"
    path.write_bytes(garbage)
    got = await store.get_checkpoint(second.checkpoint_id)
    assert got is not None
    assert (got.checkpoint_id, got.run_id, got.seq) == (second.checkpoint_id, run.run_id, 2)
    assert got.body == garbage
    assert got.reason == FILE_UNREADABLE_REASON
    assert await store.list_checkpoints(run.run_id) == [first, got]  # still the newest
    with pytest.raises(CheckpointCorruptedError):
        unseal(got.body, "checkpoint")


async def test_a_flipped_byte_anywhere_in_a_checkpoint_file_keeps_its_place(
    tmp_path: Path,
) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    await commit_steps(store, run, range(1, 3), checkpoints=True)
    older, newest = await store.list_checkpoints(run.run_id)
    path = checkpoint_path(tmp_path, newest)
    intact = path.read_bytes()
    for offset in range(len(intact)):
        damaged = bytearray(intact)
        damaged[offset] ^= 0x01
        path.write_bytes(bytes(damaged))
        got = await store.get_checkpoint(newest.checkpoint_id)
        assert got is not None
        assert (got.checkpoint_id, got.run_id, got.seq) == (newest.checkpoint_id, run.run_id, 2)
        assert await store.list_checkpoints(run.run_id) == [older, got], offset
        if got.body != newest.body:  # else the flip hit the header's time or reason
            with pytest.raises(CheckpointCorruptedError):
                unseal(got.body, "checkpoint")


async def test_a_truncated_checkpoint_file_is_returned_not_raised(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    checkpoint = make_checkpoint(run.run_id, 1)
    await store.commit(make_commit(run, checkpoints=[checkpoint]))
    path = checkpoint_path(tmp_path, checkpoint)
    intact = path.read_bytes()
    for cut in range(len(intact) - 1):
        path.write_bytes(intact[:cut])
        got = await store.get_checkpoint(checkpoint.checkpoint_id)
        assert got is not None and got.checkpoint_id == checkpoint.checkpoint_id, cut
        assert got.body != checkpoint.body, cut
        with pytest.raises(CheckpointCorruptedError):
            unseal(got.body, "checkpoint")
        assert await store.list_checkpoints(run.run_id) == [got]
    path.write_bytes(intact)
    assert await store.get_checkpoint(checkpoint.checkpoint_id) == checkpoint


async def test_a_damaged_run_file_is_a_storage_error_not_a_json_error(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    (run_dir(tmp_path, run.run_id) / "run.json").write_bytes(b'{"run_id": "x", "fen')
    with pytest.raises(StorageError, match="damaged"):
        await store.get_run(run.run_id)
    with pytest.raises(StorageError, match="damaged"):
        await store.commit(make_commit(run, steps=[make_step(run.run_id, 1)]))


async def test_stray_files_among_the_runs_are_ignored(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    (tmp_path / "runs" / "notes.txt").write_text("a file that is not a run")
    (tmp_path / "runs" / "empty-dir").mkdir()
    assert await store.list_runs() == [run]


# --- a commit cut short by a crash is redone whole ---------------------------------------

CRASHING_CHILD = r"""
import asyncio, os, sys
from nestegg.checkpoint.stores.file import commit as file_commit
from nestegg.checkpoint.stores.file import FileCheckpointStorage
from nestegg.testing.builders import make_checkpoint, make_commit, make_event, make_step

def die(*args, **kwargs):
    os._exit(17)  # like SIGKILL: no cleanup, no flush

setattr(file_commit, sys.argv[2], die)

async def main():
    store = FileCheckpointStorage(sys.argv[1])
    run = await store.get_run("run-crash")
    await store.commit(make_commit(
        run, steps=[make_step("run-crash", 3)],
        events=[make_event("run-crash", 5), make_event("run-crash", 6)],
        checkpoints=[make_checkpoint("run-crash", 3, checkpoint_id="ckpt-3")],
        prune=["ckpt-1"], step_seq=3, event_seq=6, updated_at=123.0))

asyncio.run(main())
"""


@pytest.mark.parametrize(
    "dies_in", ["apply_commit", "write_checkpoints", "remove_checkpoints", "write_run"]
)
async def test_a_commit_cut_short_by_a_crash_is_redone_whole(tmp_path: Path, dies_in: str) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store, run_id="run-crash")
    rid = run.run_id
    for seq in (1, 2):
        await store.commit(
            make_commit(
                run,
                steps=[make_step(rid, seq)],
                events=[make_event(rid, 2 * seq - 1), make_event(rid, 2 * seq)],
                checkpoints=[make_checkpoint(rid, seq, checkpoint_id=f"ckpt-{seq}")],
                step_seq=seq,
                event_seq=2 * seq,
            )
        )
    child = subprocess.run(
        [sys.executable, "-c", CRASHING_CHILD, str(tmp_path), dies_in],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 17, child.stderr
    assert (run_dir(tmp_path, rid) / "pending-commit.json").exists()

    stored = await store.get_run(rid)  # redoes the pending commit first
    assert stored is not None
    assert (stored.step_seq, stored.event_seq, stored.updated_at) == (3, 6, 123.0)
    assert not (run_dir(tmp_path, rid) / "pending-commit.json").exists()
    assert await store.load_steps(rid) == [make_step(rid, seq) for seq in (1, 2, 3)]
    assert await store.read_events(rid) == [make_event(rid, seq) for seq in range(1, 7)]
    assert [c.checkpoint_id for c in await store.list_checkpoints(rid)] == ["ckpt-2", "ckpt-3"]
    assert await store.get_checkpoint("ckpt-1") is None
    await store.commit(make_commit(stored, events=[make_event(rid, 7)], event_seq=7))
    assert [e.seq for e in await store.read_events(rid)] == list(range(1, 8))


async def test_a_claim_redoes_a_pending_commit_before_it_moves_the_fence(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    pending = make_commit(run, steps=[make_step(run.run_id, 1)], step_seq=1)
    (run_dir(tmp_path, run.run_id) / "pending-commit.json").write_bytes(encode_commit(pending))
    claimed = await store.claim_run(run.run_id, run.fence, OWNER, 9.0, 8.0)
    assert (claimed.fence, claimed.step_seq) == (run.fence + 1, 1)
    assert await store.load_steps(run.run_id) == [make_step(run.run_id, 1)]


# --- identifiers are checked before the disk is touched -----------------------------------

BAD_IDS = ["../escape", "a/b", "a\\b", "..", ".", "", "x..y", "nul\0", "line\nbreak", "x" * 201]


@pytest.mark.parametrize("bad", BAD_IDS)
async def test_invalid_run_ids_are_refused_and_nothing_is_created(tmp_path: Path, bad: str) -> None:
    root = tmp_path / "store"
    store = FileCheckpointStorage(root)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.create_run(dataclasses.replace(make_run(), run_id=bad)),
        lambda: store.get_run(bad),
        lambda: store.claim_run(bad, 1, OWNER, 1.0, 1.0),
        lambda: store.commit(Commit(run_id=bad, fence=1, steps=[make_step(bad, 1)])),
        lambda: store.load_steps(bad),
        lambda: store.list_checkpoints(bad),
        lambda: store.read_events(bad),
        lambda: store.read_journal(bad, 1),
        lambda: store.delete_run(bad),
        lambda: store.delete_checkpoints(bad, ["c"]),
    ]
    for call in calls:
        with pytest.raises(InvalidIdentifierError):
            await call()
    assert await store.get_checkpoint(bad) is None
    assert not root.exists()
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("bad", ["../x", "a/b", ".."])
async def test_invalid_checkpoint_ids_are_refused(tmp_path: Path, bad: str) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store)
    bad_checkpoint = make_checkpoint(run.run_id, 1, checkpoint_id=bad)
    with pytest.raises(InvalidIdentifierError):
        await store.commit(make_commit(run, checkpoints=[bad_checkpoint]))
    with pytest.raises(InvalidIdentifierError):
        await store.commit(make_commit(run, prune=[bad]))
    with pytest.raises(InvalidIdentifierError):
        await store.delete_checkpoints(run.run_id, [bad])
    assert await store.get_checkpoint(bad) is None
    assert await store.get_run(run.run_id) == run
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs" / "x").exists()


# --- modes, temp files, layout ------------------------------------------------------------


async def _busy_store(root: Path) -> tuple[FileCheckpointStorage, RunRecord]:
    """A store with a run that went through checkpoints, pruning, truncation and deletion."""
    store = FileCheckpointStorage(root)
    run = await create(store)
    await commit_steps(store, run, range(1, 6), checkpoints=True)
    old = [c.checkpoint_id for c in await store.list_checkpoints(run.run_id)]
    await store.commit(make_commit(run, prune=old[:2], truncate_after=4, result=seal_json(1)))
    await store.claim_run(run.run_id, run.fence, OWNER, 2.0, 1.0)
    gone = await create(store)
    await commit_steps(store, gone, range(1, 3), checkpoints=True)
    await store.delete_run(gone.run_id)
    return store, run


async def test_files_are_0600_and_directories_0700(tmp_path: Path) -> None:
    root = tmp_path / "store"
    await _busy_store(root)
    seen = 0
    for directory, _dirs, files in os.walk(root):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
        for name in files:
            path = Path(directory, name)
            if not path.is_symlink():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
                seen += 1
    assert seen >= 8


async def test_no_temp_files_are_left_behind(tmp_path: Path) -> None:
    store, run = await _busy_store(tmp_path)
    names = [Path(d, n) for d, _, files in os.walk(tmp_path) for n in files]
    assert not [p for p in names if p.name.endswith(".tmp") or p.name.startswith(".")]
    assert os.listdir(tmp_path / "staging") == []
    assert os.listdir(tmp_path / "trash") == []
    assert os.listdir(tmp_path / "runs") == [run.run_id]
    index = sorted(os.listdir(tmp_path / "checkpoint-index"))
    assert index == sorted(c.checkpoint_id for c in await store.list_checkpoints(run.run_id))


async def test_old_leftovers_of_crashes_are_removed_on_setup(tmp_path: Path) -> None:
    await FileCheckpointStorage(tmp_path).setup()
    old, fresh = tmp_path / "staging" / "tmp-old", tmp_path / "trash" / "tmp-fresh"
    for leftover in (old, fresh):
        (leftover / "runs-x").mkdir(parents=True)
        (leftover / "runs-x" / "run.json").write_text("{}")
    long_ago = time.time() - 2 * FILE_LEFTOVER_SECONDS
    os.utime(old, (long_ago, long_ago))
    await FileCheckpointStorage(tmp_path).setup()
    assert not old.exists()
    assert fresh.exists()  # perhaps another process's deletion in progress


async def test_an_unwritable_root_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    store = FileCheckpointStorage(tmp_path / "file" / "store")
    with pytest.raises(StorageUnavailableError):
        await store.create_run(make_run())


# --- several processes ------------------------------------------------------------------


async def test_a_claim_race_between_processes_has_one_winner(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run_ids = [f"run-race-{i}" for i in range(5)]
    for run_id in run_ids:
        await create(store, run_id=run_id)
    outcomes = race_claims_in_processes(f"file://{tmp_path}", run_ids)
    assert all(sorted(o) == ["locked", "won"] for o in outcomes.values()), outcomes
    for run_id in run_ids:
        stored = await store.get_run(run_id)
        assert stored is not None and stored.fence == 2


async def test_two_processes_appending_to_one_run_never_tear_a_line(tmp_path: Path) -> None:
    store = FileCheckpointStorage(tmp_path)
    run = await create(store, run_id="run-shared")
    halves = [",".join(str(s) for s in range(first, 121, 2)) for first in (1, 2)]
    start = f"{time.time() + 1.5:.6f}"
    url = f"file://{tmp_path}"
    finish([spawn("commit", url, run.run_id, half, start) for half in halves])
    assert await store.load_steps(run.run_id) == [make_step(run.run_id, s) for s in range(1, 121)]
    for name in ("steps.log", "events.log"):
        lines = (run_dir(tmp_path, run.run_id) / name).read_bytes().split(b"\n")
        assert lines.pop() == b""
        assert len(lines) == 120 and all(orjson.loads(line) for line in lines)


# --- ids that do not fit in a file name -----------------------------------------------

LONG_IN_BYTES = "é" * 128  # 128 characters (allowed), 256 bytes in UTF-8 (one too many)


async def test_an_id_too_long_for_a_file_name_is_refused_when_the_run_starts(
    tmp_path: Path,
) -> None:
    from nestegg import Clutch
    from nestegg.checkpoint import CheckpointConfig

    root = tmp_path / "store"
    clutch = Clutch("p", checkpoint=CheckpointConfig(storage=FileCheckpointStorage(root)))
    calls: list[str] = []

    @clutch.agent()
    async def first(data: str) -> str:
        calls.append(data)
        return data

    with pytest.raises(InvalidIdentifierError, match="256 bytes long in UTF-8; the file store"):
        await clutch.run("x", run_id=LONG_IN_BYTES)
    assert calls == []  # refused before any step ran
    assert not (root / "runs").exists() or os.listdir(root / "runs") == []
    assert await clutch.run("x", run_id="é" * 127) == "x"  # 254 bytes fit
    await clutch.stop()


async def test_a_long_id_fits_in_the_other_stores(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    await store.create_run(dataclasses.replace(make_run(), run_id=LONG_IN_BYTES))
    assert (await store.get_run(LONG_IN_BYTES)) is not None
    await store.close()


def test_a_file_is_refused_when_the_store_is_built(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    with pytest.raises(ConfigurationError) as refused:
        FileCheckpointStorage(tmp_path / "plain")
    assert str(refused.value) == (
        f"FileCheckpointStorage path {str(tmp_path / 'plain')!r} is a file: it needs the path "
        "of a directory"
    )


# --- LangGraph thread logs ----------------------------------------------------------------


async def test_a_thread_log_removed_and_written_anew_is_read_anew_by_another_handle(
    tmp_path: Path,
) -> None:
    """A handle remembers how far it read a thread's log. Once another removes the log and
    writes a new one (which may take the old one's inode), the handle reads the new log
    from its start, not on from where it had stopped in the old one."""
    reader, writer = FileCheckpointStorage(tmp_path), FileCheckpointStorage(tmp_path)
    old = [ThreadRow(CHECKPOINT, "a", b"old")]
    await writer.apply_thread_change("t", ThreadChange(put=old), 1.0)
    assert await reader.scan_thread_rows("t", CHECKPOINT, "", KEY_END) == old
    for n in range(3):
        assert await writer.delete_threads(["t"]) == 1
        new = [ThreadRow(CHECKPOINT, key, b"new" * 40 * n) for key in "bcd"]
        await writer.apply_thread_change("t", ThreadChange(put=new), 1.0)
        assert await reader.scan_thread_rows("t", CHECKPOINT, "", KEY_END) == new
