"""The ids a saver call names (thread, namespace, checkpoint, channel, task) and which of
them it takes: each refused id is refused here, naming where it came from, before anything
is written."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, get_checkpoint_id

from nestegg.checkpoint.stores.threads import ThreadStore, check_thread_id
from nestegg.errors import InvalidIdentifierError
from nestegg.langgraph.rows import check_checkpoint_id, check_key_part, check_namespace

THREAD_ID_KEY = "config['configurable']['thread_id']"
NAMESPACE_KEY = "config['configurable']['checkpoint_ns']"
CHECKPOINT_ID_KEY = "config['configurable']['checkpoint_id']"
BEFORE_ID_KEY = "before['configurable']['checkpoint_id']"


def named_thread(config: RunnableConfig) -> str:
    """The thread id ``config`` names, as text: LangGraph's graphs pass it as ``str()`` of
    what the caller gave (a UUID, a number), and so do its own savers; a config without
    one is refused."""
    conf = config.get("configurable") or {}
    if "thread_id" not in conf:
        raise InvalidIdentifierError(f"{THREAD_ID_KEY} is missing: name the LangGraph thread")
    return str(conf["thread_id"])


def thread_of(config: RunnableConfig) -> str:
    """The thread id ``config`` names (:func:`named_thread`) for a write: every saver
    method that writes takes it here, so each refuses the same ids
    (:func:`~nestegg.checkpoint.stores.threads.check_thread_id`) before it writes."""
    return check_thread_id(named_thread(config), THREAD_ID_KEY)


def namespace_of(config: RunnableConfig) -> str:
    """The checkpoint namespace ``config`` names (``""``, the root, when none), refused by
    :func:`~nestegg.langgraph.rows.check_namespace` when its rows cannot be stored."""
    return check_namespace(config["configurable"].get("checkpoint_ns", ""), NAMESPACE_KEY)


def checkpoint_id_of(config: RunnableConfig, where: str = CHECKPOINT_ID_KEY) -> str | None:
    """The checkpoint id ``config`` names (None when none: an empty id names none, as
    LangGraph's own savers read it), refused by
    :func:`~nestegg.langgraph.rows.check_key_part` when no row key can hold it."""
    checkpoint_id = get_checkpoint_id(config)
    if checkpoint_id:
        check_key_part(str(checkpoint_id), where, "checkpoint id")
    return checkpoint_id or None


def written_checkpoint_id(config: RunnableConfig) -> str:
    """The checkpoint id a task's writes are stored under, ``config``'s, refused by
    :func:`~nestegg.langgraph.rows.check_checkpoint_id`; a config naming none (missing or
    None) is refused too: the writes would belong to no checkpoint."""
    checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
    if checkpoint_id is None:
        raise InvalidIdentifierError(
            f"{CHECKPOINT_ID_KEY} is missing: a task's writes are stored under the "
            "checkpoint they follow (pass the config put returned)"
        )
    return check_checkpoint_id(str(checkpoint_id), CHECKPOINT_ID_KEY)


def check_versions(versions: ChannelVersions, where: str) -> None:
    """Refuse a channel or a version of ``versions`` that no blob key can hold."""
    for channel, version in versions.items():
        check_key_part(channel, f"a channel of {where}", "channel name")
        check_key_part(str(version), f"{where}[{channel!r}]", "channel version")


def check_writes(writes: Sequence[tuple[str, Any]], task_id: str, task_path: str) -> None:
    """Refuse a task id, task path or channel of ``put_writes`` that no store can keep."""
    check_key_part(task_id, "put_writes's task_id", "task id", separated=False)
    check_key_part(task_path, "put_writes's task_path", "task path", separated=False)
    for index, (channel, _) in enumerate(writes):
        check_key_part(channel, f"the channel of put_writes's writes[{index}]", "channel name")


async def thread_to_read(store: ThreadStore, thread_id: str, where: str) -> str:
    """``thread_id`` for a read or a copy's source: refused as
    :func:`~nestegg.checkpoint.stores.threads.check_thread_id` refuses it, unless the store
    holds that thread (an older version wrote it under an id now refused, ``""``), so its
    checkpoints can still be read and copied out to a thread of an id taken."""
    try:
        return check_thread_id(thread_id, where)
    except InvalidIdentifierError:
        if any(info.thread_id == thread_id for info in await store.list_threads()):
            return thread_id
        raise
