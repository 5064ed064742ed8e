"""NestEggSaver: LangGraph's checkpointer over any nestegg store."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.threads import ThreadStore
from nestegg.errors import ConfigurationError, StorageUnavailableError
from nestegg.langgraph.arguments import (
    check_config,
    check_ids,
    check_list,
    check_put,
    check_put_writes,
    check_thread_id_given,
)
from nestegg.langgraph.core import ThreadCheckpoints
from nestegg.langgraph.linear import DEFAULT_PACK_EVERY
from nestegg.langgraph.loop import LoopThread, loop_of
from nestegg.langgraph.retention import Retention, prune
from nestegg.options import check_count, check_flag

T = TypeVar("T")
CLOSED = "this saver was closed (close(), the end of its with block): open a new one"


class NestEggSaver(BaseCheckpointSaver[str]):
    """LangGraph's checkpointer over a nestegg store (memory, file, SQLite, PostgreSQL,
    Redis): threads are kept in records of their own, apart from nestegg's runs.

    A list that grows (``add_messages``, ``operator.add``) is stored as the items each
    version adds (packed together again every ``pack_every`` versions), so a thread's
    storage grows with what its steps produced, not with the square of it.

    Args:
        storage: a nestegg store with the ThreadStore capability; the saver sets it up on
            first use and calls it on one event loop, shared by every saver over that
            store: run by the sync caller's own thread while only sync code calls, on a
            thread of its own from the first async call (so pass a store that is not used
            from another event loop).
        serde: LangGraph's serializer (default: LangGraph's JsonPlusSerializer): an object
            with ``dumps_typed`` and ``loads_typed``, or with ``dumps`` and ``loads``.
        ttl: delete threads not written for this long (checked on the write path).
        keep_latest: keep this many checkpoints per thread namespace (on every write).
        pack_every: versions of a channel between two packs: the most deltas a read
            combines.
        defer_writes: commit a task's writes with the checkpoint that follows them, in one
            transaction, or on their own once they waited 50 ms for it (a sibling task
            still running); error, interrupt, scheduled and resume writes, reads of the
            thread and closing the saver commit them at once. A process killed within
            those 50 ms of a task's end runs the task again on resume, as LangGraph does
            for a task whose writes were not stored. False commits every ``put_writes``
            on its own.
        clock: seconds since the epoch (injected in tests).
        close_storage: close the store when the saver closes (``from_url`` sets it).

    Raises:
        ConfigurationError: the store cannot keep threads (a URL string: use
            :meth:`from_url`), or a setting is invalid (a flag that is not a bool, a
            count that is a bool), naming it and its value.

    Example:
        >>> with NestEggSaver.from_url("sqlite:///graph.db") as saver:
        ...     graph = builder.compile(checkpointer=saver)
    """

    def __init__(
        self,
        storage: Any,
        *,
        serde: SerializerProtocol | None = None,
        ttl: timedelta | None = None,
        keep_latest: int | None = None,
        pack_every: int = DEFAULT_PACK_EVERY,
        defer_writes: bool = True,
        clock: Callable[[], float] = time.time,
        close_storage: bool = False,
    ) -> None:
        _check_settings(
            serde=serde,
            ttl=ttl,
            keep_latest=keep_latest,
            pack_every=pack_every,
            defer_writes=defer_writes,
            clock=clock,
            close_storage=close_storage,
        )
        if isinstance(storage, str):
            raise ConfigurationError(
                f"NestEggSaver takes a store, got the string {storage!r} (a URL: "
                f"NestEggSaver.from_url({storage!r}) opens the store and closes it with the saver)"
            )
        if not isinstance(storage, ThreadStore):
            raise ConfigurationError(
                f"{type(storage).__name__} cannot keep LangGraph threads (no ThreadStore)"
            )
        super().__init__(serde=serde)
        self.storage = storage
        retention = Retention(keep_latest, ttl, pack_every, clock)
        self._core = ThreadCheckpoints(
            storage, self.serde, retention, pack_every, clock, self._flush_due, defer_writes
        )
        self._close_storage = close_storage
        self._loop: LoopThread | None = None
        self._ready = False
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> NestEggSaver:
        """A saver over the store at ``url`` (``sqlite:///…``, ``postgresql://…``,
        ``redis://…``, ``file:///…``, ``memory://``), closed with the saver; ``options``
        as in the constructor, but for ``storage`` and ``close_storage``.

        Raises:
            TypeError: an option the constructor does not take (before the store is
                opened), as Python names it.
            ConfigurationError: an option's value the constructor refuses (before the
                store is opened).
        """
        _check_options(cls, options)
        _check_settings(**options)
        return cls(open_store(url), close_storage=True, **options)

    # -- lifecycle ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StorageUnavailableError(CLOSED)

    def _loop_thread(self) -> LoopThread:
        if self._loop is None or not self._loop.running:
            self._loop = loop_of(self.storage)
        return self._loop

    async def _ready_then(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._ready:
            try:
                await self.storage.setup()  # type: ignore[attr-defined]
            except BaseException:
                coro.close()
                raise
            self._ready = True
        return await coro

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            self._check_open()
        return self._loop_thread().run(self._ready_then(coro))

    async def _arun(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            self._check_open()
        return await self._loop_thread().arun(self._ready_then(coro))

    def _flush_due(self) -> None:
        """Commit the writes that waited for their checkpoint (on the timer's thread)."""
        self._run(self._core.flush_due())

    def setup(self) -> None:
        """Set the store up now (its tables, its connections), as LangGraph's own savers
        do in ``setup()``; else the first call does it. Calling it again does nothing."""
        self._run(_done())

    async def asetup(self) -> None:
        """Async :meth:`setup`."""
        await self._arun(_done())

    def close(self) -> None:
        """Close the store (and stop the thread that served it) if the saver opened it;
        calls made afterwards raise StorageUnavailableError (the store is not reopened)."""
        self._core.deferred.close()  # first: a commit of its under way ends before
        self._closed = True
        if self._loop is None:
            return
        self._loop.run(self._core.flush())
        if self._close_storage:
            self._loop.run(self.storage.close())  # type: ignore[attr-defined]
            self._ready = False
            self._loop.stop()
        self._loop = None

    async def aclose(self) -> None:
        """:meth:`close` from async code."""
        await asyncio.to_thread(self._core.deferred.close)  # may wait for its commit
        self._closed = True
        if self._loop is not None:
            await self._loop.arun(self._core.flush())
        if self._loop is not None and self._close_storage:
            await self._loop.arun(self.storage.close())  # type: ignore[attr-defined]
            self._ready = False
            self._loop.stop()
        self._loop = None

    def __enter__(self) -> NestEggSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> NestEggSaver:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- LangGraph's interface ------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions that sort as strings: a zero-padded counter and a random tail."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``, or the thread's newest)."""
        check_config("get_tuple", config)
        return self._run(self._core.get_tuple(config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async :meth:`get_tuple`."""
        check_config("aget_tuple", config)
        return await self._arun(self._core.get_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints, newest first, filtered by thread, namespace, metadata, ``before``
        (``limit=0``: none).

        Raises:
            ConfigurationError: a config or ``before`` that is not a dict, a filter that is
                not a dict, a limit that is not None or an int of at least 0, a
                ``checkpoint_ns`` or ``checkpoint_id`` (of ``config`` or ``before``) that
                is neither None nor a str.
        """
        check_list("list", config, filter, before, limit)
        found = self._run(
            self._core.list_checkpoints(config, filter=filter, before=before, limit=limit)
        )
        return iter(found)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async :meth:`list`."""
        check_list("alist", config, filter, before, limit)
        found = await self._arun(
            self._core.list_checkpoints(config, filter=filter, before=before, limit=limit)
        )
        for item in found:
            yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values of ``new_versions``.

        Raises:
            RecordTooLargeError: a channel value or the checkpoint is over
                ``RECORD_MAX_BYTES`` serialized, or they add up past ``COMMIT_MAX_BYTES``
                (nothing is sent to the store).
            ConfigurationError: a config, metadata or new_versions that is not a dict, a
                checkpoint that is not one with 'id', 'channel_values' and
                'channel_versions' (nothing is stored).
        """
        check_put("put", config, checkpoint, metadata, new_versions)
        return self._run(self._core.put(config, checkpoint, metadata, new_versions))

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Async :meth:`put`."""
        check_put("aput", config, checkpoint, metadata, new_versions)
        return await self._arun(self._core.put(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes (a write already stored under its index is kept;
        error, interrupt, scheduled and resume writes are replaced).

        Raises:
            RecordTooLargeError: a write is over ``RECORD_MAX_BYTES`` serialized, or they
                add up past ``COMMIT_MAX_BYTES`` (none is kept or sent to the store).
            ConfigurationError: a config that is not a dict, writes that are not a list of
                (channel, value) pairs, a task id or path that is not a str.
            InvalidIdentifierError: a config without the checkpoint id the writes belong to.
        """
        check_put_writes("put_writes", config, writes, task_id, task_path)
        self._check_open()
        if not self._core.defer(config, writes, task_id, task_path):
            self._run(self._core.put_writes(config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Async :meth:`put_writes`."""
        check_put_writes("aput_writes", config, writes, task_id, task_path)
        self._check_open()
        if not self._core.defer(config, writes, task_id, task_path):
            await self._arun(self._core.put_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread with everything of it (ConfigurationError for None)."""
        check_thread_id_given("delete_thread", "thread_id", thread_id)
        self._run(self._core.delete_thread(thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        """Async :meth:`delete_thread`."""
        check_thread_id_given("adelete_thread", "thread_id", thread_id)
        await self._arun(self._core.delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) made by those runs, in every thread.

        Raises:
            ConfigurationError: ``run_ids`` that is not a list of ids (one id as a str,
                None), or a list holding None (nothing is deleted).
        """
        run_ids = check_ids("delete_for_runs", "run_ids", run_ids, "run")
        self._run(self._core.delete_for_runs(run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Async :meth:`delete_for_runs`."""
        run_ids = check_ids("adelete_for_runs", "run_ids", run_ids, "run")
        await self._arun(self._core.delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of one thread into another.

        Raises:
            ConfigurationError: a thread id that is None (nothing is copied).
        """
        _check_copy("copy_thread", source_thread_id, target_thread_id)
        self._run(self._core.copy_thread(source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Async :meth:`copy_thread`."""
        _check_copy("acopy_thread", source_thread_id, target_thread_id)
        await self._arun(self._core.copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: keep each namespace's newest checkpoint and what it needs;
        ``delete``: delete the threads.

        Raises:
            ConfigurationError: an unknown strategy, ``thread_ids`` that is not a list of
                ids (one id as a str, None), or a list holding None (nothing is deleted).
        """
        thread_ids = check_ids("prune", "thread_ids", thread_ids, "thread")
        self._run(prune(self._core, thread_ids, strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Async :meth:`prune`."""
        thread_ids = check_ids("aprune", "thread_ids", thread_ids, "thread")
        await self._arun(prune(self._core, thread_ids, strategy))


def _check_copy(method: str, source_thread_id: Any, target_thread_id: Any) -> None:
    check_thread_id_given(method, "source_thread_id", source_thread_id)
    check_thread_id_given(method, "target_thread_id", target_thread_id)


async def _done() -> None:
    """Nothing: what :meth:`NestEggSaver.setup` runs once the store is set up."""


def _check_settings(**options: Any) -> None:
    """Refuse a setting's bad value, by name: a flag not a bool (``"no"`` would be true), a
    count not a positive int (``True`` would be 1), a ttl not a positive timedelta."""
    where = "NestEggSaver"
    for name in ("defer_writes", "close_storage"):
        if name in options:
            check_flag(options[name], name, where)
    if "pack_every" in options:
        check_count(options["pack_every"], "pack_every", where)
    if options.get("keep_latest") is not None:
        check_count(options["keep_latest"], "keep_latest", where, or_none=True)
    ttl = options.get("ttl")
    if ttl is not None and (not isinstance(ttl, timedelta) or ttl.total_seconds() <= 0):
        raise ConfigurationError(f"{where} takes ttl= a positive timedelta, got ttl={ttl!r}")
    if "clock" in options and not callable(options["clock"]):
        raise ConfigurationError(
            f"{where} takes clock= a function giving seconds since the epoch, "
            f"got clock={options['clock']!r}"
        )
    if options.get("serde") is not None:
        _check_serde(options["serde"], where)


def _check_serde(serde: object, where: str) -> None:
    """Refuse a ``serde`` LangGraph cannot call: one with neither dumps_typed and
    loads_typed nor dumps and loads (which LangGraph wraps), or a serializer's class."""
    methods = (("dumps_typed", "loads_typed"), ("dumps", "loads"))
    usable = any(all(callable(getattr(serde, m, None)) for m in pair) for pair in methods)
    if usable and not isinstance(serde, type):
        return
    hint = f" (a class: pass an instance, {serde.__name__}())" if isinstance(serde, type) else ""
    raise ConfigurationError(
        f"{where} takes serde= a LangGraph serializer (with dumps_typed and loads_typed, as "
        f"JsonPlusSerializer(); or with dumps and loads), got serde={serde!r}{hint}"
    )


def _check_options(cls: type[NestEggSaver], options: dict[str, Any]) -> None:
    """Refuse, as Python would, an option of ``from_url`` the constructor does not take."""
    taken = inspect.signature(cls).parameters
    any_taken = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in taken.values())
    for name in options:
        if name in ("storage", "close_storage") or not (name in taken or any_taken):
            raise TypeError(
                f"{cls.__name__}.from_url() got an unexpected keyword argument {name!r}"
            )
