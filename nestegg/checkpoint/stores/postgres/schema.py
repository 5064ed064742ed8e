"""The PostgreSQL schema of nestegg: today's names, queries, row conversions and the check
of table prefixes. The ordered migrations that build it are in
:mod:`~nestegg.checkpoint.stores.postgres.migrations`.

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

The ``{commit_many}`` function (version 6) applies many runs' commits in one statement
(group commit): four arrays of those arguments, one element per commit, the runs
distinct. Each commit is fenced on its own; it returns an array of what ``{commit}``
returns, one element per commit in their order.
"""

from __future__ import annotations

import re
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
    "commit_many": "commit_many",
    "runs_pipeline_idx": "runs_pipeline_idx",
    "runs_status_idx": "runs_status_idx",
    "runs_parent_idx": "runs_parent_idx",
    "checkpoints_run_idx": "checkpoints_run_idx",
}

VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS {versions} (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


DROP_STATEMENTS = [
    "DROP FUNCTION IF EXISTS {commit}",
    "DROP FUNCTION IF EXISTS {commit_many}",
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
    # From the index of version 7 (runs_parent_idx); without it, a scan of the table.
    "list_forks": f"SELECT {_RUN_COLUMNS} FROM {{runs}} WHERE parent_run = %s "
    "ORDER BY created_at DESC, run_id DESC LIMIT %s::bigint",
    # A finished run is claimed only when the last parameter (reopen) is true.
    "claim_run": "UPDATE {runs} SET fence = fence + 1, owner_host = %s, owner_pid = %s, "
    "owner_started = %s, lease_until = %s, status = %s, updated_at = %s "
    f"WHERE run_id = %s AND fence = %s AND (%s OR status NOT IN ({_FINISHED_SQL})) "
    f"RETURNING {_RUN_COLUMNS}",
    "claim_state": "SELECT fence, status FROM {runs} WHERE run_id = %s",
    "run_exists": "SELECT 1 FROM {runs} WHERE run_id = %s",
    # The sealed bodies travel as one binary blob: no escaping on either side.
    "commit": "SELECT {commit}(%b::text, %b::bigint, %s::jsonb, %b::bytea)",
    # Many runs' commits in one statement (group commit). All binary: a text array in text
    # format is quoted and escaped element by element (each JSON's quotes), which cost more
    # client CPU than the rest of the commit.
    "commit_many": "SELECT {commit_many}(%b::text[], %b::bigint[], %b::text[]::jsonb[], "
    "%b::bytea[])",
    # The same when a run has more than one commit in the group: run by run, in order.
    "commit_each": "SELECT {commit}(r, f, m, b) FROM unnest(%b::text[], %b::bigint[], "
    "%b::text[]::jsonb[], %b::bytea[]) WITH ORDINALITY AS t(r, f, m, b, n) ORDER BY n",
    "load_steps": "SELECT seq, agent, body FROM {steps} WHERE run_id = %(run_id)s "
    "AND seq > %(after)s AND (%(upto)s::bigint IS NULL OR seq <= %(upto)s::bigint) "
    "ORDER BY seq",
    "list_checkpoints": f"SELECT {_CHECKPOINT_COLUMNS} FROM {{checkpoints}} "
    "WHERE run_id = %s ORDER BY seq, checkpoint_id",
    "list_checkpoints_of": f"SELECT {_CHECKPOINT_COLUMNS} FROM {{checkpoints}} "
    "WHERE run_id = ANY(%s::text[]) ORDER BY run_id, seq, checkpoint_id",
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


_BODY_FIELDS = ("result", "error")


def commit_params(c: ChangeSet) -> list[Any]:
    """The arguments of the commit function for a change set: run id, fence, the JSON that
    describes the records (see the module docstring) and the blob of their sealed bodies.
    """
    # Written out kind by kind, without a call per body: a group commit makes hundreds.
    bodies: list[bytes] = []
    at = 1  # where the next body starts in the blob: substring() counts from 1
    meta: dict[str, Any] = {}
    if c.truncate_after is not None:
        meta["t"] = c.truncate_after
        if c.journal_after != c.truncate_after:
            meta["k"] = c.journal_after
    if c.steps:
        rows: list[tuple[Any, ...]] = []
        for s in c.steps:
            rows.append((s.seq, s.agent, at, len(s.body)))
            at += len(s.body)
            bodies.append(s.body)
        meta["s"] = rows
    if c.events:
        rows = []
        for e in c.events:
            rows.append((e.seq, e.at, e.kind, at, len(e.body)))
            at += len(e.body)
            bodies.append(e.body)
        meta["e"] = rows
    if c.journal:
        rows = []
        for j in c.journal:
            rows.append((j.step, j.position, at, len(j.body)))
            at += len(j.body)
            bodies.append(j.body)
        meta["j"] = rows
    if c.checkpoints:
        rows = []
        for k in c.checkpoints:
            rows.append((k.checkpoint_id, k.seq, k.created_at, k.reason, at, len(k.body)))
            at += len(k.body)
            bodies.append(k.body)
        meta["c"] = rows
    if c.prune:
        meta["p"] = list(c.prune)
    meta["r"] = _run_fields(c.run_fields, at, bodies)
    return [c.run_id, c.fence, orjson.dumps(meta).decode(), b"".join(bodies)]


def _run_fields(run_fields: dict[str, Any], at: int, bodies: list[bytes]) -> dict[str, Any]:
    """The run fields of the JSON: a result or error placed in the blob from ``at`` on."""
    fields = dict(run_fields)
    for name in _BODY_FIELDS:
        if name in fields:
            body = fields[name]
            fields[name] = (at, len(body))
            at += len(body)
            bodies.append(body)
    return fields
