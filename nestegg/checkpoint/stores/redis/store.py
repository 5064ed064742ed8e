"""Redis store: redis-py asyncio on plain Redis 6+ (no modules).

Every change to a run is one Lua script, run atomically by Redis: the claim is a
compare-and-set on the run's fencing token, and a commit checks the token, truncates,
appends, prunes and sets the run's fields in one round trip. The key layout is drawn in
:mod:`~nestegg.checkpoint.stores.redis.layout`. Stored values are the sealed bytes as
given. The client, and how commands and scripts go out (one packed EVALSHA on a pool
connection kept between scripts, so that a step's commit skips the pool and redis-py's
per-command work), are :mod:`~nestegg.checkpoint.stores.redis.connection`'s; the listing of
runs from their index is :mod:`~nestegg.checkpoint.stores.redis.run_index`'s.

Finished runs are deleted by :meth:`RedisCheckpointStorage.expire_runs` (what the
policy's ``ttl`` calls); with ``expire_finished_after`` Redis also expires every key of
a run by itself that long after the commit that finished it (a later claim removes the
expiry). Index entries of runs that Redis expired are dropped lazily when read.

redis-py is imported only in this package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

# The driver: a missing one becomes MissingDependencyError in stores/registry.py (here,
# not only through the modules below, which an earlier import may have left loaded).
import redis  # noqa: F401

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    SignalRecord,
    StepRecord,
)
from nestegg.checkpoint.stores.common import (
    change_set,
    check_size,
    commit_outcome,
    run_claimed,
    run_exists,
    run_finished,
    run_not_found,
)
from nestegg.checkpoint.stores.group import GroupCalls, GroupCommitter, Outcome, run_id_of
from nestegg.checkpoint.stores.redis import layout as redis_layout
from nestegg.checkpoint.stores.redis.connection import Keys, RedisConnection
from nestegg.checkpoint.stores.redis.errors import error_of_reply, outcome_of_reply
from nestegg.checkpoint.stores.redis.layout import (
    RUN_KEY_KINDS,
    STORE_KEY,
    STORE_MARKS,
    checkpoint_from_value,
    commit_args,
    event_from_member,
    owner_fields,
    pairs_to_dict,
    run_fields,
    run_from_hash,
    step_from_member,
    ttl_seconds,
    validate_key_prefix,
)
from nestegg.checkpoint.stores.redis.run_index import SCAN_BATCH, RedisRunIndex
from nestegg.checkpoint.stores.redis.threads import RedisThreadRows
from nestegg.checkpoint.stores.step_gate import pending_limit
from nestegg.constants import (
    DEFAULT_KEY_PREFIX,
    MAX_PENDING_COMMITS,
    REDIS_MAX_CONNECTIONS,
    RUNNING,
    SERVER_BATCHES_IN_FLIGHT,
    STORE_CONNECT_TIMEOUT,
    STORE_RETRIES,
)


class RedisCheckpointStorage(RedisRunIndex, RedisThreadRows):
    """Keeps runs in Redis, shared by every process and machine that reaches it.

    Args:
        url_or_client: a ``redis://`` / ``rediss://`` URL, or a ``redis.asyncio.Redis``
            client created with ``decode_responses=False`` (not closed by :meth:`close`).
        prefix: prefix of every key this store writes.
        expire_finished_after: when set, Redis deletes all keys of a run this long after
            the commit that finished it (completed, failed or cancelled); claiming the
            run again removes the expiry. None keeps finished runs until
            :meth:`expire_runs` or :meth:`delete_run`.
        max_connections: size of the connection pool built from a URL; more concurrent
            operations wait for a free connection.
        connect_timeout: seconds to wait for a connection, or for a reply (clients
            built from a URL).
        retries: retries (with backoff) of reads and commits after a connection failure,
            none starting later than ``connect_timeout`` after the first try; a commit
            is idempotent under its fence, so repeating it is safe.
        read_only: open it for a reader (what the ``nestegg`` commands that only read do):
            :meth:`setup` writes nothing, not even the store's mark, so a Redis user allowed
            only to read and to run scripts can read a store set up before it had one.

        max_pending_commits: the commits waiting to be written or being written, at most,
            before the runs using this store wait to start their next steps (None, the
            default: no limit). With a limit such as 64, a commit is written in
            milliseconds with a thousand runs whose steps never wait, at the cost of some of
            their aggregate steps a second (README, "Steps held back").
    Raises:
        MissingDependencyError: redis-py is not installed.
        InvalidIdentifierError: a bad ``prefix``.
        ConfigurationError: neither a URL nor a client, a client that decodes responses,
            or a bad expiry.

    Example:
        >>> store = RedisCheckpointStorage("redis://cache:6379/0", prefix="enrich:")
        >>> clutch = Clutch("p", checkpoint=CheckpointConfig(storage=store))
    """

    def __init__(
        self,
        url_or_client: Any,
        *,
        prefix: str = DEFAULT_KEY_PREFIX,
        expire_finished_after: timedelta | float | None = None,
        max_connections: int = REDIS_MAX_CONNECTIONS,
        connect_timeout: float = STORE_CONNECT_TIMEOUT,
        retries: int = STORE_RETRIES,
        read_only: bool = False,
        max_pending_commits: int | None = MAX_PENDING_COMMITS,
    ) -> None:
        self.prefix = validate_key_prefix(prefix)
        self.read_only = read_only
        self._ttl = ttl_seconds(expire_finished_after)
        self._conn = RedisConnection(
            url_or_client,
            max_connections=max_connections,
            connect_timeout=connect_timeout,
            retries=retries,
        )
        # Bound once here, not looked up on the connection at every call.
        self._client: Any = self._conn.client
        self._call = self._conn.call
        self._script = self._conn.script
        register = self._client.register_script
        self._create_run = register(redis_layout.CREATE_RUN)
        self._claim_run = register(redis_layout.CLAIM_RUN)
        self._commit = register(redis_layout.COMMIT)
        self._delete_run = register(redis_layout.DELETE_RUN)
        self._delete_checkpoints = register(redis_layout.DELETE_CHECKPOINTS)
        self._get_checkpoint = register(redis_layout.GET_CHECKPOINT)
        self._list_checkpoints = register(redis_layout.LIST_CHECKPOINTS)
        self._runs_of_status = register(redis_layout.RUNS_OF_STATUS)
        self._list_forks = register(redis_layout.LIST_FORKS)
        self._index_forks = register(redis_layout.INDEX_FORKS)
        self._read_journal = register(redis_layout.READ_JOURNAL)
        self._put_signal = register(redis_layout.PUT_SIGNAL)
        self._run_key_kinds = [self._key(kind).encode() for kind in RUN_KEY_KINDS]
        self._commit_head = [self.prefix.encode(), b"%d" % self._ttl]
        self._group = GroupCommitter(
            self._commit_one,
            self._commit_many,
            in_flight=SERVER_BATCHES_IN_FLIGHT,
            max_pending=pending_limit(max_pending_commits, "RedisCheckpointStorage"),
        )
        # Thousands of runs starting at once: their reads, creations and claims go out
        # together too (one pipeline), not one by one through the pool's connections.
        self._get_runs = GroupCalls(self._get_one, self._get_many, str)
        self._create_runs = GroupCalls(self._create_one, self._create_many, run_id_of)
        self._claims = GroupCalls(self._claim_one, self._claim_many, _claimed_id)
        self._scripts = (
            self._create_run,
            self._claim_run,
            self._commit,
            self._delete_run,
            self._delete_checkpoints,
            self._get_checkpoint,
            self._list_checkpoints,
            self._runs_of_status,
            self._list_forks,
            self._index_forks,
            self._read_journal,
            self._put_signal,
        )

    ABSENT = (
        "no nestegg store under its key prefix (a run writes one; a store with a prefix of "
        "its own: ?prefix=app:)"
    )
    """Why a command that only reads finds no store here (:meth:`exists` is False)."""

    @property
    def where(self) -> str:
        """Where this store is, as a command's message names it: the server (its URL
        without the password, or the given client) and the key prefix."""
        return f"{self._conn.where or 'the given client'}, key prefix {self.prefix!r}"

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisCheckpointStorage:
        """A store for a ``redis://`` URL; ``options`` as in the constructor."""
        return cls(url, **options)

    # -- plumbing -----------------------------------------------------------------------

    def _key(self, kind: str, name: str = "") -> str:
        return f"{self.prefix}{kind}{name}"

    def _run_keys(self, run_id: str) -> list[bytes]:
        run = run_id.encode()
        return [kind + run for kind in self._run_key_kinds]

    async def setup(self) -> None:
        """Check that Redis answers, load the scripts and, unless :attr:`read_only`, mark
        the store as there and bring its layout to the version this nestegg writes
        (:data:`~nestegg.checkpoint.stores.redis.layout.LAYOUT_VERSION`; idempotent: a
        store of version 0 gets the index of its forks, built from its runs).

        Raises:
            StorageUnavailableError: Redis cannot be reached.
        """

        async def load() -> None:
            for script in self._scripts:
                await self._client.script_load(script.script)
            if self.read_only:
                return
            marker = self._key(STORE_KEY)
            if not await self._client.exists(marker):  # no write where it is
                await self._client.set(marker, b"nestegg", nx=True)
            await self._build_forks_index()

        await self._call(load, idempotent=True)

    async def exists(self) -> bool:
        """Whether a store is under this prefix (set up, or with runs or threads), found
        without writing (what a command that only reads checks before :meth:`setup`).

        Raises:
            StorageUnavailableError: Redis cannot be reached.
        """
        marks = [self._key(name) for name in STORE_MARKS]
        return bool(await self._call(lambda: self._client.exists(*marks), idempotent=True))

    async def close(self) -> None:
        """Close the client this store built from its URL (a given client stays open)."""
        await self._group.drain()
        await self._conn.close()

    async def drop(self) -> None:
        """Delete every key under this store's prefix, with everything stored in them.

        Meant for tests and for removing nestegg from a Redis database.
        """

        async def drop() -> None:
            batch: list[bytes] = []
            async for key in self._client.scan_iter(match=f"{self.prefix}*", count=SCAN_BATCH):
                batch.append(key)
                if len(batch) >= SCAN_BATCH:
                    await self._client.unlink(*batch)
                    batch.clear()
            if batch:
                await self._client.unlink(*batch)

        await self._call(drop, idempotent=True)

    # -- runs ---------------------------------------------------------------------------

    async def create_run(self, run: RunRecord) -> None:
        if not await self._create_runs.call(run):
            raise run_exists(run.run_id)

    def _create_call(self, run: RunRecord) -> tuple[list[str], list[Any]]:
        keys = [self._key("run:", run.run_id), self._key("runs"), self._pipeline_key(run.pipeline)]
        if run.parent_run is not None:
            keys.append(self._key("forks:", run.parent_run))
        args: list[Any] = [repr(run.created_at), run.run_id]
        for name, value in run_fields(run).items():
            args += [name, value]
        return keys, args

    async def _create_one(self, run: RunRecord) -> bool:
        keys, args = self._create_call(run)
        return bool(await self._call(lambda: self._create_run(keys, args), idempotent=False))

    async def _create_many(self, runs: Sequence[RunRecord]) -> list[bool | BaseException]:
        calls = [self._create_call(run) for run in runs]
        replies = await self._conn.scripts_many(self._create_run, calls, idempotent=False)
        return [outcome_of_reply(bool, reply, self._conn.where) for reply in replies]

    async def get_run(self, run_id: str) -> RunRecord | None:
        return await self._get_runs.call(run_id)

    async def _get_one(self, run_id: str) -> RunRecord | None:
        raw = await self._call(
            lambda: self._client.hgetall(self._key("run:", run_id)), idempotent=True
        )
        return run_from_hash(raw) if raw else None

    async def _get_many(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        ids = [run_id.encode() for run_id in run_ids]
        hashes = await self._call(partial(self._fetch_runs, ids), idempotent=True)
        return [run_from_hash(raw) if raw else None for raw in hashes]

    async def claim_run(
        self,
        run_id: str,
        expected_fence: int,
        owner: Owner,
        lease_until: float,
        now: float,
        *,
        reopen: bool = False,
    ) -> RunRecord:
        args: list[Any] = [self.prefix, self._ttl, expected_fence, "1" if reopen else "0"]
        fields = owner_fields(owner) | {
            "lease_until": repr(lease_until),
            "status": RUNNING,
            "updated_at": repr(now),
        }
        for name, value in fields.items():
            args += [name, value]
        return await self._claims.call((run_id, args))

    async def _claim_one(self, claim: tuple[str, list[Any]]) -> RunRecord:
        run_id, args = claim
        keys = self._run_keys(run_id)
        return _claimed(
            run_id, await self._call(lambda: self._claim_run(keys, args), idempotent=False)
        )

    async def _claim_many(
        self, claims: Sequence[tuple[str, list[Any]]]
    ) -> list[RunRecord | BaseException]:
        calls = [(self._run_keys(run_id), args) for run_id, args in claims]
        replies = await self._conn.scripts_many(self._claim_run, calls, idempotent=False)
        return [
            outcome_of_reply(partial(_claimed, run_id), reply, self._conn.where)
            for (run_id, _), reply in zip(claims, replies, strict=True)
        ]

    def step_admission(self) -> Awaitable[None] | None:
        """None when a run may start its next step now; else what it awaits first."""
        return self._group.step_admission()

    async def commit(self, commit: Commit) -> None:
        check_size(commit)
        await self._group.commit(commit)

    def _commit_call(self, commit: Commit) -> tuple[list[bytes], list[bytes]]:
        return self._run_keys(commit.run_id), self._commit_head + commit_args(change_set(commit))

    async def _commit_one(self, commit: Commit) -> None:
        keys, args = self._commit_call(commit)
        outcome = commit_outcome(commit, await self._script(self._commit, keys, args))
        if outcome is not None:
            raise outcome

    async def _commit_many(self, commits: Sequence[Commit]) -> list[Outcome]:
        """Many runs' commit scripts in one pipeline: one round trip (group commit); each
        script checks its own run's fence."""
        calls = [self._commit_call(c) for c in commits]
        replies = await self._conn.scripts_many(self._commit, calls, idempotent=True)
        return [
            error_of_reply(reply, self._conn.where)
            if isinstance(reply, BaseException)
            else commit_outcome(c, reply)
            for c, reply in zip(commits, replies, strict=True)
        ]

    # -- reads --------------------------------------------------------------------------

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        high = "+inf" if upto is None else upto
        members = await self._call(
            lambda: self._client.zrangebyscore(self._key("steps:", run_id), f"({after}", high),
            idempotent=True,
        )
        return [step_from_member(run_id, member) for member in members]

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        keys = [self._key("checkpoint_order:", run_id), self._key("checkpoints:", run_id)]
        return _checkpoints_of(run_id, await self._script(self._list_checkpoints, keys, []))

    async def list_checkpoints_of(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[CheckpointRecord]]:
        calls: list[tuple[Keys, list[Any]]] = [
            ([self._key("checkpoint_order:", r), self._key("checkpoints:", r)], []) for r in run_ids
        ]
        replies = await self._conn.scripts_many(self._list_checkpoints, calls, idempotent=True)
        listed: dict[str, list[CheckpointRecord]] = {}
        for run_id, reply in zip(run_ids, replies, strict=True):
            if isinstance(reply, BaseException):
                raise error_of_reply(reply, self._conn.where)
            found = _checkpoints_of(run_id, reply)
            if found:
                listed[run_id] = found
        return listed

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        keys = [self._key("checkpoint:", checkpoint_id)]
        args = [self.prefix, checkpoint_id]
        reply = await self._script(self._get_checkpoint, keys, args)
        if not reply:
            return None
        return checkpoint_from_value(checkpoint_id, reply[0].decode(), reply[1])

    async def read_events(
        self, run_id: str, since_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        key = self._key("events:", run_id)
        page = {} if limit is None else {"start": 0, "num": limit}
        members = await self._call(
            lambda: self._client.zrangebyscore(key, f"({since_seq}", "+inf", **page),
            idempotent=True,
        )
        return [event_from_member(run_id, member) for member in members]

    async def read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        keys = [self._key("journal:", run_id), self._key("journal_index:", run_id)]
        reply = await self._script(self._read_journal, keys, [step])
        if not reply:
            return []
        entries = [
            JournalRecord(run_id, step, int(field.split(b":")[1]), body)
            for field, body in zip(reply[0], reply[1], strict=True)
            if body is not None
        ]
        return sorted(entries, key=lambda entry: entry.position)

    async def put_signal(self, signal: SignalRecord, replace: bool = False) -> bool:
        keys = [self._key("run:", signal.run_id), self._key("signals:", signal.run_id)]
        value = b"%r %b" % (signal.at, signal.body)
        args = [signal.name, value, "1" if replace else "0"]
        # Not retried unless replacing: a lost reply to a stored signal must not read as a
        # duplicate.
        put = partial(self._conn.evalsha, self._put_signal, keys, args)
        stored = int(await self._call(put, idempotent=replace))
        if stored < 0:
            raise run_not_found(signal.run_id)
        return stored == 1

    async def read_signals(self, run_id: str) -> list[SignalRecord]:
        key = self._key("signals:", run_id)
        raw = await self._call(lambda: self._client.hgetall(key), idempotent=True)
        signals = []
        for name, value in raw.items():
            at, body = value.split(b" ", 1)
            signals.append(SignalRecord(run_id, name.decode(), float(at), body))
        return sorted(signals, key=lambda signal: signal.name)

    # -- deletion -----------------------------------------------------------------------

    async def _delete(self, run_id: str, condition: list[Any]) -> bool:
        keys: list[str | bytes] = [*self._run_keys(run_id), self._key("runs")]
        args = [self.prefix, run_id, *condition]
        return bool(await self._script(self._delete_run, keys, args))

    async def delete_run(self, run_id: str) -> bool:
        return await self._delete(run_id, [""])

    async def delete_checkpoints(self, run_id: str, checkpoint_ids: Sequence[str]) -> int:
        if not checkpoint_ids:
            return 0
        keys = [self._key("checkpoints:", run_id), self._key("checkpoint_order:", run_id)]
        args = [self.prefix, *checkpoint_ids]
        gone = await self._script(self._delete_checkpoints, keys, args)
        return int(gone)

    async def expire_runs(
        self, statuses: Sequence[str], updated_before: float, pipeline: str | None = None
    ) -> list[str]:
        if not statuses:
            return []
        condition = [repr(updated_before), *statuses]
        expired = []
        async for run in self._iter_runs(
            pipeline, False, statuses, lambda r: r.updated_at < updated_before
        ):
            # The script checks again: a run resumed meanwhile stays.
            if await self._delete(run.run_id, condition):
                expired.append(run.run_id)
        return expired


def _claimed_id(claim: tuple[str, list[Any]]) -> str:
    return claim[0]


def _claimed(run_id: str, reply: Any) -> RunRecord:
    """The run a claim script's ``reply`` holds, or why the claim failed."""
    if reply[0] == 1:
        return run_from_hash(pairs_to_dict(reply[1]))
    if reply[0] == 0:
        raise run_not_found(run_id)
    if reply[0] == -2:
        raise run_finished(run_id, reply[1].decode())
    raise run_claimed(run_id)


def _checkpoints_of(run_id: str, reply: Any) -> list[CheckpointRecord]:
    """A run's checkpoints from the reply of its LIST_CHECKPOINTS script, in order."""
    ids, flat = reply
    values = dict(zip(flat[::2], flat[1::2], strict=True))
    return [checkpoint_from_value(i.decode(), run_id, values[i]) for i in ids if i in values]


__all__ = ["RedisCheckpointStorage", "validate_key_prefix"]
