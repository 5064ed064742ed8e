"""The SQLite store's schema and statements.

The schema is an ordered list of migrations: ``MIGRATIONS[n]`` takes a database from
version ``n`` to ``n + 1`` (SQL statements, or functions of the connection where data is
rewritten), and ``PRAGMA user_version`` records how many ran.
:func:`migrate` applies the missing ones in one write transaction, so several processes
opening a new file at once do it once.
"""

from __future__ import annotations

import functools
import sqlite3
import struct
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from nestegg.checkpoint.records import CheckpointRecord, Owner, RunRecord
from nestegg.constants import (
    FINISHED,
    SQLITE_CHECKPOINTS_TABLE,
    SQLITE_EVENT_BATCHES_TABLE,
    SQLITE_GROUP_EVENT_BATCHES_TABLE,
    SQLITE_GROUP_STEPS_TABLE,
    SQLITE_JOURNAL_TABLE,
    SQLITE_RUNS_TABLE,
    SQLITE_SIGNALS_TABLE,
    SQLITE_STEP_BLOCKS_TABLE,
    SQLITE_STEPS_TABLE,
)
from nestegg.errors import StorageError


def marks(count: int) -> str:
    """``count`` comma-separated ``?`` placeholders."""
    return ",".join("?" * count)


SEQ_SPAN = 2**32
"""Step and event sequence numbers of a run stay below this: the tables that hold them are
keyed by ``run_key * SEQ_SPAN + seq``, so a run's rows are one range of one b-tree."""
MAX_SEQ = SEQ_SPAN - 1
RUNS = SQLITE_RUNS_TABLE
STEPS = SQLITE_STEPS_TABLE
CHECKPOINTS = SQLITE_CHECKPOINTS_TABLE
EVENT_BATCHES = SQLITE_EVENT_BATCHES_TABLE
GROUP_STEPS = SQLITE_GROUP_STEPS_TABLE
"""Step records of group commits. A step's key is in one of STEPS and GROUP_STEPS, or in
both after a group commit's record was written again alone: then STEPS holds the newer
(a trigger deletes from STEPS the keys written to GROUP_STEPS). The same for the event
batches."""
GROUP_EVENT_BATCHES = SQLITE_GROUP_EVENT_BATCHES_TABLE
JOURNAL = SQLITE_JOURNAL_TABLE
STEP_BLOCKS = SQLITE_STEP_BLOCKS_TABLE
SIGNALS = SQLITE_SIGNALS_TABLE
INSERT_EVENT_BATCH = f"INSERT OR REPLACE INTO {EVENT_BATCHES} (batch_key, body) VALUES (?,?)"

RUN_FIELDS = tuple(
    "run_id pipeline status created_at updated_at fence owner lease_until step_seq "
    "event_seq parent_run parent_checkpoint result error input".split()
)
RUN_COLUMNS = ", ".join(RUN_FIELDS)


def _events_into_batches(conn: sqlite3.Connection) -> None:
    """Version 1 to 2: the events of version 1's table, one batch each, in version 2's
    batch format (format byte 1, then seq int64, at float64, length of kind uint16, length
    of body uint32, little-endian, the kind in UTF-8, the body), with its names and key
    span: all written out, never today's."""
    header = struct.Struct("<qdHI")

    def batch(key: int, seq: int, at: float, kind: str, body: bytes) -> tuple[int, bytes]:
        name = kind.encode()
        head = header.pack(seq, at, len(name), len(body))
        return key * 4294967296 + seq, b"\x01" + head + name + bytes(body)

    rows = conn.execute(
        "SELECT r.run_key, e.seq, e.at, e.kind, e.body "
        "FROM events e JOIN runs r ON r.run_id = e.run_id"
    )
    conn.executemany(
        "INSERT OR REPLACE INTO event_batches (batch_key, body) VALUES (?,?)",
        (batch(*row) for row in rows),
    )


Migration = str | Callable[[sqlite3.Connection], None]

# Written out literally, with the names each version had: never edit an entry.
MIGRATIONS: tuple[tuple[Migration, ...], ...] = (
    (
        # Small columns first, blobs last: a step's row update then touches only the
        # row's first page, however big the input is.
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY, pipeline TEXT NOT NULL, status TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL, fence INTEGER NOT NULL,
            owner TEXT, lease_until REAL, step_seq INTEGER NOT NULL,
            event_seq INTEGER NOT NULL, parent_run TEXT, parent_checkpoint TEXT,
            result BLOB, error BLOB, input BLOB NOT NULL)""",
        "CREATE INDEX runs_by_created ON runs (created_at)",
        """CREATE TABLE steps (
            run_id TEXT NOT NULL, seq INTEGER NOT NULL, agent TEXT NOT NULL,
            body BLOB NOT NULL, PRIMARY KEY (run_id, seq))""",
        """CREATE TABLE checkpoints (
            checkpoint_id TEXT PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL,
            created_at REAL NOT NULL, reason TEXT NOT NULL, body BLOB NOT NULL
            ) WITHOUT ROWID""",
        "CREATE INDEX checkpoints_by_run ON checkpoints (run_id, seq)",
        """CREATE TABLE events (
            run_id TEXT NOT NULL, seq INTEGER NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL,
            body BLOB NOT NULL, PRIMARY KEY (run_id, seq)) WITHOUT ROWID""",
        """CREATE TABLE journal (
            run_id TEXT NOT NULL, step INTEGER NOT NULL, position INTEGER NOT NULL,
            body BLOB NOT NULL, PRIMARY KEY (run_id, step, position))""",
    ),
    (
        # Version 2 cuts the pages a step's commit writes. Every run gets an integer key
        # (its rowid); steps and events are keyed by run_key * SEQ_SPAN + seq, so each is
        # one b-tree that grows at its right edge, without a second index; and a commit's
        # events go in one row (see sqlite_events).
        """CREATE TABLE runs_v2 (
            run_key INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE, pipeline TEXT NOT NULL,
            status TEXT NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
            fence INTEGER NOT NULL, owner TEXT, lease_until REAL, step_seq INTEGER NOT NULL,
            event_seq INTEGER NOT NULL, parent_run TEXT, parent_checkpoint TEXT,
            result BLOB, error BLOB, input BLOB NOT NULL)""",
        """INSERT INTO runs_v2 (run_key, run_id, pipeline, status, created_at, updated_at,
            fence, owner, lease_until, step_seq, event_seq, parent_run, parent_checkpoint,
            result, error, input)
            SELECT rowid, run_id, pipeline, status, created_at, updated_at, fence, owner,
            lease_until, step_seq, event_seq, parent_run, parent_checkpoint, result, error,
            input FROM runs""",
        "DROP TABLE runs",
        "ALTER TABLE runs_v2 RENAME TO runs",
        "CREATE INDEX runs_by_created ON runs (created_at)",
        """CREATE TABLE steps_v2 (
            step_key INTEGER PRIMARY KEY, agent TEXT NOT NULL, body BLOB NOT NULL)""",
        """INSERT INTO steps_v2 (step_key, agent, body)
            SELECT r.run_key * 4294967296 + s.seq, s.agent, s.body
            FROM steps s JOIN runs r ON r.run_id = s.run_id""",
        "DROP TABLE steps",
        "ALTER TABLE steps_v2 RENAME TO steps",
        "CREATE TABLE event_batches (batch_key INTEGER PRIMARY KEY, body BLOB NOT NULL)",
        _events_into_batches,
        "DROP TABLE events",
    ),
    (
        # Version 3 packs the step records of full blocks of steps into one row each
        # (see sqlite_blocks), keyed by run_key * SEQ_SPAN + the block's first seq.
        """CREATE TABLE step_blocks (
            block_key INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL, head BLOB NOT NULL,
            body BLOB NOT NULL)""",
    ),
    (
        # Version 4 keeps LangGraph threads (nestegg.langgraph), apart from runs: see
        # sqlite/threads.py.
        """CREATE TABLE lg_threads (
            thread_id TEXT PRIMARY KEY, updated_at REAL NOT NULL) WITHOUT ROWID""",
        """CREATE TABLE lg_rows (
            thread_id TEXT NOT NULL, kind TEXT NOT NULL, key TEXT NOT NULL,
            body BLOB NOT NULL, PRIMARY KEY (thread_id, kind, key))""",
    ),
    (
        # Version 5 keeps the signals sent to runs (nestegg.wait_for), one per name.
        """CREATE TABLE signals (
            run_id TEXT NOT NULL, name TEXT NOT NULL, at REAL NOT NULL, body BLOB NOT NULL,
            PRIMARY KEY (run_id, name)) WITHOUT ROWID""",
    ),
    (
        # Version 6: the step records and event batches of group commits go to tables of
        # their own, in the order written (a rowid of their own), with their keys in a
        # unique index, so that many runs committing together append to a few shared pages
        # instead of each to a page of its own (see sqlite_group_writes). A key written there
        # leaves the keyed table (its record there is older).
        """CREATE TABLE group_steps (
            step_id INTEGER PRIMARY KEY, step_key INTEGER NOT NULL, agent TEXT NOT NULL,
            body BLOB NOT NULL)""",
        "CREATE UNIQUE INDEX group_steps_by_key ON group_steps (step_key)",
        """CREATE TRIGGER group_steps_take_key AFTER INSERT ON group_steps
            BEGIN DELETE FROM steps WHERE step_key = NEW.step_key; END""",
        """CREATE TABLE group_event_batches (
            batch_id INTEGER PRIMARY KEY, batch_key INTEGER NOT NULL, body BLOB NOT NULL)""",
        "CREATE UNIQUE INDEX group_event_batches_by_key ON group_event_batches (batch_key)",
        """CREATE TRIGGER group_event_batches_take_key AFTER INSERT ON group_event_batches
            BEGIN DELETE FROM event_batches WHERE batch_key = NEW.batch_key; END""",
    ),
    (
        # Version 7 indexes forks by their parent run, newest last (list_forks reads it
        # backwards); a run that is no fork is not in it, and a commit, which updates none
        # of its columns, writes nothing to it.
        """CREATE INDEX runs_by_parent ON runs (parent_run, created_at, run_id)
            WHERE parent_run IS NOT NULL""",
    ),
)
"""The schema, one entry per version; append, never edit."""

SCHEMA_VERSION = len(MIGRATIONS)

READABLE_FROM = 6
"""The oldest schema version a reader (a store opened ``read_only``) reads as it is: the
first with every table a read uses (the reads of steps and events take the group commits'
tables of version 6 too). A migration that changes a table or adds one the reads use
raises it to that migration's version; one that adds an index does not (version 7's index
of forks: without it, a reader's ``list_forks`` reads the whole table)."""

OWNER_AT = RUN_FIELDS.index("owner")
SELECT_RUN = "SELECT {} FROM {}".format(
    ", ".join(
        f"CAST({name} AS BLOB)" if name in ("result", "error", "input") else name
        for name in RUN_FIELDS
    ),
    RUNS,
)
"""A read of runs; their sealed values selected as bytes, as ``BODY`` says."""
IDS_PER_QUERY = 500
"""Run ids in one ``IN (...)`` (SQLite allows 999 parameters in its oldest builds)."""


def ids_per_query(conn: sqlite3.Connection) -> int:
    """Run ids in one ``IN (...)`` on ``conn``: ``IDS_PER_QUERY``, or fewer where SQLite
    allows fewer parameters."""
    return max(1, min(IDS_PER_QUERY, conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)))


SELECT_FORKS = f"{SELECT_RUN} WHERE parent_run = ? ORDER BY created_at DESC, run_id DESC LIMIT ?"
"""The runs forked from run ``?1``, newest first, at most ``?2`` (-1: all): read from the
index of version 7 (``runs_by_parent``)."""
INSERT_RUN = (
    f"INSERT INTO {RUNS} ({RUN_COLUMNS}) VALUES ({marks(len(RUN_FIELDS))}) "
    "ON CONFLICT (run_id) DO NOTHING"
)
_FINISHED_SQL = ", ".join(f"'{status}'" for status in FINISHED)
CLAIM_RUN = (
    f"UPDATE {RUNS} SET fence = fence + 1, owner = ?, lease_until = ?, status = ?, "
    f"updated_at = ? WHERE run_id = ? AND fence = ? AND (? OR status NOT IN ({_FINISHED_SQL}))"
)
"""The claim of a run at its fence; a finished run only when the last parameter (reopen)
is true."""
CLAIM_STATE = f"SELECT fence, status FROM {RUNS} WHERE run_id = ?"
"""What a refused claim is told by: the run's fence and status."""


@functools.cache
def update_run(columns: tuple[str, ...]) -> str:
    """The fenced update of a run's row that sets ``columns`` (the run fields of a change
    set) and checks the run's key; it matches no row when the fence or the key moved on."""
    sets = ", ".join(f"{column} = ?" for column in columns) or "fence = fence"
    return f"UPDATE {RUNS} SET {sets} WHERE run_id = ? AND fence = ? AND run_key = ?"


BODY = "CAST(body AS BLOB)"
"""How every read selects a record's body (and ``HEAD`` a block's head): as bytes, whatever a
change by hand left in the column (text, even text that is not UTF-8, which Python's sqlite3
cannot decode; a number), so that the record's checksum check finds it damaged and names it,
as for a BLOB altered in place, rather than a TypeError far from the store."""
HEAD = "CAST(head AS BLOB)"
KEY_OF = f"SELECT run_key FROM {RUNS} WHERE run_id = ?"
KEY_AND_FENCE_OF = f"SELECT run_key, fence FROM {RUNS} WHERE run_id = ?"
INSERT_STEP = f"INSERT OR REPLACE INTO {STEPS} (step_key, agent, body) VALUES (?,?,?)"
DELETE_STEPS_AFTER = tuple(
    f"DELETE FROM {table} WHERE step_key > ? AND step_key <= ?" for table in (STEPS, GROUP_STEPS)
)
"""The step records with keys in ``(?1, ?2]``, in both tables."""
SELECT_STEPS = (
    f"SELECT step_key - ?1, agent, {BODY} FROM {STEPS} "
    "WHERE step_key > ?1 + ?2 AND step_key <= ?1 + ?3 "
    f"UNION ALL SELECT step_key - ?1, agent, {BODY} FROM {GROUP_STEPS} AS g "
    "WHERE step_key > ?1 + ?2 AND step_key <= ?1 + ?3 "
    f"AND NOT EXISTS (SELECT 1 FROM {STEPS} AS s WHERE s.step_key = g.step_key) ORDER BY 1"
)
"""Loose step records ``(seq, agent, body)`` with ``?2 < seq <= ?3`` of the run whose
keys start at ``?1``, from both tables."""
SELECT_BLOCKS = (
    f"SELECT block_key - ?1, last_seq, {HEAD}, {BODY} FROM {STEP_BLOCKS} "
    "WHERE block_key > ?1 + ?2 AND block_key <= ?1 + ?3 ORDER BY block_key"
)
"""Blocks ``(first_seq, last_seq, head, body)`` with ``?2 < first_seq <= ?3`` (same keys)."""
INSERT_BLOCK = (
    f"INSERT OR REPLACE INTO {STEP_BLOCKS} (block_key, last_seq, head, body) VALUES (?,?,?,?)"
)
DELETE_BLOCKS_AFTER = f"DELETE FROM {STEP_BLOCKS} WHERE block_key > ? AND block_key <= ?"
SELECT_BLOCK_HOLDING = (
    f"SELECT block_key - ?1, last_seq, {HEAD}, {BODY} FROM {STEP_BLOCKS} "
    "WHERE block_key > ?1 + max(?2 - ?3, 0) AND block_key <= ?1 + ?2 AND last_seq > ?2"
)
"""The block of the run whose keys start at ``?1`` that holds step ``?2`` and later ones
(blocks hold at most ``?3`` steps)."""
INSERT_STEP_IF_NEW = (
    f"INSERT OR IGNORE INTO {STEPS} (step_key, agent, body) SELECT ?1, ?2, ?3 "
    f"WHERE NOT EXISTS (SELECT 1 FROM {GROUP_STEPS} WHERE step_key = ?1)"
)
SELECT_EVENT_BATCHES = (
    f"WITH run AS (SELECT run_key * {SEQ_SPAN} AS base FROM {RUNS} WHERE run_id = ?1) "
    f"SELECT {BODY} FROM (SELECT batch_key, body FROM {EVENT_BATCHES}, run "
    "WHERE batch_key > run.base + ?2 AND batch_key <= run.base + ?3 "
    f"UNION ALL SELECT g.batch_key, g.body FROM {GROUP_EVENT_BATCHES} AS g, run "
    "WHERE g.batch_key > run.base + ?2 AND g.batch_key <= run.base + ?3 "
    f"AND NOT EXISTS (SELECT 1 FROM {EVENT_BATCHES} AS e WHERE e.batch_key = g.batch_key)) "
    "ORDER BY batch_key"
)
"""The event batches ``(body,)`` of run ``?1`` whose last seq is in ``(?2, ?3]``, from both
tables."""
INSERT_JOURNAL = f"INSERT OR REPLACE INTO {JOURNAL} (run_id, step, position, body) VALUES (?,?,?,?)"
DELETE_JOURNAL_AFTER = f"DELETE FROM {JOURNAL} WHERE run_id = ? AND step > ?"
INSERT_CHECKPOINT = (
    f"INSERT OR REPLACE INTO {CHECKPOINTS} "
    "(checkpoint_id, run_id, seq, created_at, reason, body) VALUES (?,?,?,?,?,?)"
)
DELETE_CHECKPOINT = f"DELETE FROM {CHECKPOINTS} WHERE checkpoint_id = ? AND run_id = ?"
CHECKPOINT_COLUMNS = f"checkpoint_id, run_id, seq, created_at, reason, {BODY}"
"""The columns a read of checkpoints selects (see ``BODY``)."""


def run_from_row(row: Sequence[Any]) -> RunRecord:
    """The run a ``SELECT_RUN`` row holds."""
    fields = dict(zip(RUN_FIELDS, row, strict=True))
    fields["owner"] = Owner.from_json(orjson.loads(row[OWNER_AT])) if row[OWNER_AT] else None
    return RunRecord(**fields)


def run_to_row(run: RunRecord) -> tuple[Any, ...]:
    """The ``INSERT_RUN`` parameters of a run."""
    row = [getattr(run, name) for name in RUN_FIELDS]
    row[OWNER_AT] = owner_text(run.owner)
    return tuple(row)


def owner_text(owner: Owner | None) -> str | None:
    """The owner as JSON text (None stays None)."""
    return orjson.dumps(owner.to_json()).decode() if owner is not None else None


def checkpoint_from_row(row: Sequence[Any]) -> CheckpointRecord:
    """The checkpoint a ``CHECKPOINT_COLUMNS`` row holds."""
    return CheckpointRecord(
        checkpoint_id=row[0],
        run_id=row[1],
        seq=row[2],
        created_at=row[3],
        reason=row[4],
        body=row[5],
    )


@contextmanager
def write_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction (unless the caller began it): committed on
    success, rolled back on error."""
    if not conn.in_transaction:
        conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema to ``SCHEMA_VERSION``; StorageError if the file is newer."""
    with write_transaction(conn):
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"the database has schema version {version}; this nestegg knows up to "
                f"{SCHEMA_VERSION}: upgrade nestegg"
            )
        for steps in MIGRATIONS[version:]:
            for step in steps:
                if isinstance(step, str):
                    conn.execute(step)
                else:
                    step(conn)
        if version < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def delete_runs(conn: sqlite3.Connection, run_ids: Sequence[str]) -> int:
    """Delete runs and everything of them (inside a transaction); how many runs went."""
    params = [(run_id,) for run_id in run_ids]
    for table, key in (
        (STEPS, "step_key"),
        (GROUP_STEPS, "step_key"),
        (STEP_BLOCKS, "block_key"),
        (EVENT_BATCHES, "batch_key"),
        (GROUP_EVENT_BATCHES, "batch_key"),
    ):
        conn.executemany(
            f"DELETE FROM {table} WHERE {key} >= (SELECT run_key * {SEQ_SPAN} FROM {RUNS} "
            f"WHERE run_id = ?1) AND {key} < (SELECT (run_key + 1) * {SEQ_SPAN} FROM {RUNS} "
            "WHERE run_id = ?1)",
            params,
        )
    for table in (CHECKPOINTS, JOURNAL, SIGNALS):
        conn.executemany(f"DELETE FROM {table} WHERE run_id = ?", params)
    cursor = conn.executemany(f"DELETE FROM {RUNS} WHERE run_id = ?", params)
    return cursor.rowcount
