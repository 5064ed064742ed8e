"""Constants in one place: names, prefixes, defaults and limits."""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

MAX_NAME_LENGTH = 200
"""Longest run id, agent or pipeline name accepted."""

HOME_ENV = "NESTEGG_HOME"
STORE_ENV = "NESTEGG_STORE"
DEFAULT_HOME = "~/.nestegg"
DEFAULT_DB_NAME = "nestegg.db"

DEFAULT_LEASE = timedelta(seconds=30)
"""How long an owner's lease lasts; a heartbeat renews it every third of that."""

DEFAULT_TABLE_PREFIX = "nestegg_"
DEFAULT_KEY_PREFIX = "nestegg:"

SQLITE_BUSY_TIMEOUT_MS = 10_000


class StoredValue(StrEnum):
    """A name stored as its value: prints, formats and reprs as that plain string, so
    messages and stored text are the same as with the string itself."""

    def __repr__(self) -> str:
        return repr(self.value)


class RunStatus(StoredValue):
    """A run's status, stored as its value."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    WAITING = "waiting"


class StepOutcome(StoredValue):
    """How a step ended, stored as its value."""

    COMPLETED = "completed"
    TERMINATED = "terminated"
    HANDOVER = "handover"


class CheckpointReason(StoredValue):
    """Why a checkpoint was taken, stored as its value."""

    POLICY = "policy"
    MANUAL = "manual"
    AGENT = "agent"
    FINAL = "final"
    FORK = "fork"


TRACE_KEY = "trace"
"""The key of a run's opening event's payload that holds the attempt's trace context."""


class EventKind(StoredValue):
    """The kind of an event, stored as its value."""

    RUN_STARTED = "run_started"
    RUN_INTERRUPTED = "run_interrupted"
    RUN_RESUMED = "run_resumed"
    RUN_FORKED = "run_forked"
    RUN_COMPLETED = "run_completed"
    RUN_FAILED = "run_failed"
    RUN_CANCELLED = "run_cancelled"
    RUN_WAITING = "run_waiting"
    SIGNAL_RECEIVED = "signal_received"
    STEP_STARTED = "step_started"
    STEP_COMPLETED = "step_completed"
    STEP_FAILED = "step_failed"
    CHECKPOINT_SAVED = "checkpoint_saved"
    CHECKPOINT_PRUNED = "checkpoint_pruned"


# The members under their short names (equal to their values as strings).
RUNNING = RunStatus.RUNNING
COMPLETED = RunStatus.COMPLETED
FAILED = RunStatus.FAILED
CANCELLED = RunStatus.CANCELLED
WAITING = RunStatus.WAITING
STATUSES = tuple(RunStatus)
INTERRUPTED = "interrupted"
"""Not a stored status: a running run whose owner is gone, as listings and events name it."""
QUEUED = "queued"
"""Not a stored status: a running run no owner ever claimed (stored for workers, none took
it yet), as listings show it and a ``run_cancelled`` event names what it was."""
SHOWN_RUNNING = (INTERRUPTED, QUEUED)
"""What a listing shows a running run as besides ``running``: filtering by one reads the
running runs and keeps those it fits (see ``ownership.run_state``)."""
LISTED_STATUSES = (*STATUSES, *SHOWN_RUNNING)
"""The statuses a listing of runs filters by (``nestegg runs --status``, the inspector)."""
DAMAGED = "damaged"
"""Not a stored status: how a listing shows a run whose record cannot be read."""
MISSING = "missing"
"""Not a stored outcome: how a timeline shows a step the run counts whose record is gone."""
FINISHED = (COMPLETED, FAILED, CANCELLED)
CANCEL_CLAIM_TRIES = 5
"""Claims a cancel from outside tries when other processes claim the run meanwhile."""
CANCEL_SETTLE_SECONDS = 0.5
"""How long a process that lost its run (or its claim) to another claim reads the run
again to learn whether that claim was a cancel's, which stores the cancel just after."""
CANCEL_SETTLE_POLL_SECONDS = 0.01
CANCEL_LOOK_SECONDS = 1.0
"""How long a wait for a run's result that timed out reads the run, at most, to say that
its cancel was requested (a store that takes longer leaves that unsaid)."""
NO_DEADLINE = 253402300799.0
"""The lease_until of a run that waits for its signal without a deadline (9999-12-31)."""

OUTCOME_COMPLETED = StepOutcome.COMPLETED
OUTCOME_TERMINATED = StepOutcome.TERMINATED
OUTCOME_HANDOVER = StepOutcome.HANDOVER

REASON_POLICY = CheckpointReason.POLICY
REASON_MANUAL = CheckpointReason.MANUAL
REASON_AGENT = CheckpointReason.AGENT
REASON_FINAL = CheckpointReason.FINAL
REASON_FORK = CheckpointReason.FORK

RUN_STARTED = EventKind.RUN_STARTED
RUN_INTERRUPTED = EventKind.RUN_INTERRUPTED
RUN_RESUMED = EventKind.RUN_RESUMED
RUN_FORKED = EventKind.RUN_FORKED
RUN_COMPLETED = EventKind.RUN_COMPLETED
RUN_FAILED = EventKind.RUN_FAILED
RUN_CANCELLED = EventKind.RUN_CANCELLED
RUN_WAITING = EventKind.RUN_WAITING
SIGNAL_RECEIVED = EventKind.SIGNAL_RECEIVED
STEP_STARTED = EventKind.STEP_STARTED
STEP_COMPLETED = EventKind.STEP_COMPLETED
STEP_FAILED = EventKind.STEP_FAILED
CHECKPOINT_SAVED = EventKind.CHECKPOINT_SAVED
CHECKPOINT_PRUNED = EventKind.CHECKPOINT_PRUNED
LARGEST_NUMBER = 2**63 - 1
"""The largest count or sequence number taken from a user (a store's 64-bit integer)."""
LONGEST_DURATION_DAYS = 999_999_999
"""The longest duration a command or the inspector takes (``999999999d``): the longest a
``timedelta`` holds in whole days."""
LATEST_TIME = 253402300799.0
"""The last second of the year 9999 (UNIX seconds): a later time is one no listing can show."""
LIVE_STEP_DELAY = 0.05
"""Seconds after a step starts (durability "sync") at which its start is committed on its
own, for the live views, if no journaled call of the step has carried it yet; a step that
ends sooner commits its start with its end, at no extra cost."""
DEFERRED_WRITES_DELAY = LIVE_STEP_DELAY
"""Seconds a LangGraph task's writes (NestEggSaver, ``defer_writes=True``) wait for the
checkpoint that follows them before they are committed on their own: a task that ended
while a sibling runs on is durable this soon after, and a step whose tasks all end sooner
commits them with its checkpoint, at no extra cost (the delay of LIVE_STEP_DELAY)."""
DEFERRED_WRITES_LINGER = 1.0
"""Seconds the thread that commits a saver's waiting writes stays without any before it
ends (the next deferred write starts another)."""
CALL_JOURNALED = "call_journaled"
"""Not a stored event kind: how `nestegg events --follow` shows a call the step in flight
has journaled (read from the journal)."""
IN_FLIGHT_EVENT_WINDOW = 64
"""How many of a run's last events `nestegg show` reads to find the step in flight (all of
them when its start is further back)."""

# SQLite store: table names and limits.
SQLITE_RUNS_TABLE = "runs"
SQLITE_STEPS_TABLE = "steps"
SQLITE_CHECKPOINTS_TABLE = "checkpoints"
"""Version 1 of the schema: one row per event (version 2 moved them to batches)."""
SQLITE_EVENT_BATCHES_TABLE = "event_batches"
SQLITE_GROUP_STEPS_TABLE = "group_steps"
"""Step records written by group commits, in the order written (see sqlite/group_writes)."""
SQLITE_GROUP_EVENT_BATCHES_TABLE = "group_event_batches"
"""Event batches written by group commits, in the order written."""
SQLITE_JOURNAL_TABLE = "journal"
SQLITE_STEP_BLOCKS_TABLE = "step_blocks"
SQLITE_THREADS_TABLE = "lg_threads"
"""LangGraph threads (nestegg.langgraph), apart from runs: one row per thread."""
SQLITE_THREAD_ROWS_TABLE = "lg_rows"
"""The rows (checkpoints, channel values, writes) of LangGraph threads."""
SQLITE_SIGNALS_TABLE = "signals"
STEP_BLOCK_STEPS = 256
"""Step records the SQLite store packs into one block (steps k*256+1 to (k+1)*256)."""
STEP_BLOCK_MAX_BYTES = 4 * 1024 * 1024
"""A block whose records are larger than this is not packed: records that big cost
little per row, and a block is written and read in one piece."""
SQLITE_WAL_CHECKPOINT_PAGES = 1000
"""WAL pages (4 KiB each, estimated from the writes' sizes) after which the store's WAL
thread copies the WAL back into the database, at most once per
SQLITE_WAL_CHECKPOINT_INTERVAL.

Each such checkpoint syncs the WAL and the database, and while the OS writes out what it
syncs, a write on the same disk may stall: the fewer pages a sync has to write, the
shorter such a stall. At 1,000 runs whose steps wait ~500 ms, a checkpoint every 1,000
pages instead of every 4,000 took the p99 step commit from 18.8 to 12.3 ms on a VM's ext4
disk (bench/concurrent_runs.py, docs/benchmarks.md)."""
SQLITE_WAL_CHECKPOINT_INTERVAL = 0.05
"""Seconds at least between two WAL checkpoints of one store: a single busy run, whose
writes fill 1,000 pages many times a second, is checkpointed about as often as with
4,000 pages, so its steps do not pay for more syncs."""
SQLITE_WAL_AUTOCHECKPOINT_PAGES = 16000
"""WAL pages after which SQLite's own automatic checkpoint runs in a committing writer: a
backstop behind the store's WAL thread (for writers that count nothing: other processes,
short-lived stores)."""
SQLITE_INLINE_WRITE_BYTES = 64 * 1024
"""Commits up to this size may run on the event loop's thread (see sqlite_connection)."""
SQLITE_INLINE_BATCH_BYTES = 1024 * 1024
"""A group commit's batch up to this size may run on the event loop's thread, as a commit
alone does (if it has at most SQLITE_INLINE_BATCH_COMMITS commits)."""
SQLITE_INLINE_BATCH_COMMITS = 16
"""A group commit's batch of more commits runs on the store's worker thread, in a few
statements (sqlite/group_writes.py), while the loop goes on with the other runs: SQLite's
work then uses a second core (bench/concurrent_runs.py, docs/benchmarks.md)."""
SQLITE_PAGE_SIZE = 4096
"""Bytes of a database page (SQLite's default)."""
SQLITE_PAGES_PER_WRITE = 8
"""WAL pages a checkpointed step writes, about (to space WAL checkpoints by writes)."""
SQLITE_JOURNAL_SIZE_LIMIT = 20 * 1024 * 1024
"""Bytes the WAL file is cut back to after a checkpoint: above its usual size between two
checkpoints, so it is not cut and regrown every time."""

# File store: the layout under its root directory.
FILE_RUNS_DIR = "runs"
FILE_NAME_MAX_BYTES = 255
"""The longest file name (in bytes) the file store gives a run or checkpoint id."""
FILE_CHECKPOINT_INDEX_DIR = "checkpoint-index"
FILE_STAGING_DIR = "staging"
FILE_TRASH_DIR = "trash"
FILE_RUN = "run.json"
FILE_INPUT = "input.json"
FILE_LOCK = "run.lock"
FILE_STEPS_LOG = "steps.log"
FILE_EVENTS_LOG = "events.log"
FILE_JOURNAL_LOG = "journal.log"
FILE_SIGNALS_LOG = "signals.log"
FILE_CHECKPOINTS_DIR = "checkpoints"
FILE_PENDING_COMMIT = "pending-commit.json"
FILE_UNREADABLE_REASON = "unreadable"
"""The reason given to a checkpoint file whose header cannot be read (its bytes are returned)."""
FILE_LEFTOVER_SECONDS = 3600
"""Age after which a staging or trash directory is taken for the leftover of a crash."""

# What a store takes at once, on every store alike.
RECORD_MAX_BYTES = 64 * 1024 * 1024
"""The largest value nestegg stores as one record, encoded (64 MiB): the input, a step's
data or metadata, the result, a journaled call's result, a signal's value. A larger one
fails with RecordTooLargeError before it reaches the store, whichever store, so that a
pipeline that runs on SQLite runs on a server store too: PostgreSQL takes at most 1 GB in
one message (a commit's records travel in one parameter) and Redis 512 MB in one argument
(proto-max-bulk-len). The margin is wide because a commit holds several records (a step's
data, its checkpoint, the journaled calls of its step), not one."""
COMMIT_MAX_BYTES = 4 * RECORD_MAX_BYTES
"""The largest commit a store is given, its records' bodies added up (256 MiB): room for
a few records at RECORD_MAX_BYTES, well under PostgreSQL's 1 GB message and Redis's 512 MB
argument. A larger one (many journaled calls of one step, a run with durability "exit")
fails with RecordTooLargeError naming its run and step before any store writes it."""

# Server stores (PostgreSQL and Redis).
PG_POOL_MIN_SIZE = 1
PG_POOL_MAX_SIZE = 10
PG_PREPARE_THRESHOLD = 5
"""psycopg prepares a statement after this many uses; None disables it (PgBouncer)."""
MAX_TABLE_PREFIX_LENGTH = 32
MAX_KEY_PREFIX_LENGTH = 100
STORE_CONNECT_TIMEOUT = 10.0
"""Seconds to wait for a server connection before StorageUnavailableError."""
STORE_RETRIES = 4
"""Retries of an idempotent store operation after a connection failure."""
STORE_RETRY_BASE_DELAY = 0.1
STORE_RETRY_MAX_DELAY = 2.0
REDIS_MAX_CONNECTIONS = 50
REDIS_TRANSPORT_CONNECTIONS = 100
"""The connections of a Redis Streams transport's pool unless its URL says
(``?max_connections=``): a publish while all are in use waits for one (20 s at most,
redis-py's pool timeout, ``?timeout=``), and a consumer's blocking read holds one."""
SERVER_BATCHES_IN_FLIGHT = 4
"""Group commit on a server store: batches of commits under way at once, each on its own
connection (see nestegg.checkpoint.stores.group)."""
MAX_PENDING_COMMITS: int | None = None
"""A group-committing store's commits waiting to be written or being written, at most,
before the runs of the process wait to start their next steps (see
nestegg.checkpoint.stores.step_gate); None: no limit. No limit by default: a limit makes a
commit quick with a thousand runs whose steps never wait, at the cost of some of their
aggregate (bench/concurrent_runs.py --pending, docs/benchmarks.md)."""

# The nestegg command: exit codes, defaults and the export format.
EXIT_OK = 0
EXIT_FAILED = 1
"""An operation failed (a run failed, a write was refused, the user declined)."""
EXIT_USAGE = 2
"""Bad usage: an unknown option, a bad value, a store URL or --app that cannot be used,
broker settings the broker refuses (a worker's login, vhost or database)."""
EXIT_NOT_FOUND = 3
"""No such run, checkpoint or path inside a state."""
EXIT_UNAVAILABLE = 4
"""The store cannot be reached."""
EXIT_WAITING = 5
"""The run waits for a signal or a timer (``nestegg resume`` of a run whose wait is not
over: nothing ran)."""
EXIT_INTERRUPTED = 130
"""Ctrl-C."""
CLI_RUN_LIMIT = 50
"""Runs `nestegg runs` lists unless --limit says otherwise."""
CHECKPOINT_LISTING_BATCH = 500
"""Runs whose checkpoints one read of a store lists (``list_checkpoints_of``; below
SQLite's 999 parameters of old builds): `nestegg runs` and `nestegg prune` read those of
every run they list, a round trip each before (10,000 runs: 3 to 6 s)."""
FORK_SCAN = 5000
"""Runs of a run's pipeline newer than it read at most, a page of FORK_SCAN_PAGE at a
time, to find the runs forked from it in a store without an index of them (no
``ForkListing``): the web inspector's run page and `nestegg show` then say the list may
be incomplete."""
FORK_SCAN_PAGE = 500
CLI_SHOW_STEPS = 30
CLI_SHOW_FORKS = 30
"""Forks of a run `nestegg show` lists, newest first, unless --all (--json: all)."""
CLI_VALUE_CHARS = 200
"""Characters of a string that inspect and diff show before cutting it (--full: all)."""
CLI_VALUE_ITEMS = 100
"""Items of a list or keys of a dict that inspect and diff show before cutting it."""
"""Steps `nestegg show` lists (the newest) unless --all."""
CLI_POLL_INTERVAL = 1.0
"""Seconds between polls of `nestegg events --follow`."""
CLI_RECOVER_CONCURRENCY = 100
"""Runs `nestegg recover` resumes at once unless --concurrency says otherwise: each takes
about as long as it took to run (its steps wait on a model), so at 4, the default before,
the thousands of runs a process held when it died took most of an hour to come back;
`clutch.recover()` resumes them all at once."""
EXPORT_FORMAT = "nestegg-run"
EXPORT_VERSION = 1


YIELD_EVERY_STEPS = 64
"""Steps after which a run yields to the event loop even if its agents never wait, so
``run(timeout=...)``, ``cancel()`` and other tasks get in (a hand-over without data does
not count as a turn, so it can loop for ever, as in eggai-clutch)."""
