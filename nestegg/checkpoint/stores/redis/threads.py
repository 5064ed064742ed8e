"""LangGraph thread rows of the Redis store: keys of their own under the store's prefix.

- ``{prefix}lg:threads``: sorted set, thread id -> time of its last write
- ``{prefix}lg:{thread}:{kind}``: hash, row key -> body
- ``{prefix}lg:{thread}:{kind}:keys``: sorted set of the row keys, all scored 0, so a lex
  range gives them in byte order (the order the ThreadStore contract asks for)

A change is one Lua script, so it is applied whole; plain Redis, no modules.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from nestegg.checkpoint.stores.threads import ROW_KINDS, ThreadChange, ThreadInfo, ThreadRow

# KEYS: hash and key index of each kind (in ROW_KINDS order), then the threads set.
# ARGV: thread id, its new time ('' when the change does not move it: ThreadChange.writes),
# then deletes, put_new and put, each a count and triples. A change that only deletes and
# leaves no row (Redis drops an emptied hash) takes the thread out of the threads set.
APPLY = """
local i = 3
local n = tonumber(ARGV[i]); i = i + 1
for _ = 1, n do
  local k = tonumber(ARGV[i])
  local h, z = KEYS[2 * k - 1], KEYS[2 * k]
  local gone = redis.call('ZRANGEBYLEX', z, '[' .. ARGV[i + 1], '(' .. ARGV[i + 2])
  for j = 1, #gone, 500 do
    local chunk = {unpack(gone, j, math.min(j + 499, #gone))}
    redis.call('HDEL', h, unpack(chunk))
    redis.call('ZREM', z, unpack(chunk))
  end
  i = i + 3
end
for pass = 1, 2 do
  n = tonumber(ARGV[i]); i = i + 1
  for _ = 1, n do
    local k = tonumber(ARGV[i])
    local h, z = KEYS[2 * k - 1], KEYS[2 * k]
    if pass == 2 or redis.call('HEXISTS', h, ARGV[i + 1]) == 0 then
      redis.call('HSET', h, ARGV[i + 1], ARGV[i + 2])
      redis.call('ZADD', z, 0, ARGV[i + 1])
    end
    i = i + 3
  end
end
if ARGV[2] ~= '' then
  redis.call('ZADD', KEYS[7], ARGV[2], ARGV[1])
elseif redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[5]) == 0 then
  redis.call('ZREM', KEYS[7], ARGV[1])
end
return 1
"""

# KEYS: hash, key index. ARGV: low, high, newest first (0/1), limit (-1: none).
SCAN = """
local keys
if ARGV[3] == '1' then
  keys = redis.call('ZREVRANGEBYLEX', KEYS[2], '(' .. ARGV[2], '[' .. ARGV[1], 'LIMIT', 0, ARGV[4])
else
  keys = redis.call('ZRANGEBYLEX', KEYS[2], '[' .. ARGV[1], '(' .. ARGV[2], 'LIMIT', 0, ARGV[4])
end
if #keys == 0 then return {} end
local bodies = redis.call('HMGET', KEYS[1], unpack(keys))
local out = {}
for j = 1, #keys do
  out[2 * j - 1] = keys[j]
  out[2 * j] = bodies[j]
end
return out
"""

# KEYS: source hashes and indexes (6), target hashes and indexes (6), threads set.
# ARGV: target id, now.
COPY = """
local copied = 0
for k = 1, 3 do
  local rows = redis.call('HGETALL', KEYS[2 * k - 1])
  for j = 1, #rows, 2 do
    redis.call('HSET', KEYS[6 + 2 * k - 1], rows[j], rows[j + 1])
    redis.call('ZADD', KEYS[6 + 2 * k], 0, rows[j])
    copied = copied + 1
  end
end
if copied > 0 then redis.call('ZADD', KEYS[13], ARGV[2], ARGV[1]) end
return copied
"""


class RedisThreadRows:
    """The :class:`~nestegg.checkpoint.stores.threads.ThreadStore` capability in Redis."""

    prefix: str
    _client: Any
    _call: Callable[..., Awaitable[Any]]
    _script: Callable[..., Awaitable[Any]]
    __scripts: dict[str, Any]

    def _thread_script(self, source: str) -> Any:
        try:
            scripts = self.__scripts
        except AttributeError:
            scripts = self.__scripts = {}
        if source not in scripts:
            scripts[source] = self._client.register_script(source)
        return scripts[source]

    def _threads_key(self) -> str:
        return f"{self.prefix}lg:threads"

    def _row_keys(self, thread_id: str) -> list[str]:
        keys: list[str] = []
        for kind in ROW_KINDS:
            keys += [
                f"{self.prefix}lg:{thread_id}:{kind}",
                f"{self.prefix}lg:{thread_id}:{kind}:keys",
            ]
        return keys

    def _kind_keys(self, thread_id: str, kind: str) -> list[str]:
        return [f"{self.prefix}lg:{thread_id}:{kind}", f"{self.prefix}lg:{thread_id}:{kind}:keys"]

    async def apply_thread_change(self, thread_id: str, change: ThreadChange, now: float) -> None:
        """See ThreadStore."""
        args: list[Any] = [thread_id, repr(now) if change.writes else "", len(change.delete)]
        for kind, low, high in change.delete:
            args += [ROW_KINDS.index(kind) + 1, low, high]
        for rows in (change.put_new, change.put):
            args.append(len(rows))
            for row in rows:
                args += [ROW_KINDS.index(row.kind) + 1, row.key, row.body]
        keys = [*self._row_keys(thread_id), self._threads_key()]
        await self._script(self._thread_script(APPLY), keys, args)

    async def get_thread_rows(
        self, thread_id: str, kind: str, keys: Sequence[str]
    ) -> list[ThreadRow]:
        """See ThreadStore."""
        wanted = sorted(set(keys))
        if not wanted:
            return []
        hash_key = self._kind_keys(thread_id, kind)[0]
        bodies = await self._call(lambda: self._client.hmget(hash_key, wanted), idempotent=True)
        return [
            ThreadRow(kind, key, bytes(b))
            for key, b in zip(wanted, bodies, strict=True)
            if b is not None
        ]

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
        args = [low, high, "1" if newest_first else "0", -1 if limit is None else limit]
        flat = await self._script(self._thread_script(SCAN), self._kind_keys(thread_id, kind), args)
        return [
            ThreadRow(kind, flat[j].decode(), bytes(flat[j + 1])) for j in range(0, len(flat), 2)
        ]

    async def list_threads(self) -> list[ThreadInfo]:
        """See ThreadStore."""
        client = self._client
        entries = await self._call(
            lambda: client.zrevrange(self._threads_key(), 0, -1, withscores=True), idempotent=True
        )

        async def counts() -> list[Any]:
            async with client.pipeline(transaction=False) as pipe:
                for member, _ in entries:
                    for kind in ROW_KINDS:
                        pipe.hlen(self._kind_keys(member.decode(), kind)[0])
                result: list[Any] = await pipe.execute()
                return result

        sizes = await self._call(counts, idempotent=True) if entries else []
        infos = []
        for n, (member, score) in enumerate(entries):
            rows = sum(sizes[n * len(ROW_KINDS) : (n + 1) * len(ROW_KINDS)])
            if rows:
                infos.append(ThreadInfo(member.decode(), float(score), int(rows)))
        return sorted(infos, key=lambda info: (-info.updated_at, info.thread_id))

    async def delete_threads(self, thread_ids: Sequence[str]) -> int:
        """See ThreadStore."""
        ids = list(dict.fromkeys(thread_ids))
        if not ids:
            return 0
        client = self._client

        async def delete() -> int:
            async with client.pipeline(transaction=True) as pipe:
                for thread_id in ids:  # a row of any kind: a thread of writes alone is one
                    pipe.exists(*self._row_keys(thread_id))
                for thread_id in ids:
                    pipe.delete(*self._row_keys(thread_id))
                pipe.zrem(self._threads_key(), *ids)
                result = await pipe.execute()
                return sum(1 for found in result[: len(ids)] if found)

        count: int = await self._call(delete, idempotent=True)
        return count

    async def copy_thread(self, source_id: str, target_id: str, now: float) -> bool:
        """See ThreadStore."""
        keys = [*self._row_keys(source_id), *self._row_keys(target_id), self._threads_key()]
        copied = await self._script(self._thread_script(COPY), keys, [target_id, repr(now)])
        return int(copied) > 0
