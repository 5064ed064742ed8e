"""The shapes of the arguments a saver call takes: a config that is a dict, a checkpoint
with the keys the saver stores it by, writes that are (channel, value) pairs, a limit that
is a count, the ids inside a config of the types they are read as, lists of ids that are
lists. Each refused shape is refused here with ConfigurationError naming the method,
the argument, what it got and what it takes, before anything is read or written; the ids
inside them are :mod:`nestegg.langgraph.ids`'s."""

from __future__ import annotations

import reprlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from nestegg.errors import ConfigurationError
from nestegg.options import is_count

CONFIG = "a RunnableConfig (a dict: {'configurable': {'thread_id': ...}})"
CHECKPOINT_KEYS = ("id", "channel_values", "channel_versions")
CHECKPOINT = (
    "a LangGraph Checkpoint (a dict with 'id', 'channel_values' and 'channel_versions', "
    "as empty_checkpoint() gives)"
)
LIMIT = "None (every checkpoint) or a count of at least 0"
THREAD_ID = "a thread id (a str; a UUID or a number is taken as str() of it)"
NAMESPACE = "a str (a checkpoint namespace; '' is the root)"
CHECKPOINT_ID = "None or a str (a checkpoint id; None and '' name none)"

_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 60


def _refuse(method: str, name: str, takes: str, given: Any, why: str = "") -> ConfigurationError:
    return ConfigurationError(
        f"NestEggSaver.{method} takes {name}= {takes}, got {name}={_shown.repr(given)}{why}"
    )


def check_config(
    method: str,
    config: Any,
    name: str = "config",
    *,
    optional: bool = False,
    listing: bool = False,
) -> None:
    """Refuse a ``config`` that is not a dict whose ``configurable`` (if any) is a dict;
    None too, unless ``optional``; and one naming an id of a type it is not read as
    (:func:`_check_ids_of`)."""
    if config is None and optional:
        return
    if not isinstance(config, Mapping):
        raise _refuse(method, name, CONFIG + (" or None" if optional else ""), config)
    conf = config.get("configurable")
    if conf is not None and not isinstance(conf, Mapping):
        raise _refuse(
            method, name, CONFIG, config, f" (its 'configurable' is {type(conf).__name__})"
        )
    _check_ids_of(method, name, conf or {}, listing)


def _check_ids_of(method: str, name: str, conf: Mapping[str, Any], listing: bool) -> None:
    """Refuse a ``thread_id`` that is None (``str()`` would make it the thread "None"), a
    ``checkpoint_ns`` that is not a str, a ``checkpoint_id`` neither None nor a str; in
    ``list`` (``listing``) a None thread id or namespace names every one. A ``before``
    config is read for its checkpoint id alone."""
    where = f"{name}['configurable']"
    if name != "before":
        if "thread_id" in conf and conf["thread_id"] is None and not listing:
            raise _refuse(method, f"{where}['thread_id']", THREAD_ID, None)
        ns = conf.get("checkpoint_ns", "")
        if not isinstance(ns, str) and not (ns is None and listing):
            takes = NAMESPACE + (" or None (every namespace)" if listing else "")
            raise _refuse(method, f"{where}['checkpoint_ns']", takes, ns)
    checkpoint_id = conf.get("checkpoint_id")
    if checkpoint_id is not None and not isinstance(checkpoint_id, str):
        raise _refuse(method, f"{where}['checkpoint_id']", CHECKPOINT_ID, checkpoint_id)


def check_thread_id_given(method: str, name: str, thread_id: Any) -> None:
    """Refuse a thread id argument that is None (any other is taken as ``str()`` of it)."""
    if thread_id is None:
        raise _refuse(method, name, THREAD_ID, thread_id)


def check_ids(method: str, name: str, ids: Any, what: str) -> list[Any]:
    """``ids`` as a list, refused when it is not a list of ids: one id (a str, whose
    characters would each be an id), None or another value that is not a collection, or
    a list holding None."""
    takes = f"a list of {what} ids"
    if isinstance(ids, str | bytes):
        why = (
            f" (one id, not a list: each of its characters would be a {what} id; "
            f"{method}([{ids!r}]))"
        )
        raise _refuse(method, name, takes, ids, why)
    if not isinstance(ids, Iterable):
        raise _refuse(method, name, takes, ids)
    listed = list(ids)
    for index, given in enumerate(listed):
        if given is None:
            raise _refuse(method, name, takes, ids, f" ({name}[{index}] is None)")
    return listed


def check_put(method: str, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> None:
    """Refuse what ``put`` cannot store: a config, a checkpoint without the keys it is stored
    by (or of another type), metadata or new_versions that are not dicts."""
    check_config(method, config)
    if not isinstance(checkpoint, Mapping):
        raise _refuse(method, "checkpoint", CHECKPOINT, checkpoint)
    missing = [key for key in CHECKPOINT_KEYS if key not in checkpoint]
    if missing:
        keys = ", ".join(repr(key) for key in missing)
        raise _refuse(method, "checkpoint", CHECKPOINT, checkpoint, f" (no {keys})")
    if not isinstance(checkpoint["id"], str):
        raise _refuse(method, "checkpoint", CHECKPOINT, checkpoint, " (its 'id' is not a str)")
    for key in ("channel_values", "channel_versions"):
        if not isinstance(checkpoint[key], Mapping):
            why = f" (its {key!r} is {type(checkpoint[key]).__name__}, not a dict)"
            raise _refuse(method, "checkpoint", CHECKPOINT, checkpoint, why)
    if not isinstance(metadata, Mapping):
        raise _refuse(method, "metadata", "a dict (CheckpointMetadata)", metadata)
    if not isinstance(new_versions, Mapping):
        raise _refuse(method, "new_versions", "a dict of channel -> version", new_versions)


def check_put_writes(method: str, config: Any, writes: Any, task_id: Any, task_path: Any) -> None:
    """Refuse what ``put_writes`` cannot store: a config, writes that are not a list of
    (channel, value) pairs with a str channel, a task id or path that is not a str."""
    check_config(method, config)
    pairs = "a list of (channel, value) pairs"
    if isinstance(writes, str | bytes) or not isinstance(writes, Sequence):
        raise _refuse(method, "writes", pairs, writes)
    for index, write in enumerate(writes):
        if not isinstance(write, tuple | list) or len(write) != 2 or not isinstance(write[0], str):
            raise _refuse(method, "writes", pairs, writes, f" (writes[{index}] is {write!r})")
    for name, given in (("task_id", task_id), ("task_path", task_path)):
        if not isinstance(given, str):
            raise _refuse(method, name, "a str", given)


def check_list(method: str, config: Any, filter: Any, before: Any, limit: Any) -> None:
    """Refuse what ``list`` cannot take: a config or ``before`` that is neither None nor a
    config, a filter that is neither None nor a dict, a limit that is not None or a count
    (``limit=0`` lists nothing, as LangGraph's InMemorySaver does)."""
    check_config(method, config, optional=True, listing=True)
    check_config(method, before, "before", optional=True, listing=True)
    if filter is not None and not isinstance(filter, Mapping):
        raise _refuse(method, "filter", "None or a dict of metadata key -> value", filter)
    if limit is not None and not is_count(limit, least=0):
        raise _refuse(method, "limit", LIMIT, limit)
