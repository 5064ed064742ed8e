"""The PostgreSQL schema of nestegg: ordered migrations, queries, row conversions and the
check of table prefixes.

``MIGRATIONS[i]`` brings the schema from version ``i`` to version ``i + 1``; the version
table records each one applied. A migration is a list of statements whose table and
function names are placeholders holding the name itself, as that version named it
(``{runs}`` is the table ``<prefix>runs``): :func:`migration_names` fills them with
quoted, prefixed identifiers, whatever today's names (:data:`TABLE_SUFFIXES`) are. Never
edit an applied migration: append a new one.

The ``{commit}`` function applies one fenced commit in a single round trip. It returns
the fence the commit carried when it was applied, the stored (newer) fence when the
commit is stale, and NULL when there is no such run; nothing is written unless it was
applied. Its arguments are the run id, the fence, a JSON description of the commit and
one blob of all sealed bodies, which the JSON points into by (1-based start, length)::

    {"t": truncate_after,                                   (each key only when needed)
     "k": the last step whose journal a truncation keeps (version 3; default "t"),
     "s": [[seq, agent, start, length], ...],               steps
     "e": [[seq, at, kind, start, length], ...],            events
     "j": [[step, position, start, length], ...],           journal entries
     "c": [[id, seq, created_at, reason, start, length], ...],  checkpoints
     "p": [checkpoint id, ...],                             pruned checkpoints
     "r": {"status", "lease_until", "step_seq", "event_seq", "updated_at",
           "result": [start, length], "error": [start, length]}}   run fields

Two parameters instead of one array per field keep the client's work per commit small.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from typing import Any

import orjson

from nestegg.checkpoint.records import CheckpointRecord, Owner, RunRecord
from nestegg.checkpoint.stores.common import ChangeSet
from nestegg.constants import FINISHED, MAX_TABLE_PREFIX_LENGTH
from nestegg.errors import InvalidIdentifierError

_PREFIX_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Placeholder name -> table suffix appended to the table prefix.
TABLE_SUFFIXES: dict[str, str] = {
    "versions": "schema_versions",
    "runs": "runs",
    "steps": "steps",
    "events": "events",
    "journal": "journal",
    "checkpoints": "checkpoints",
    "lg_threads": "lg_threads",
    "lg_rows": "lg_rows",
    "signals": "signals",
}
# Placeholder name -> function or index suffix appended to the table prefix.
OBJECT_SUFFIXES: dict[str, str] = {
    "commit": "commit",
    "runs_pipeline_idx": "runs_pipeline_idx",
    "runs_status_idx": "runs_status_idx",
    "checkpoints_run_idx": "checkpoints_run_idx",
}

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS {versions} (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""

_TABLES = [
    """
    CREATE TABLE {runs} (
        run_id text COLLATE "C" PRIMARY KEY,
        pipeline text COLLATE "C" NOT NULL,
        status text NOT NULL,
        input bytea NOT NULL,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        fence bigint NOT NULL,
        owner_host text,
        owner_pid integer,
        owner_started text,
        lease_until double precision,
        result bytea,
        error bytea,
        step_seq bigint NOT NULL DEFAULT 0,
        event_seq bigint NOT NULL DEFAULT 0,
        parent_run text,
        parent_checkpoint text
    ) WITH (fillfactor = 70)
    """,
    "CREATE INDEX {runs_pipeline_idx} ON {runs} (pipeline, created_at DESC, run_id DESC)",
    # No index covers a column a commit updates (updated_at, lease_until, step_seq, ...),
    # and the table leaves room in its pages: a commit's update of the run row stays a
    # HOT update, which writes no index entries.
    "CREATE INDEX {runs_status_idx} ON {runs} (status)",
    """
    CREATE TABLE {steps} (
        run_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        agent text NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (run_id, seq)
    )
    """,
    """
    CREATE TABLE {events} (
        run_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        at double precision NOT NULL,
        kind text NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (run_id, seq)
    )
    """,
    """
    CREATE TABLE {journal} (
        run_id text COLLATE "C" NOT NULL,
        step bigint NOT NULL,
        position integer NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (run_id, step, position)
    )
    """,
    """
    CREATE TABLE {checkpoints} (
        checkpoint_id text COLLATE "C" PRIMARY KEY,
        run_id text COLLATE "C" NOT NULL,
        seq bigint NOT NULL,
        created_at double precision NOT NULL,
        reason text NOT NULL,
        body bytea NOT NULL
    )
    """,
    "CREATE INDEX {checkpoints_run_idx} ON {checkpoints} (run_id, seq, checkpoint_id)",
]

_COMMIT_FUNCTION = """
CREATE OR REPLACE FUNCTION {commit}(p_run_id text, p_fence bigint, p_meta jsonb, p_blob bytea)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_fence bigint;
    v_run jsonb := p_meta->'r';
    v_after bigint := (p_meta->>'t')::bigint;
    v_id text;
BEGIN
    -- The fence check takes the run row's lock: no other commit or claim of this run
    -- interleaves until this transaction ends. Run fields are final values, so setting
    -- them first gives the same result as setting them last.
    UPDATE {runs} SET
        status = COALESCE(v_run->>'status', status),
        result = CASE WHEN v_run ? 'result' THEN substring(
            p_blob FROM (v_run->'result'->>0)::integer FOR (v_run->'result'->>1)::integer)
            ELSE result END,
        error = CASE WHEN v_run ? 'error' THEN substring(
            p_blob FROM (v_run->'error'->>0)::integer FOR (v_run->'error'->>1)::integer)
            ELSE error END,
        lease_until = COALESCE((v_run->>'lease_until')::double precision, lease_until),
        step_seq = COALESCE((v_run->>'step_seq')::bigint, step_seq),
        event_seq = COALESCE((v_run->>'event_seq')::bigint, event_seq),
        updated_at = COALESCE((v_run->>'updated_at')::double precision, updated_at)
    WHERE run_id = p_run_id AND fence = p_fence;
    IF NOT FOUND THEN
        SELECT fence INTO v_fence FROM {runs} WHERE run_id = p_run_id;
        RETURN v_fence;
    END IF;
    IF v_after IS NOT NULL THEN
        DELETE FROM {steps} WHERE run_id = p_run_id AND seq > v_after;
        DELETE FROM {checkpoints} WHERE run_id = p_run_id AND seq > v_after;
    END IF;
    IF p_meta ? 's' THEN
        INSERT INTO {steps} (run_id, seq, agent, body)
        SELECT p_run_id, (x->>0)::bigint, x->>1,
            substring(p_blob FROM (x->>2)::integer FOR (x->>3)::integer)
        FROM jsonb_array_elements(p_meta->'s') AS x
        ON CONFLICT (run_id, seq) DO UPDATE SET agent = EXCLUDED.agent, body = EXCLUDED.body;
    END IF;
    IF p_meta ? 'e' THEN
        INSERT INTO {events} (run_id, seq, at, kind, body)
        SELECT p_run_id, (x->>0)::bigint, (x->>1)::double precision, x->>2,
            substring(p_blob FROM (x->>3)::integer FOR (x->>4)::integer)
        FROM jsonb_array_elements(p_meta->'e') AS x
        ON CONFLICT (run_id, seq) DO NOTHING;
    END IF;
    IF p_meta ? 'j' THEN
        INSERT INTO {journal} (run_id, step, position, body)
        SELECT p_run_id, (x->>0)::bigint, (x->>1)::integer,
            substring(p_blob FROM (x->>2)::integer FOR (x->>3)::integer)
        FROM jsonb_array_elements(p_meta->'j') AS x
        ON CONFLICT (run_id, step, position) DO UPDATE SET body = EXCLUDED.body;
    END IF;
    IF p_meta ? 'c' THEN
        INSERT INTO {checkpoints} (checkpoint_id, run_id, seq, created_at, reason, body)
        SELECT x->>0, p_run_id, (x->>1)::bigint, (x->>2)::double precision, x->>3,
            substring(p_blob FROM (x->>4)::integer FOR (x->>5)::integer)
        FROM jsonb_array_elements(p_meta->'c') AS x
        ON CONFLICT (checkpoint_id) DO UPDATE SET
            run_id = EXCLUDED.run_id, seq = EXCLUDED.seq, created_at = EXCLUDED.created_at,
            reason = EXCLUDED.reason, body = EXCLUDED.body;
    END IF;
    -- One id at a time: the primary key finds each, where a scan of the run's index
    -- would walk every pruned checkpoint not yet vacuumed.
    FOR v_id IN SELECT jsonb_array_elements_text(p_meta->'p') LOOP
        DELETE FROM {checkpoints} WHERE checkpoint_id = v_id AND run_id = p_run_id;
    END LOOP;
    RETURN p_fence;
END
$fn$
"""

_COMMIT_FUNCTION_V3 = """
CREATE OR REPLACE FUNCTION {commit}(p_run_id text, p_fence bigint, p_meta jsonb, p_blob bytea)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    v_fence bigint;
    v_run jsonb := p_meta->'r';
    v_after bigint := (p_meta->>'t')::bigint;
    v_id text;
BEGIN
    -- The fence check takes the run row's lock: no other commit or claim of this run
    -- interleaves until this transaction ends. Run fields are final values, so setting
    -- them first gives the same result as setting them last.
    UPDATE {runs} SET
        status = COALESCE(v_run->>'status', status),
        result = CASE WHEN v_run ? 'result' THEN substring(
            p_blob FROM (v_run->'result'->>0)::integer FOR (v_run->'result'->>1)::integer)
            ELSE result END,
        error = CASE WHEN v_run ? 'error' THEN substring(
            p_blob FROM (v_run->'error'->>0)::integer FOR (v_run->'error'->>1)::integer)
            ELSE error END,
        lease_until = COALESCE((v_run->>'lease_until')::double precision, lease_until),
        step_seq = COALESCE((v_run->>'step_seq')::bigint, step_seq),
        event_seq = COALESCE((v_run->>'event_seq')::bigint, event_seq),
        updated_at = COALESCE((v_run->>'updated_at')::double precision, updated_at)
    WHERE run_id = p_run_id AND fence = p_fence;
    IF NOT FOUND THEN
        SELECT fence INTO v_fence FROM {runs} WHERE run_id = p_run_id;
        RETURN v_fence;
    END IF;
    IF v_after IS NOT NULL THEN
        DELETE FROM {steps} WHERE run_id = p_run_id AND seq > v_after;
        DELETE FROM {checkpoints} WHERE run_id = p_run_id AND seq > v_after;
        DELETE FROM {journal} WHERE run_id = p_run_id
            AND step > COALESCE((p_meta->>'k')::bigint, v_after);
    END IF;
    IF p_meta ? 's' THEN
        INSERT INTO {steps} (run_id, seq, agent, body)
        SELECT p_run_id, (x->>0)::bigint, x->>1,
            substring(p_blob FROM (x->>2)::integer FOR (x->>3)::integer)
        FROM jsonb_array_elements(p_meta->'s') AS x
        ON CONFLICT (run_id, seq) DO UPDATE SET agent = EXCLUDED.agent, body = EXCLUDED.body;
    END IF;
    IF p_meta ? 'e' THEN
        INSERT INTO {events} (run_id, seq, at, kind, body)
        SELECT p_run_id, (x->>0)::bigint, (x->>1)::double precision, x->>2,
            substring(p_blob FROM (x->>3)::integer FOR (x->>4)::integer)
        FROM jsonb_array_elements(p_meta->'e') AS x
        ON CONFLICT (run_id, seq) DO NOTHING;
    END IF;
    IF p_meta ? 'j' THEN
        INSERT INTO {journal} (run_id, step, position, body)
        SELECT p_run_id, (x->>0)::bigint, (x->>1)::integer,
            substring(p_blob FROM (x->>2)::integer FOR (x->>3)::integer)
        FROM jsonb_array_elements(p_meta->'j') AS x
        ON CONFLICT (run_id, step, position) DO UPDATE SET body = EXCLUDED.body;
    END IF;
    IF p_meta ? 'c' THEN
        INSERT INTO {checkpoints} (checkpoint_id, run_id, seq, created_at, reason, body)
        SELECT x->>0, p_run_id, (x->>1)::bigint, (x->>2)::double precision, x->>3,
            substring(p_blob FROM (x->>4)::integer FOR (x->>5)::integer)
        FROM jsonb_array_elements(p_meta->'c') AS x
        ON CONFLICT (checkpoint_id) DO UPDATE SET
            run_id = EXCLUDED.run_id, seq = EXCLUDED.seq, created_at = EXCLUDED.created_at,
            reason = EXCLUDED.reason, body = EXCLUDED.body;
    END IF;
    -- One id at a time: the primary key finds each, where a scan of the run's index
    -- would walk every pruned checkpoint not yet vacuumed.
    FOR v_id IN SELECT jsonb_array_elements_text(p_meta->'p') LOOP
        DELETE FROM {checkpoints} WHERE checkpoint_id = v_id AND run_id = p_run_id;
    END LOOP;
    RETURN p_fence;
END
$fn$
"""
"""Version 3 of ``{commit}``: a truncation also drops the journal entries of the steps
it drops; otherwise the function of version 2. Written out: never edit a migration."""


def migration_names(statement: str) -> list[str]:
    """The names a migration's statement places (each ``{name}`` is ``<prefix>name``)."""
    return sorted({name for _, name, _, _ in string.Formatter().parse(statement) if name})


_SIGNALS_TABLE = """
    CREATE TABLE {signals} (
        run_id text COLLATE "C" NOT NULL,
        name text COLLATE "C" NOT NULL,
        at double precision NOT NULL,
        body bytea NOT NULL,
        PRIMARY KEY (run_id, name)
    )
"""
"""Version 4: the signals sent to runs (``nestegg.wait_for``), one per name. Written out:
never edit a migration."""

MIGRATIONS: list[list[str]] = [
    _TABLES,
    [_COMMIT_FUNCTION],
    [_COMMIT_FUNCTION_V3],
    [
        # LangGraph threads (nestegg.langgraph), apart from runs: see postgres/threads.py.
        """
        CREATE TABLE {lg_threads} (
            thread_id text COLLATE "C" PRIMARY KEY,
            updated_at double precision NOT NULL
        )
        """,
        """
        CREATE TABLE {lg_rows} (
            thread_id text COLLATE "C" NOT NULL,
            kind text COLLATE "C" NOT NULL,
            key text COLLATE "C" NOT NULL,
            body bytea NOT NULL,
            PRIMARY KEY (thread_id, kind, key)
        )
        """,
    ],
    [_SIGNALS_TABLE],
]
"""The schema's history: index ``i`` upgrades version ``i`` to ``i + 1``."""

DROP_STATEMENTS = [
    "DROP FUNCTION IF EXISTS {commit}",
    "DROP TABLE IF EXISTS {signals}, {checkpoints}, {journal}, {events}, {steps}, {runs}, "
    "{versions}",
    "DROP TABLE IF EXISTS {lg_rows}, {lg_threads}",
]

_FINISHED_SQL = ", ".join(f"'{status}'" for status in FINISHED)
_RUN_COLUMNS = (
    "run_id, pipeline, status, input, created_at, updated_at, fence, owner_host, owner_pid, "
    "owner_started, lease_until, result, error, step_seq, event_seq, parent_run, "
    "parent_checkpoint"
)
_CHECKPOINT_COLUMNS = "checkpoint_id, run_id, seq, created_at, reason, body"

QUERIES: dict[str, str] = {
    "create_run": f"INSERT INTO {{runs}} ({_RUN_COLUMNS}) VALUES ("
    + ", ".join(["%s"] * 17)
    + ") ON CONFLICT (run_id) DO NOTHING RETURNING run_id",
    "get_run": f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE run_id = %s",
    # Many runs read in one statement (thousands of runs starting at once).
    "get_runs": f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE run_id = ANY(%s::text[])",
    "list_runs": f"SELECT {_RUN_COLUMNS} FROM {{runs}} "
    "WHERE (%(pipeline)s::text IS NULL OR pipeline = %(pipeline)s::text) "
    "AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[])) "
    "AND (%(before_at)s::float8 IS NULL "
    "OR (created_at, run_id) < (%(before_at)s::float8, %(before_id)s::text)) "
    "ORDER BY created_at DESC, run_id DESC LIMIT %(limit)s::bigint",
    # A finished run is claimed only when the last parameter (reopen) is true.
    "claim_run": "UPDATE {runs} SET fence = fence + 1, owner_host = %s, owner_pid = %s, "
    "owner_started = %s, lease_until = %s, status = %s, updated_at = %s "
    f"WHERE run_id = %s AND fence = %s AND (%s OR status NOT IN ({_FINISHED_SQL})) "
    f"RETURNING {_RUN_COLUMNS}",
    "claim_state": "SELECT fence, status FROM {runs} WHERE run_id = %s",
    "run_exists": "SELECT 1 FROM {runs} WHERE run_id = %s",
    # The sealed bodies travel as one binary blob: no escaping on either side.
    "commit": "SELECT {commit}(%b::text, %b::bigint, %s::jsonb, %b::bytea)",
    # Many runs' commits in one statement (group commit), applied in the arrays' order.
    "commit_many": "SELECT {commit}(r, f, m, b) FROM unnest(%b::text[], %b::bigint[], "
    "%s::text[]::jsonb[], %b::bytea[]) WITH ORDINALITY AS t(r, f, m, b, n) ORDER BY n",
    "load_steps": "SELECT seq, agent, body FROM {steps} WHERE run_id = %(run_id)s "
    "AND seq > %(after)s AND (%(upto)s::bigint IS NULL OR seq <= %(upto)s::bigint) "
    "ORDER BY seq",
    "list_checkpoints": f"SELECT {_CHECKPOINT_COLUMNS} FROM {{checkpoints}} "
    "WHERE run_id = %s ORDER BY seq, checkpoint_id",
    "get_checkpoint": f"SELECT {_CHECKPOINT_COLUMNS} FROM {{checkpoints}} WHERE checkpoint_id = %s",
    "read_events": "SELECT seq, at, kind, body FROM {events} WHERE run_id = %s AND seq > %s "
    "ORDER BY seq LIMIT %s::bigint",
    "read_journal": "SELECT step, position, body FROM {journal} WHERE run_id = %s "
    "AND step = %s ORDER BY position",
    "delete_runs": "DELETE FROM {runs} WHERE run_id = ANY(%s::text[]) RETURNING run_id",
    "expire_runs": "DELETE FROM {runs} WHERE status = ANY(%(statuses)s::text[]) "
    "AND updated_at < %(before)s "
    "AND (%(pipeline)s::text IS NULL OR pipeline = %(pipeline)s::text) RETURNING run_id",
    "delete_run_data": "WITH steps AS (DELETE FROM {steps} WHERE run_id = ANY(%(ids)s::text[])), "
    "events AS (DELETE FROM {events} WHERE run_id = ANY(%(ids)s::text[])), "
    "journal AS (DELETE FROM {journal} WHERE run_id = ANY(%(ids)s::text[])), "
    "signals AS (DELETE FROM {signals} WHERE run_id = ANY(%(ids)s::text[])) "
    "DELETE FROM {checkpoints} WHERE run_id = ANY(%(ids)s::text[])",
    # A signal of a run that exists, stored once per name (or replaced): a row when stored.
    "put_signal": "INSERT INTO {signals} (run_id, name, at, body) "
    "SELECT %(run_id)s, %(name)s, %(at)s, %(body)s WHERE EXISTS "
    "(SELECT 1 FROM {runs} WHERE run_id = %(run_id)s) ON CONFLICT (run_id, name) DO NOTHING "
    "RETURNING 1",
    "replace_signal": "INSERT INTO {signals} (run_id, name, at, body) "
    "SELECT %(run_id)s, %(name)s, %(at)s, %(body)s WHERE EXISTS "
    "(SELECT 1 FROM {runs} WHERE run_id = %(run_id)s) ON CONFLICT (run_id, name) "
    "DO UPDATE SET at = excluded.at, body = excluded.body RETURNING 1",
    "read_signals": "SELECT name, at, body FROM {signals} WHERE run_id = %s ORDER BY name",
    "delete_checkpoints": "DELETE FROM {checkpoints} WHERE run_id = %s "
    "AND checkpoint_id = ANY(%s::text[]) RETURNING checkpoint_id",
    "lock_schema": "SELECT pg_advisory_xact_lock(%s)",
    "version_table": VERSION_TABLE,
    "schema_version": "SELECT COALESCE(max(version), 0) FROM {versions}",
    "record_version": "INSERT INTO {versions} (version) VALUES (%s)",
}


def validate_table_prefix(prefix: str) -> str:
    """Check that ``prefix`` is a plain SQL identifier; return it.

    Raises:
        InvalidIdentifierError: anything but letters, digits and underscores (not leading
            with a digit), or longer than the limit.
    """
    if (
        not isinstance(prefix, str)
        or not _PREFIX_PATTERN.fullmatch(prefix)
        or len(prefix) > MAX_TABLE_PREFIX_LENGTH
    ):
        raise InvalidIdentifierError(
            f"table_prefix {prefix!r} is not allowed: use letters, digits and underscores, "
            f"not starting with a digit, at most {MAX_TABLE_PREFIX_LENGTH} characters"
        )
    return prefix


def run_from_row(row: Sequence[Any]) -> RunRecord:
    """A RunRecord from a row of the run columns."""
    (run_id, pipeline, status, input_, created, updated, fence, host, pid, started) = row[:10]
    return RunRecord(
        run_id=run_id,
        pipeline=pipeline,
        status=status,
        input=bytes(input_),
        created_at=created,
        updated_at=updated,
        fence=fence,
        owner=Owner(host=host, pid=pid, started=started) if host is not None else None,
        lease_until=row[10],
        result=bytes(row[11]) if row[11] is not None else None,
        error=bytes(row[12]) if row[12] is not None else None,
        step_seq=row[13],
        event_seq=row[14],
        parent_run=row[15],
        parent_checkpoint=row[16],
    )


def checkpoint_from_row(row: Sequence[Any]) -> CheckpointRecord:
    """A CheckpointRecord from a row of the checkpoint columns."""
    return CheckpointRecord(
        checkpoint_id=row[0],
        run_id=row[1],
        seq=row[2],
        created_at=row[3],
        reason=row[4],
        body=bytes(row[5]),
    )


_BODY_FIELDS = frozenset({"result", "error"})


def commit_params(c: ChangeSet) -> list[Any]:
    """The arguments of the commit function for a change set: run id, fence, the JSON that
    describes the records (see the module docstring) and the blob of their sealed bodies.
    """
    blob = bytearray()

    def place(body: bytes) -> tuple[int, int]:
        start = len(blob) + 1  # substring() counts from 1
        blob.extend(body)
        return start, len(body)

    meta: dict[str, Any] = {}
    if c.truncate_after is not None:
        meta["t"] = c.truncate_after
        if c.journal_after != c.truncate_after:
            meta["k"] = c.journal_after
    if c.steps:
        meta["s"] = [[s.seq, s.agent, *place(s.body)] for s in c.steps]
    if c.events:
        meta["e"] = [[e.seq, e.at, e.kind, *place(e.body)] for e in c.events]
    if c.journal:
        meta["j"] = [[j.step, j.position, *place(j.body)] for j in c.journal]
    if c.checkpoints:
        meta["c"] = [
            [k.checkpoint_id, k.seq, k.created_at, k.reason, *place(k.body)] for k in c.checkpoints
        ]
    if c.prune:
        meta["p"] = list(c.prune)
    meta["r"] = {
        name: place(value) if name in _BODY_FIELDS else value
        for name, value in c.run_fields.items()
    }
    return [c.run_id, c.fence, orjson.dumps(meta).decode(), bytes(blob)]
