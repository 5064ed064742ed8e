"""The Redis layout of nestegg: keys (and the check of their prefix), Lua scripts, how
records are encoded, and how a command is packed.

Each change to a run is one atomic Lua script.

Keys of one run (``KEYS`` in this order for the scripts that take a run)::

    1 <prefix>run:<id>               hash: the run's fields (absent field = None)
    2 <prefix>steps:<id>             sorted set: step records, score seq
    3 <prefix>events:<id>            sorted set: events, score seq
    4 <prefix>journal:<id>           hash: "<step>:<position>" -> sealed body
    5 <prefix>journal_index:<id>     sorted set: journal fields, score step
    6 <prefix>checkpoints:<id>       hash: checkpoint id -> encoded checkpoint
    7 <prefix>checkpoint_order:<id>  sorted set: checkpoint ids, score seq

A run's signals are in ``<prefix>signals:<id>`` (hash: name -> "<at> <sealed body>"),
which the scripts reach through the prefix.

Shared keys: ``<prefix>checkpoint:<checkpoint id>`` (string: its run id),
``<prefix>runs`` and ``<prefix>pipeline:<name>`` (sorted sets of run ids by created_at),
``<prefix>forks:<run id>`` (sorted set of the ids of the runs forked from that run, by
created_at: written with the fork's run, removed with it; it expires with that run),
``<prefix>store`` (string
``nestegg``, written by ``setup()``: a store is there, with or without runs;
:data:`STORE_MARKS` are the keys that say so) and ``<prefix>layout`` (the layout version,
:data:`LAYOUT_VERSION`, written by a writer's ``setup()`` once the store has what that
version adds; none: version 0, a store set up before forks were indexed).
Scripts that need shared keys get the prefix as ``ARGV[1]``.

When a store sets a time-to-live for finished runs, the commit script sets Redis expiry
on all keys of a run (its checkpoint mapping keys included) once the run is finished,
and the claim script removes it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

from nestegg.checkpoint.records import (
    CheckpointRecord,
    EventRecord,
    Owner,
    RunRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.common import ChangeSet
from nestegg.constants import FINISHED, MAX_KEY_PREFIX_LENGTH
from nestegg.errors import ConfigurationError, InvalidIdentifierError

_FLOAT_FIELDS = ("created_at", "updated_at", "lease_until")
_INT_FIELDS = ("fence", "step_seq", "event_seq")
_BYTES_FIELDS = ("input", "result", "error")
_TEXT_FIELDS = ("run_id", "pipeline", "status", "parent_run", "parent_checkpoint")

RUN_KEY_KINDS = (
    "run:",
    "steps:",
    "events:",
    "journal:",
    "journal_index:",
    "checkpoints:",
    "checkpoint_order:",
)
"""Kinds of the keys of one run, in the order the scripts take them as KEYS."""

STORE_KEY = "store"
"""The key (after the prefix) that ``setup()`` writes: a nestegg store is under the prefix."""
LAYOUT_KEY = "layout"
"""The key (after the prefix) holding the layout version a writer's ``setup()`` brought the
store to."""
LAYOUT_VERSION = 1
"""The layout this nestegg writes. Version 1 indexes the runs forked from a run
(``forks:<run id>``); a writer's ``setup()`` builds the index of a store of version 0 from
its runs, and a reader of one lists forks by reading every run."""
STORE_MARKS = (STORE_KEY, "runs", "lg:threads")
"""Keys (after the prefix) of which one is there under the prefix of a store: its mark,
or, in a store set up before it had one, its runs' or its LangGraph threads' index."""

_BAD_PREFIX = re.compile(r"[\s*?\[\]\\\x00-\x1f\x7f]")
_ZADD_PAIRS = 500
"""Score-member pairs per ZADD in a script (Lua's unpack has a limit on values)."""

_FINISHED_LUA = "{" + ", ".join(f"[{status!r}] = true" for status in FINISHED) + "}"

_SET_EXPIRY = """
-- The run's keys, its signals and the index of its forks (which lives as long as the run:
-- once it is gone, nothing lists its forks) expire with the run.
local function set_expiry(prefix, ttl)
    local ids = redis.call('HKEYS', KEYS[6])
    local run_id = string.sub(KEYS[1], #prefix + 5)
    local own = {prefix .. 'signals:' .. run_id, prefix .. 'forks:' .. run_id}
    local finished = __FINISHED__
    if finished[redis.call('HGET', KEYS[1], 'status')] then
        for k = 1, 7 do redis.call('EXPIRE', KEYS[k], ttl) end
        for _, key in ipairs(own) do redis.call('EXPIRE', key, ttl) end
        for _, id in ipairs(ids) do redis.call('EXPIRE', prefix .. 'checkpoint:' .. id, ttl) end
    else
        for k = 1, 7 do redis.call('PERSIST', KEYS[k]) end
        for _, key in ipairs(own) do redis.call('PERSIST', key) end
        for _, id in ipairs(ids) do redis.call('PERSIST', prefix .. 'checkpoint:' .. id) end
    end
end
""".replace("__FINISHED__", _FINISHED_LUA)

CREATE_RUN = """
-- KEYS: run, runs index, pipeline index, and for a fork its parent's forks index.
-- ARGV: created_at, run_id, field, value, ...
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
for k = 2, #KEYS do redis.call('ZADD', KEYS[k], ARGV[1], ARGV[2]) end
return 1
"""

CLAIM_RUN = (
    _SET_EXPIRY
    + """
-- KEYS: the run's 7 keys. ARGV: prefix, ttl, expected fence, reopen ('1': a finished
-- run too), field, value, ...
local stored = redis.call('HMGET', KEYS[1], 'fence', 'status')
local fence, status = stored[1], stored[2]
if not fence then return {0} end
if fence ~= ARGV[3] then return {-1, fence} end
local finished = __FINISHED__
if ARGV[4] ~= '1' and finished[status] then return {-2, status} end
redis.call('HINCRBY', KEYS[1], 'fence', 1)
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
if ARGV[2] ~= '0' then set_expiry(ARGV[1], ARGV[2]) end
return {1, redis.call('HGETALL', KEYS[1])}
""".replace("__FINISHED__", _FINISHED_LUA)
)

COMMIT = (
    _SET_EXPIRY
    + """
-- KEYS: the run's 7 keys. ARGV: prefix, ttl, run_id, fence, truncate_after ('' = none),
-- journal_after (the journal kept through this step when truncating),
-- then counted groups: steps (seq, member), events (seq, member),
-- journal (step, field, body), checkpoints (id, seq, value), prune (id),
-- run fields (field, value).
-- Returns the fence the commit carried when it was applied, the stored (newer) fence when
-- the commit is stale, nil when there is no such run: one integer to parse.
local prefix, run_id = ARGV[1], ARGV[3]
local fence = redis.call('HGET', KEYS[1], 'fence')
if not fence then return false end
if fence ~= ARGV[4] then return tonumber(fence) end
local after = ARGV[5]
if after ~= '' then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '(' .. after, '+inf')
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '(' .. after, '+inf')) do
        redis.call('HDEL', KEYS[6], id)
        redis.call('DEL', prefix .. 'checkpoint:' .. id)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[7], '(' .. after, '+inf')
    local journal_after = ARGV[6]
    for _, field in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. journal_after, '+inf')) do
        redis.call('HDEL', KEYS[4], field)
    end
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '(' .. journal_after, '+inf')
end
local i = 7
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
    redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[i], ARGV[i])
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i + 1])
    i = i + 2
end
n = tonumber(ARGV[i]); i = i + 1
local last = i + 2 * n - 1
while i <= last do  -- one ZADD for up to _ZADD_PAIRS events
    local stop = math.min(i + 2 * __ZADD_PAIRS__ - 1, last)
    redis.call('ZADD', KEYS[3], unpack(ARGV, i, stop))
    i = stop + 1
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
    redis.call('HSET', KEYS[4], ARGV[i + 1], ARGV[i + 2])
    redis.call('ZADD', KEYS[5], ARGV[i], ARGV[i + 1])
    i = i + 3
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
    redis.call('HSET', KEYS[6], ARGV[i], ARGV[i + 2])
    redis.call('ZADD', KEYS[7], ARGV[i + 1], ARGV[i])
    redis.call('SET', prefix .. 'checkpoint:' .. ARGV[i], run_id)
    i = i + 3
end
n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
    if redis.call('HDEL', KEYS[6], ARGV[i]) == 1 then
        redis.call('ZREM', KEYS[7], ARGV[i])
        redis.call('DEL', prefix .. 'checkpoint:' .. ARGV[i])
    end
    i = i + 1
end
n = tonumber(ARGV[i]); i = i + 1
if n > 0 then redis.call('HSET', KEYS[1], unpack(ARGV, i, i + 2 * n - 1)) end
if ARGV[2] ~= '0' then set_expiry(prefix, ARGV[2]) end
return tonumber(ARGV[4])
"""
).replace("__ZADD_PAIRS__", str(_ZADD_PAIRS))

DELETE_RUN = """
-- KEYS: the run's 7 keys, then the runs index.
-- ARGV: prefix, run_id, updated_before ('' = delete whatever the run's state), statuses...
local run = KEYS[1]
local fields = redis.call('HMGET', run, 'pipeline', 'status', 'updated_at', 'parent_run')
if not fields[1] then
    redis.call('ZREM', KEYS[8], ARGV[2])
    return 0
end
if ARGV[3] ~= '' then
    if tonumber(fields[3]) >= tonumber(ARGV[3]) then return 0 end
    local match = false
    for k = 4, #ARGV do if ARGV[k] == fields[2] then match = true end end
    if not match then return 0 end
end
for _, id in ipairs(redis.call('HKEYS', KEYS[6])) do
    redis.call('DEL', ARGV[1] .. 'checkpoint:' .. id)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
redis.call('DEL', ARGV[1] .. 'signals:' .. ARGV[2])
redis.call('ZREM', KEYS[8], ARGV[2])
redis.call('ZREM', ARGV[1] .. 'pipeline:' .. fields[1], ARGV[2])
if fields[4] then redis.call('ZREM', ARGV[1] .. 'forks:' .. fields[4], ARGV[2]) end
return 1
"""

DELETE_CHECKPOINTS = """
-- KEYS: checkpoints hash, checkpoint order. ARGV: prefix, checkpoint ids...
local gone = 0
for k = 2, #ARGV do
    if redis.call('HDEL', KEYS[1], ARGV[k]) == 1 then
        redis.call('ZREM', KEYS[2], ARGV[k])
        redis.call('DEL', ARGV[1] .. 'checkpoint:' .. ARGV[k])
        gone = gone + 1
    end
end
return gone
"""

GET_CHECKPOINT = """
-- KEYS: the checkpoint's mapping key. ARGV: prefix, checkpoint id.
local run_id = redis.call('GET', KEYS[1])
if not run_id then return false end
local value = redis.call('HGET', ARGV[1] .. 'checkpoints:' .. run_id, ARGV[2])
if not value then
    redis.call('DEL', KEYS[1])
    return false
end
return {run_id, value}
"""

RUNS_OF_STATUS = """
-- KEYS: run hashes. ARGV: the statuses wanted. For each run: its hash when its status is
-- one wanted, 1 when it is another, 0 when the run is gone (expired): a listing filtered by
-- status sends and parses only the runs it shows (the index holds every run).
local wanted = {}
for _, status in ipairs(ARGV) do wanted[status] = true end
local out = {}
for i, key in ipairs(KEYS) do
    local status = redis.call('HGET', key, 'status')
    if not status then
        out[i] = 0
    elseif wanted[status] then
        out[i] = redis.call('HGETALL', key)
    else
        out[i] = 1
    end
end
return out
"""

LIST_FORKS = """
-- KEYS: layout, the run's forks index. ARGV: start, stop (ranks, newest first).
-- The ids of forks in that range; false when the store's layout has no forks index yet.
if (tonumber(redis.call('GET', KEYS[1])) or 0) < 1 then return false end
return redis.call('ZREVRANGE', KEYS[2], ARGV[1], ARGV[2])
"""

INDEX_FORKS = """
-- KEYS: run hashes. ARGV: prefix. Each run that is a fork goes in its parent's forks
-- index (layout version 1, built on setup from the runs of a store of version 0).
for _, key in ipairs(KEYS) do
    local run = redis.call('HMGET', key, 'parent_run', 'created_at', 'run_id')
    if run[1] and run[2] and run[3] then
        redis.call('ZADD', ARGV[1] .. 'forks:' .. run[1], run[2], run[3])
    end
end
return #KEYS
"""

LIST_CHECKPOINTS = """
-- KEYS: the run's checkpoint order, the run's checkpoints. One round trip and one command
-- for the client to send (a MULTI/EXEC pipeline costs it several times the CPU).
return {redis.call('ZRANGE', KEYS[1], 0, -1), redis.call('HGETALL', KEYS[2])}
"""

PUT_SIGNAL = """
-- KEYS: run, the run's signals. ARGV: name, "<at> <body>", replace ('1' or '0').
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if ARGV[3] == '1' then
    redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
    return 1
end
return redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
"""

READ_JOURNAL = """
-- KEYS: journal hash, journal index. ARGV: step.
local fields = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[1])
if #fields == 0 then return {} end
return {fields, redis.call('HMGET', KEYS[1], unpack(fields))}
"""


# -- how records are encoded in hashes and sorted sets ----------------------------------


def _text(raw: bytes) -> str:
    return raw.decode()


def validate_key_prefix(prefix: str) -> str:
    """Check a Redis key prefix: not empty, no whitespace, control or glob characters.

    Raises:
        InvalidIdentifierError: the prefix is not allowed.
    """
    if (
        not isinstance(prefix, str)
        or not prefix
        or len(prefix) > MAX_KEY_PREFIX_LENGTH
        or _BAD_PREFIX.search(prefix)
    ):
        raise InvalidIdentifierError(
            f"key prefix {prefix!r} is not allowed: 1 to {MAX_KEY_PREFIX_LENGTH} characters "
            "without spaces, newlines, control characters or any of * ? [ ] \\"
        )
    return prefix


def ttl_seconds(value: timedelta | float | None) -> int:
    """Seconds of a time-to-live setting; 0 for none.

    Raises:
        ConfigurationError: under one second.
    """
    if value is None:
        return 0
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        raise ConfigurationError(
            f"expire_finished_after must be at least one second, got {value!r}"
        )
    return int(seconds)


def run_fields(run: RunRecord) -> dict[str, Any]:
    """The run hash fields of a run (None fields left out)."""
    fields: dict[str, Any] = {
        "run_id": run.run_id,
        "pipeline": run.pipeline,
        "status": run.status,
        "input": run.input,
        "created_at": repr(run.created_at),
        "updated_at": repr(run.updated_at),
        "fence": run.fence,
        "step_seq": run.step_seq,
        "event_seq": run.event_seq,
    }
    optional: dict[str, Any] = {
        "lease_until": None if run.lease_until is None else repr(run.lease_until),
        "result": run.result,
        "error": run.error,
        "parent_run": run.parent_run,
        "parent_checkpoint": run.parent_checkpoint,
    }
    if run.owner is not None:
        optional |= owner_fields(run.owner)
    fields |= {key: value for key, value in optional.items() if value is not None}
    return fields


def owner_fields(owner: Owner) -> dict[str, Any]:
    """The run hash fields of an owner."""
    return {"owner_host": owner.host, "owner_pid": owner.pid, "owner_started": owner.started}


def run_from_hash(raw: dict[bytes, bytes]) -> RunRecord:
    """A RunRecord from the run hash."""
    fields = {key.decode(): value for key, value in raw.items()}
    values: dict[str, Any] = {}
    for name in _TEXT_FIELDS:
        if name in fields:
            values[name] = _text(fields[name])
    for name in _FLOAT_FIELDS:
        if name in fields:
            values[name] = float(fields[name])
    for name in _INT_FIELDS:
        if name in fields:
            values[name] = int(fields[name])
    for name in _BYTES_FIELDS:
        if name in fields:
            values[name] = bytes(fields[name])
    if "owner_host" in fields:
        values["owner"] = Owner(
            host=_text(fields["owner_host"]),
            pid=int(fields["owner_pid"]),
            started=_text(fields["owner_started"]),
        )
    return RunRecord(**values)


def pairs_to_dict(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    """A dict from a flat field, value, ... reply (HGETALL inside a script)."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _split_text(rest: bytes, length: int) -> tuple[str, bytes]:
    return rest[:length].decode(), rest[length:]


def step_member(step: StepRecord) -> bytes:
    """``<seq>:<agent length>:<agent><body>``: the sorted-set member of a step."""
    agent = step.agent.encode()
    return b"%d:%d:%b%b" % (step.seq, len(agent), agent, step.body)


def step_from_member(run_id: str, member: bytes) -> StepRecord:
    """A StepRecord from its member."""
    seq, length, rest = member.split(b":", 2)
    agent, body = _split_text(rest, int(length))
    return StepRecord(run_id, int(seq), agent, body)


def event_member(event: EventRecord) -> bytes:
    """``<seq>:<at>:<kind length>:<kind><body>``: the sorted-set member of an event."""
    kind = event.kind.encode()
    return b"%d:%s:%d:%b%b" % (event.seq, repr(event.at).encode(), len(kind), kind, event.body)


def event_from_member(run_id: str, member: bytes) -> EventRecord:
    """An EventRecord from its member."""
    seq, at, length, rest = member.split(b":", 3)
    kind, body = _split_text(rest, int(length))
    return EventRecord(run_id, int(seq), float(at), kind, body)


def checkpoint_value(checkpoint: CheckpointRecord) -> bytes:
    """``<seq>:<created_at>:<reason length>:<reason><body>``: a checkpoint hash value."""
    reason = checkpoint.reason.encode()
    created = repr(checkpoint.created_at).encode()
    return b"%d:%s:%d:%b%b" % (checkpoint.seq, created, len(reason), reason, checkpoint.body)


def checkpoint_from_value(checkpoint_id: str, run_id: str, value: bytes) -> CheckpointRecord:
    """A CheckpointRecord from its hash value."""
    seq, created, length, rest = value.split(b":", 3)
    reason, body = _split_text(rest, int(length))
    return CheckpointRecord(checkpoint_id, run_id, int(seq), float(created), reason, body)


_BULK = b"$%d\r\n%b\r\n"
_pack_in_c: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis-py's parser in C, which nestegg's redis extra installs (redis[hiredis])
    import hiredis

    # its stub wants a tuple of one; hiredis before 2.1 has no packer
    _pack_in_c = getattr(cast(Any, hiredis), "pack_command", None)
except ImportError:  # pragma: no cover - redis without hiredis
    _pack_in_c = None


def command_bytes(args: Sequence[bytes | str | int | float]) -> bytes:
    """One command in the Redis protocol (RESP), packed in one pass (bytes as they are):
    by hiredis (in C) when it is installed and takes the values, else here."""
    if _pack_in_c is not None:
        try:
            return _pack_in_c(tuple(args))
        except TypeError:  # a value it does not pack (a bool, None): as str() writes it
            pass
    return b"*%d\r\n" % len(args) + b"".join(
        [
            _BULK % (len(arg), arg) if type(arg) is bytes else _bulk(str(arg).encode())
            for arg in args
        ]
    )


def _bulk(value: bytes) -> bytes:
    return _BULK % (len(value), value)


def _number(value: int | None) -> bytes:
    return b"" if value is None else b"%d" % value


def _field_value(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return repr(value).encode() if isinstance(value, float) else str(value).encode()


def commit_args(c: ChangeSet) -> list[bytes]:
    """The commit script arguments for a change set, after the prefix and ttl, in its
    order, as bytes (what packs fastest: a group commit packs hundreds at once)."""
    args = [
        c.run_id.encode(),
        b"%d" % c.fence,
        _number(c.truncate_after),
        _number(c.journal_after),
        b"%d" % len(c.steps),
    ]
    for step in c.steps:
        args += (b"%d" % step.seq, step_member(step))
    args.append(b"%d" % len(c.events))
    for event in c.events:
        args += (b"%d" % event.seq, event_member(event))
    args.append(b"%d" % len(c.journal))
    for entry in c.journal:
        args += (b"%d" % entry.step, b"%d:%d" % (entry.step, entry.position), entry.body)
    args.append(b"%d" % len(c.checkpoints))
    for checkpoint in c.checkpoints:
        args += (
            checkpoint.checkpoint_id.encode(),
            b"%d" % checkpoint.seq,
            checkpoint_value(checkpoint),
        )
    args.append(b"%d" % len(c.prune))
    args += [checkpoint_id.encode() for checkpoint_id in c.prune]
    args.append(b"%d" % len(c.run_fields))
    for name, value in c.run_fields.items():
        args += (name.encode(), _field_value(value))
    return args
