"""LangGraph thread rows of the file store: a log per thread, in a directory of its own.

``{root}/lg-threads/{thread id as hex}.log`` holds one JSON line per change (deletes,
rows to add, rows to replace, its time; bodies in base64), appended and fsynced under an
exclusive lock, so a change is there whole or (a torn last line, cut off) not at all; a
change that leaves the thread without rows removes its log. A read replays the log (only
the lines added since the last read of the same file: the first line of a log starts with
a random tag, ``g``, which tells a new log from the one read before); a log that holds
mostly replaced or deleted rows is rewritten (atomically) on a write. A thread id whose hex
would make too long a file name (over 125 bytes of UTF-8) names its log
``~{sha256 of the id}.log`` instead, and each of its lines carries the id.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import secrets
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from nestegg.checkpoint.stores.file.io import (
    append_durably,
    make_private_dirs,
    same_file,
    sync_directory,
    write_atomically,
)
from nestegg.checkpoint.stores.file.root import FileRoot
from nestegg.checkpoint.stores.memory_threads import (
    Rows,
    apply_change,
    rows_with_keys,
    scan_rows,
)
from nestegg.checkpoint.stores.threads import ThreadChange, ThreadInfo, ThreadRow

THREADS_DIR = "lg-threads"
LOG_SUFFIX = ".log"
HASHED_MARK = "~"
"""Starts the name of a log named by the hash of its thread id (hex never holds it)."""
NAME_MAX = 255
"""The longest file name (bytes) of common file systems (ext4, XFS, APFS, btrfs)."""
COMPACT_MIN_BYTES = 1 << 20
"""A log is rewritten once it is this large and at least twice its live rows."""
HEAD_BYTES = 64
"""The start of a log a handle keeps to tell it from a new log at the same inode: it holds
the random tag of the log's first line."""


@dataclass
class _State:
    rows: Rows = field(default_factory=dict)
    updated_at: float = 0.0
    offset: int = 0
    inode: int = -1
    live_bytes: int = 0
    head: bytes = b""


def _continues(fd: int, stat: os.stat_result, state: _State) -> bool:
    """Whether the log open as ``fd`` is the one ``state`` was read from, grown since: the
    same inode, no shorter, the same start (a new log may take a removed one's inode)."""
    if state.inode != stat.st_ino or stat.st_size < state.offset:
        return False
    return os.pread(fd, len(state.head), 0) == state.head


def _log_name(thread_id: str) -> str:
    """The file name of a thread's log: its id as hex, or, when that is too long, a hash."""
    name = thread_id.encode().hex() + LOG_SUFFIX
    if len(name) <= NAME_MAX:
        return name
    return HASHED_MARK + hashlib.sha256(thread_id.encode()).hexdigest() + LOG_SUFFIX


def _is_hashed(thread_id: str) -> bool:
    return _log_name(thread_id).startswith(HASHED_MARK)


def _encode(change: ThreadChange, now: float, thread_id: str, *, first: bool = False) -> bytes:
    """The log line of ``change``; the ``first`` of a log starts with a random tag."""

    def rows(items: Sequence[ThreadRow]) -> list[list[str]]:
        return [[r.kind, r.key, base64.b64encode(r.body).decode()] for r in items]

    record: dict[str, Any] = {"g": secrets.token_hex(8)} if first else {}
    record |= {"t": now, "d": [list(d) for d in change.delete]}
    if _is_hashed(thread_id):
        record["id"] = thread_id
    record |= {"n": rows(change.put_new), "p": rows(change.put)}
    return orjson.dumps(record) + b"\n"


def _replay(state: _State, line: bytes) -> None:
    record: dict[str, Any] = orjson.loads(line)

    def rows(items: list[list[str]]) -> list[ThreadRow]:
        return [ThreadRow(kind, key, base64.b64decode(body)) for kind, key, body in items]

    change = ThreadChange(rows(record["p"]), rows(record["n"]), [tuple(d) for d in record["d"]])
    apply_change(state.rows, change)
    if change.writes:  # a line that only deletes is no write of the thread
        state.updated_at = record["t"]


class FileThreadRows(FileRoot):
    """The :class:`~nestegg.checkpoint.stores.threads.ThreadStore` capability in files."""

    __states: dict[str, _State]
    __lock: threading.Lock

    def _thread_states(self) -> dict[str, _State]:
        try:
            return self.__states
        except AttributeError:
            self.__states, self.__lock = {}, threading.Lock()
            return self.__states

    def _threads_dir(self) -> Path:
        return self.root / THREADS_DIR

    def _thread_path(self, thread_id: str) -> Path:
        return self._threads_dir() / _log_name(thread_id)

    def _read(self, thread_id: str) -> _State:
        """The thread's rows as its log holds them now (empty if there is none)."""
        states = self._thread_states()
        with self.__lock:
            path = self._thread_path(thread_id)
            try:
                with open(path, "rb") as f:
                    stat = os.fstat(f.fileno())
                    state = states.get(thread_id)
                    if state is None or not _continues(f.fileno(), stat, state):
                        state = _State(inode=stat.st_ino)
                    f.seek(state.offset)
                    data = f.read()
            except FileNotFoundError:
                states.pop(thread_id, None)
                return _State()
            if not state.offset:
                state.head = data[:HEAD_BYTES]
            end = data.rfind(b"\n") + 1  # a torn last line is not read
            for line in data[:end].splitlines():
                _replay(state, line)
            state.offset += end
            state.live_bytes = sum(len(b) for b in state.rows.values())
            states[thread_id] = state
            return state

    def _apply(self, thread_id: str, change: ThreadChange, now: float) -> None:
        path = self._thread_path(thread_id)
        if not change.writes and not path.exists():
            return  # deletes in a thread without rows: nothing to change
        make_private_dirs(self._threads_dir())
        while True:
            with open(path, "ab") as lock:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                if same_file(lock.fileno(), path):
                    self._apply_locked(path, thread_id, change, now)
                    return
            # the log was removed (emptied, deleted) or rewritten while this waited: again

    def _apply_locked(self, path: Path, thread_id: str, change: ThreadChange, now: float) -> None:
        existed = path.stat().st_size > 0
        append_durably(path, _encode(change, now, thread_id, first=not existed))
        if not existed:
            sync_directory(path.parent)
        state = self._read(thread_id)
        if not state.rows:  # emptied by its deletes: no log left behind
            path.unlink()
            self._thread_states().pop(thread_id, None)
            sync_directory(path.parent)
        elif state.offset > COMPACT_MIN_BYTES and state.offset > 3 * state.live_bytes:
            snapshot = [ThreadRow(k, key, body) for (k, key), body in state.rows.items()]
            snapshot_change = ThreadChange(put=snapshot)
            line = _encode(snapshot_change, state.updated_at, thread_id, first=True)
            write_atomically(path, line)
            sync_directory(path.parent)

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        """See ThreadStore."""
        await self._io(self._apply, thread_id, change, now)

    async def get_thread_rows(
        self, thread_id: str, kind: str, keys: Sequence[str]
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        rows = (await self._io(self._read, thread_id)).rows
        return rows_with_keys(rows, kind, keys)

    async def scan_thread_rows(
        self,
        thread_id: str,
        kind: str,
        low: str,
        high: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        rows = (await self._io(self._read, thread_id)).rows
        return scan_rows(rows, kind, low, high, newest_first, limit)

    def _list(self) -> list[ThreadInfo]:
        try:
            names = os.listdir(self._threads_dir())
        except FileNotFoundError:
            return []
        infos = []
        for name in names:
            if not name.endswith(LOG_SUFFIX):
                continue
            thread_id = self._thread_of(name)
            if thread_id is None:
                continue
            state = self._read(thread_id)
            if state.rows:
                infos.append(ThreadInfo(thread_id, state.updated_at, len(state.rows)))
        return sorted(infos, key=lambda info: (-info.updated_at, info.thread_id))

    def _thread_of(self, name: str) -> str | None:
        """The thread id whose log is named ``name`` (None: a log without a whole line)."""
        if not name.startswith(HASHED_MARK):
            return bytes.fromhex(name[: -len(LOG_SUFFIX)]).decode()
        try:
            with open(self._threads_dir() / name, "rb") as f:
                first = f.readline()
        except FileNotFoundError:
            return None
        if not first.endswith(b"\n"):
            return None
        thread_id: str = orjson.loads(first)["id"]
        return thread_id

    async def list_threads(self) -> list[ThreadInfo]:
        """See ThreadStore."""
        infos: list[ThreadInfo] = await self._io(self._list)
        return infos

    def _delete(self, thread_ids: list[str]) -> int:
        count = 0
        for thread_id in thread_ids:
            try:
                self._thread_path(thread_id).unlink()
                count += 1
            except FileNotFoundError:
                pass
            self._thread_states().pop(thread_id, None)
        if count:
            sync_directory(self._threads_dir())
        return count

    async def delete_threads(self, thread_ids: Sequence[str]) -> int:
        """See ThreadStore."""
        ids = list(dict.fromkeys(thread_ids))
        count: int = await self._io(self._delete, ids)
        return count

    def _copy(self, source_id: str, target_id: str, now: float) -> bool:
        rows = self._read(source_id).rows
        if not rows:
            return False
        snapshot = [ThreadRow(k, key, body) for (k, key), body in rows.items()]
        self._apply(target_id, ThreadChange(put=snapshot), now)
        return True

    async def copy_thread(self, source_id: str, target_id: str, now: float) -> bool:
        """See ThreadStore."""
        copied: bool = await self._io(self._copy, source_id, target_id, now)
        return copied
