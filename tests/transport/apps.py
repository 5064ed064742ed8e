"""Pipelines the transport tests run in worker processes (``nestegg worker``).

Configured from the environment when built, so that every test has its own keys:
``NESTEGG_TEST_REDIS_URL`` (store and Redis broker), ``NESTEGG_TEST_PREFIX`` (key prefix
of the store, streams, queues and counters), ``NESTEGG_TEST_TRANSPORT`` (an AMQP URL;
default Redis Streams), ``NESTEGG_TEST_LEASE`` (seconds), ``NESTEGG_TEST_SLOW``
(seconds the slow step takes), ``NESTEGG_TEST_PACE`` (seconds each chain step takes at
least) and ``NESTEGG_TEST_CONNECT_TIMEOUT`` (seconds a RabbitMQ connection's opening may
take; default the transport's CONNECT_TIMEOUT).
"""

from __future__ import annotations

import asyncio
import faulthandler
import functools
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from pydantic import BaseModel

import nestegg
from nestegg import Clutch, Strategy, get_context
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.postgres import PostgresCheckpointStorage
from nestegg.checkpoint.stores.redis import RedisCheckpointStorage
from nestegg.constants import RECORD_MAX_BYTES
from nestegg.transport.redis_streams import RedisStreamsTransport

REDIS_URL_DEFAULT = "redis://127.0.0.1:6379/0"
STEPS = 10


def setting(name: str, default: str) -> str:
    """A test setting from the environment (read when a pipeline is built)."""
    return os.environ.get(f"NESTEGG_TEST_{name}", default)


def redis_url() -> str:
    """The Redis of the store, the counters and the Redis broker."""
    return setting("REDIS_URL", REDIS_URL_DEFAULT)


def prefix() -> str:
    """The key prefix of this test's store, streams, queues and counters."""
    return setting("PREFIX", "nestegg-test:")


QUEUES_KEY = "queues"
"""The Redis set (under the prefix) of the channels whose RabbitMQ queues a test declared,
in its own process or in a worker's: the teardown deletes them all."""


def transport() -> Any:
    """The broker of the tests: Redis Streams under the prefix, or the AMQP URL given
    (a transport that records the queues it declares, see :data:`QUEUES_KEY`)."""
    url = os.environ.get("NESTEGG_TEST_TRANSPORT")
    if url is None or url.startswith("redis"):
        return RedisStreamsTransport(url or redis_url(), prefix=prefix())
    return _recording_rabbitmq()(url, prefix=prefix())


@functools.cache
def _recording_rabbitmq() -> Any:
    from nestegg.transport import rabbitmq
    from nestegg.transport.rabbitmq import RabbitMQTransport

    connect_timeout = os.environ.get("NESTEGG_TEST_CONNECT_TIMEOUT")
    if connect_timeout is not None:
        rabbitmq.CONNECT_TIMEOUT = float(connect_timeout)

    class RecordingRabbitMQ(RabbitMQTransport):
        """RabbitMQ that records each channel whose queue it declares."""

        async def _declare(self, amqp: Any, channel: str) -> Any:
            await counter().sadd(f"{self.prefix}{QUEUES_KEY}", channel)
            return await super()._declare(amqp, channel)

    return RecordingRabbitMQ


def config(
    clock: Callable[[], float] = time.time, store: CheckpointStorage | None = None
) -> CheckpointConfig:
    """``store`` (default: the Redis store under the prefix), with a short lease, timed by
    ``clock``."""
    storage = store or RedisCheckpointStorage(redis_url(), prefix=prefix())
    lease = timedelta(seconds=float(setting("LEASE", "2")))
    return CheckpointConfig(storage=storage, lease=lease, clock=clock)


_counters: dict[Any, Any] = {}


def _dump_stacks(signum: int, frame: Any) -> None:
    """Write every thread's stack and every asyncio task's to stderr (SIGUSR1: what a
    test that waited too long for a worker shows; see WorkerProcess.wait)."""
    faulthandler.dump_traceback(all_threads=True)
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        return
    lines = []
    for task in tasks:
        lines.append(f"{task!r} awaits:")
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    os.write(sys.stderr.fileno(), ("\n".join(lines) + "\n").encode())  # no buffer to re-enter


signal.signal(signal.SIGUSR1, _dump_stacks)


def counter() -> Any:
    """A Redis client for the side-effect counters (one per event loop)."""
    loop = asyncio.get_running_loop()
    if loop not in _counters:
        _counters[loop] = aioredis.Redis.from_url(redis_url())
    return _counters[loop]


@nestegg.durable
async def side_effect(run_id: str, step: int) -> int:
    """Counts its executions per run and step in Redis; returns the count."""
    return int(await counter().hincrby(f"{prefix()}effects", f"{run_id}:{step}", 1))


async def _chain_step(data: dict[str, Any], name: str) -> dict[str, Any]:
    ctx = get_context()
    step = ctx.state.turn + 1
    await side_effect(ctx.state.clutch_id, step)
    await asyncio.sleep(float(setting("PACE", "0")) + random.uniform(0.0, 0.05))
    return {"trail": [*data.get("trail", []), f"{name}{step}"], "n": data.get("n", 0) + 1}


def make_chain(store: CheckpointStorage | None = None) -> Clutch:
    """Ten steps, ping and pong in turn, each with a journaled side effect (on ``store``,
    by default the Redis store under the prefix)."""
    chain = Clutch(
        "chain",
        strategy=Strategy.ROUND_ROBIN,
        max_turns=STEPS,
        transport=transport(),
        checkpoint=config(store=store),
    )

    @chain.agent()
    async def ping(data: dict[str, Any]) -> dict[str, Any]:
        return await _chain_step(data, "ping")

    @chain.agent()
    async def pong(data: dict[str, Any]) -> dict[str, Any]:
        return await _chain_step(data, "pong")

    return chain


def _fail_if_flagged(agent: str) -> None:
    """Raise while the file ``NESTEGG_TEST_FLAG`` names exists (a cause of failure that a
    test removes before it resumes the run)."""
    flag = setting("FLAG", "")
    if flag and os.path.exists(flag):
        raise RuntimeError(f"{agent} failed: {flag} exists")


def make_flaky(**hooks: Any) -> Clutch:
    """Three agents in order, ``fetch``, ``judge``, ``report``, each with a journaled side
    effect and noting the pid that ran it; ``judge`` fails after its side effect while the
    flag file exists (``NESTEGG_TEST_FLAG``); ``hooks``: ``on_request`` and the like."""
    flaky = Clutch("flaky", transport=transport(), checkpoint=config(), **hooks)
    for name in ("fetch", "judge", "report"):
        flaky.agent()(_noting(name))
    return flaky


def _noting(name: str) -> Callable[[dict[str, Any]], Any]:
    """Agent ``name`` of pipeline ``flaky``."""

    async def agent(data: dict[str, Any]) -> dict[str, Any]:
        ctx = get_context()
        await side_effect(ctx.state.clutch_id, ctx.state.turn + 1)
        if name == "judge":
            _fail_if_flagged(name)
        return {**data, name: os.getpid()}

    agent.__name__ = agent.__qualname__ = name
    return agent


@nestegg.durable(retry=nestegg.RetryPolicy(attempts=1))
async def model_call(run_id: str) -> str:
    """Counts its calls per run in Redis (``<run>:model``); fails while the flag file
    ``NESTEGG_TEST_FLAG`` names exists: a model's API that is down."""
    await counter().hincrby(f"{prefix()}effects", f"{run_id}:model", 1)
    _fail_if_flagged("model_call")
    return "answer"


def make_outage() -> Clutch:
    """One agent, ``ask``: a journaled side effect, then a journaled model call that fails
    for good (no retry) while the flag file exists."""
    outage = Clutch("outage", transport=transport(), checkpoint=config())

    @outage.agent()
    async def ask(data: dict[str, Any]) -> dict[str, Any]:
        run_id = get_context().state.clutch_id
        await side_effect(run_id, 1)
        return {**data, "answer": await model_call(run_id), "by": os.getpid()}

    return outage


def make_slow(*, here: bool = False, **hooks: Any) -> Clutch:
    """A first step that takes NESTEGG_TEST_SLOW seconds after its side effect; ``here``:
    run in its own process (no transport); ``hooks``: ``on_request`` and the like."""
    slow = Clutch("slow", transport=None if here else transport(), checkpoint=config(), **hooks)
    seconds = float(setting("SLOW", "0"))

    @slow.agent()
    async def crawl(data: dict[str, Any]) -> dict[str, Any]:
        await side_effect(get_context().state.clutch_id, 1)
        await asyncio.sleep(seconds)
        return {**data, "crawled": os.getpid()}

    @slow.agent()
    async def after(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "after": os.getpid()}

    return slow


def make_approving(*, here: bool = False) -> Clutch:
    """One agent, ``review``: a journaled side effect, then a wait for signal ``approval``
    (for NESTEGG_TEST_WAIT seconds if set, then ``"expired"``), noting the pid that ran
    it; it fails after the wait while the flag file exists (``NESTEGG_TEST_FLAG``), and
    then sleeps on a durable timer for NESTEGG_TEST_NAP seconds if set; ``here``: run in
    its own process (no transport)."""
    approving = Clutch("approving", transport=None if here else transport(), checkpoint=config())
    seconds, nap = setting("WAIT", ""), setting("NAP", "")

    @approving.agent()
    async def review(data: dict[str, Any]) -> dict[str, Any]:
        await side_effect(get_context().state.clutch_id, 1)
        timeout = timedelta(seconds=float(seconds)) if seconds else None
        try:
            approval = await nestegg.wait_for("approval", timeout=timeout)
        except nestegg.SignalTimeoutError:
            approval = "expired"
        _fail_if_flagged("review")
        if nap:
            await nestegg.sleep(timedelta(seconds=float(nap)))
        return {**data, "approval": approval, "review": os.getpid()}

    return approving


def make_split(
    clock: Callable[[], float] = time.time, store: CheckpointStorage | None = None
) -> Clutch:
    """Three agents in order, each noting the pid that ran it; the third may fail, or
    return more than a store takes (``{"large": True}``); its
    store's times from ``clock``; in ``store`` (default: the Redis store)."""
    split = _split_of_two(Clutch("split", transport=transport(), checkpoint=config(clock, store)))

    @split.agent()
    async def third(data: dict[str, Any]) -> dict[str, Any]:
        if data.get("fail"):
            raise ValueError(f"bad input {data['fail']}")
        if data.get("large"):  # over the size a store takes in one record
            return {**data, "third": "x" * RECORD_MAX_BYTES}
        return {**data, "third": os.getpid()}

    return split


def make_split_on_postgres() -> Clutch:
    """Pipeline ``split`` with its runs in PostgreSQL (``NESTEGG_TEST_PG_STORE``: the URL,
    ``NESTEGG_TEST_PG_TABLES``: the table prefix) instead of Redis."""
    storage = PostgresCheckpointStorage(
        setting("PG_STORE", ""), table_prefix=setting("PG_TABLES", "nestegg_")
    )
    return make_split(store=storage)


def make_split_as_user() -> Clutch:
    """Pipeline ``split`` with its runs in the Redis store under the prefix, reached as the
    user and password of ``NESTEGG_TEST_USER_STORE`` (a Redis URL)."""
    return make_split(store=RedisCheckpointStorage(setting("USER_STORE", ""), prefix=prefix()))


def make_split_without_third() -> Clutch:
    """Pipeline ``split`` as a version that has no agent ``third``: runs that a ``split``
    of three agents checkpointed before ``third`` continue with an agent it lacks."""
    return _split_of_two(Clutch("split", transport=transport(), checkpoint=config()))


def _split_of_two(split: Clutch) -> Clutch:
    """``split`` with agents ``first`` and ``second``, each noting the pid that ran it."""

    @split.agent()
    async def first(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "first": os.getpid()}

    @split.agent()
    async def second(data: dict[str, Any]) -> dict[str, Any]:
        return {**data, "second": os.getpid()}

    return split


class Page(BaseModel):
    """The input of agent ``second`` of pipeline ``typed``."""

    title: str
    pages: int = 0


class StrictPage(Page):
    """``Page`` as a later version of pipeline ``typed`` has it: ``pages`` is required,
    which the output of its agent ``first`` does not have."""

    pages: int


def make_typed(strict: bool = False, *, second: bool = True) -> Clutch:
    """Two agents: ``first`` returns a title (no ``pages``), ``second`` takes it as a
    ``Page`` (``strict``: a ``StrictPage``) and notes the pid that ran it; without
    ``second``, ``first`` only."""
    typed = Clutch("typed", transport=transport(), checkpoint=config())

    @typed.agent()
    async def first(data: dict[str, Any]) -> dict[str, Any]:
        return {"title": str(data.get("title", "t")), "first": os.getpid()}

    if not second:
        return typed
    if strict:

        @typed.agent()
        async def second(page: StrictPage) -> dict[str, Any]:
            return {**page.model_dump(), "second": os.getpid()}

    else:

        @typed.agent()
        async def second(page: Page) -> dict[str, Any]:
            _fail_if_flagged("second")
            return {**page.model_dump(), "second": os.getpid()}

    return typed


def make_typed_strict() -> Clutch:
    """Pipeline ``typed`` as a version whose agent ``second`` requires ``pages``."""
    return make_typed(strict=True)


def make_typed_without_second() -> Clutch:
    """Pipeline ``typed`` as a version that has no agent ``second``: the runs whose step 1
    a ``typed`` of two agents committed continue with an agent it lacks."""
    return make_typed(second=False)


def __getattr__(name: str) -> Clutch:
    """``apps:approving``, ``apps:chain``, ``apps:flaky``, ``apps:outage``, ``apps:slow``,
    ``apps:split``, ``apps:split_without_third``, ``apps:split_on_postgres``,
    ``apps:split_as_user``, ``apps:typed``, ``apps:typed_strict``,
    ``apps:typed_without_second``: built from the environment on use."""
    makers = {
        "approving": make_approving,
        "chain": make_chain,
        "flaky": make_flaky,
        "outage": make_outage,
        "slow": make_slow,
        "split": make_split,
        "split_without_third": make_split_without_third,
        "split_on_postgres": make_split_on_postgres,
        "split_as_user": make_split_as_user,
        "typed": make_typed,
        "typed_strict": make_typed_strict,
        "typed_without_second": make_typed_without_second,
    }
    if name in makers:
        return makers[name]()
    raise AttributeError(name)
