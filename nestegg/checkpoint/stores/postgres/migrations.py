"""The PostgreSQL schema's history: ``MIGRATIONS[i]`` brings the schema from version ``i``
to version ``i + 1``; the version table records each one applied. A migration is a list of
statements whose table and function names are placeholders holding the name itself, as
that version named it (``{runs}`` is the table ``<prefix>runs``): :func:`migration_names`
lists them, and the store fills them with quoted, prefixed identifiers, whatever today's
names (``TABLE_SUFFIXES`` in :mod:`~nestegg.checkpoint.stores.postgres.schema`) are. Never
edit an applied migration: append a new one.

What the commit functions take and answer is drawn in
:mod:`~nestegg.checkpoint.stores.postgres.schema`.
"""

from __future__ import annotations

import string

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

_COMMIT_MANY_FUNCTION = """
CREATE OR REPLACE FUNCTION {commit_many}(
    p_run_ids text[], p_fences bigint[], p_metas jsonb[], p_blobs bytea[]
) RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    v_ok boolean[];
    v_pruned text[];
    v_pruned_runs text[];
BEGIN
    -- The fence check takes the run rows' locks: no other commit or claim of these runs
    -- interleaves until this transaction ends. Run fields are final values, so setting
    -- them first gives the same result as setting them last.
    WITH done AS (
        UPDATE {runs} AS r SET
            status = COALESCE(b.meta->'r'->>'status', r.status),
            result = CASE WHEN b.meta->'r' ? 'result' THEN substring(b.blob
                FROM (b.meta->'r'->'result'->>0)::integer
                FOR (b.meta->'r'->'result'->>1)::integer) ELSE r.result END,
            error = CASE WHEN b.meta->'r' ? 'error' THEN substring(b.blob
                FROM (b.meta->'r'->'error'->>0)::integer
                FOR (b.meta->'r'->'error'->>1)::integer) ELSE r.error END,
            lease_until = COALESCE((b.meta->'r'->>'lease_until')::double precision,
                r.lease_until),
            step_seq = COALESCE((b.meta->'r'->>'step_seq')::bigint, r.step_seq),
            event_seq = COALESCE((b.meta->'r'->>'event_seq')::bigint, r.event_seq),
            updated_at = COALESCE((b.meta->'r'->>'updated_at')::double precision, r.updated_at)
        FROM unnest(p_run_ids, p_fences, p_metas, p_blobs) WITH ORDINALITY
            AS b(run_id, fence, meta, blob, n)
        WHERE r.run_id = b.run_id AND r.fence = b.fence
        RETURNING b.n
    )
    SELECT array_agg(d.n IS NOT NULL ORDER BY i) INTO v_ok
    FROM generate_series(1, cardinality(p_run_ids)) AS i LEFT JOIN done AS d ON d.n = i;
    IF EXISTS (SELECT 1 FROM unnest(p_metas) AS m WHERE m ? 't') THEN
        DELETE FROM {steps} AS s
        USING unnest(p_run_ids, p_metas) WITH ORDINALITY AS b(run_id, meta, n)
        WHERE v_ok[b.n] AND b.meta ? 't' AND s.run_id = b.run_id
            AND s.seq > (b.meta->>'t')::bigint;
        DELETE FROM {checkpoints} AS c
        USING unnest(p_run_ids, p_metas) WITH ORDINALITY AS b(run_id, meta, n)
        WHERE v_ok[b.n] AND b.meta ? 't' AND c.run_id = b.run_id
            AND c.seq > (b.meta->>'t')::bigint;
        DELETE FROM {journal} AS j
        USING unnest(p_run_ids, p_metas) WITH ORDINALITY AS b(run_id, meta, n)
        WHERE v_ok[b.n] AND b.meta ? 't' AND j.run_id = b.run_id
            AND j.step > COALESCE((b.meta->>'k')::bigint, (b.meta->>'t')::bigint);
    END IF;
    INSERT INTO {steps} (run_id, seq, agent, body)
    SELECT b.run_id, (x->>0)::bigint, x->>1,
        substring(b.blob FROM (x->>2)::integer FOR (x->>3)::integer)
    FROM unnest(p_run_ids, p_metas, p_blobs) WITH ORDINALITY AS b(run_id, meta, blob, n),
        jsonb_array_elements(b.meta->'s') AS x
    WHERE v_ok[b.n]
    ON CONFLICT (run_id, seq) DO UPDATE SET agent = EXCLUDED.agent, body = EXCLUDED.body;
    INSERT INTO {events} (run_id, seq, at, kind, body)
    SELECT b.run_id, (x->>0)::bigint, (x->>1)::double precision, x->>2,
        substring(b.blob FROM (x->>3)::integer FOR (x->>4)::integer)
    FROM unnest(p_run_ids, p_metas, p_blobs) WITH ORDINALITY AS b(run_id, meta, blob, n),
        jsonb_array_elements(b.meta->'e') AS x
    WHERE v_ok[b.n]
    ON CONFLICT (run_id, seq) DO NOTHING;
    INSERT INTO {journal} (run_id, step, position, body)
    SELECT b.run_id, (x->>0)::bigint, (x->>1)::integer,
        substring(b.blob FROM (x->>2)::integer FOR (x->>3)::integer)
    FROM unnest(p_run_ids, p_metas, p_blobs) WITH ORDINALITY AS b(run_id, meta, blob, n),
        jsonb_array_elements(b.meta->'j') AS x
    WHERE v_ok[b.n]
    ON CONFLICT (run_id, step, position) DO UPDATE SET body = EXCLUDED.body;
    INSERT INTO {checkpoints} (checkpoint_id, run_id, seq, created_at, reason, body)
    SELECT x->>0, b.run_id, (x->>1)::bigint, (x->>2)::double precision, x->>3,
        substring(b.blob FROM (x->>4)::integer FOR (x->>5)::integer)
    FROM unnest(p_run_ids, p_metas, p_blobs) WITH ORDINALITY AS b(run_id, meta, blob, n),
        jsonb_array_elements(b.meta->'c') AS x
    WHERE v_ok[b.n]
    ON CONFLICT (checkpoint_id) DO UPDATE SET
        run_id = EXCLUDED.run_id, seq = EXCLUDED.seq, created_at = EXCLUDED.created_at,
        reason = EXCLUDED.reason, body = EXCLUDED.body;
    -- The pruned ids first: then the primary key finds each, where a scan of a run's
    -- index would walk every pruned checkpoint not yet vacuumed.
    SELECT array_agg(p.id), array_agg(b.run_id) INTO v_pruned, v_pruned_runs
    FROM unnest(p_run_ids, p_metas) WITH ORDINALITY AS b(run_id, meta, n),
        jsonb_array_elements_text(b.meta->'p') AS p(id)
    WHERE v_ok[b.n];
    IF v_pruned IS NOT NULL THEN
        DELETE FROM {checkpoints} AS c USING unnest(v_pruned, v_pruned_runs) AS p(id, run_id)
        WHERE c.checkpoint_id = p.id AND c.run_id = p.run_id;
    END IF;
    RETURN ARRAY(
        SELECT CASE WHEN v_ok[b.n] THEN b.fence ELSE r.fence END
        FROM unnest(p_run_ids, p_fences) WITH ORDINALITY AS b(run_id, fence, n)
        LEFT JOIN {runs} AS r ON r.run_id = b.run_id
        ORDER BY b.n
    );
END
$fn$
"""
"""Version 6: ``{commit_many}``, many runs' commits at once (group commit), each fenced on
its own: what ``{commit}`` does, set by set instead of run by run (one statement per kind
of record for the whole group). Runs must be distinct (a run's second commit in the group
would find its first one's writes not yet there); it returns, per commit in their order,
what ``{commit}`` returns. Written out: never edit a migration."""

_RUNS_PARENT_INDEX = """
    CREATE INDEX {runs_parent_idx} ON {runs} (parent_run, created_at DESC, run_id DESC)
    WHERE parent_run IS NOT NULL
"""
"""Version 7: the runs forked from a run, newest first (``list_forks``), found by their
parent; only forks are in it, and no commit updates its columns, so a commit's update of
the run row stays a HOT update. Written out: never edit a migration."""

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
    [_COMMIT_MANY_FUNCTION],
    [_RUNS_PARENT_INDEX],
]
"""The schema's history: index ``i`` upgrades version ``i`` to ``i + 1``."""

READABLE_FROM = 5
"""The oldest schema version a reader (a store opened ``read_only``) reads as it is: the
first with every table a read uses (version 6 added a function only, version 7 an index,
without which a reader's ``list_forks`` reads the whole table). A migration that changes a
table or adds one the reads use raises it to that migration's version."""
