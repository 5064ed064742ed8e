"""A value the graph's serializer refuses, named: the path of the part of it refused
(``channel 'results'[2]['doc']``) and that part's type."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from nestegg.errors import CheckpointSerializationError


def dumps(serde: SerializerProtocol, value: Any, where: str) -> tuple[str, bytes]:
    """``value`` serialized by the graph's serializer, or the error naming ``where``."""
    try:
        return serde.dumps_typed(value)
    except (TypeError, ValueError) as exc:
        raise unserializable(serde, value, where, exc) from exc


def unserializable(
    serde: SerializerProtocol, value: Any, where: str, exc: BaseException
) -> CheckpointSerializationError:
    """The error for a value the serializer refused: the path of the first part of it the
    serializer refuses (``channel 'results'[2]['doc']``) and that part's type."""
    path = where
    for _ in range(8):  # into lists, tuples and dicts, a few levels deep
        if isinstance(value, list | tuple):
            parts: list[tuple[str, Any]] = [(f"[{i}]", item) for i, item in enumerate(value)]
        elif isinstance(value, dict):
            parts = [(f"[{key!r}]", item) for key, item in value.items()]
        else:
            break
        refused = next((part for part in parts if not _serializes(serde, part[1])), None)
        if refused is None:
            break
        path, value = path + refused[0], refused[1]
    return CheckpointSerializationError(path, type(value).__qualname__, str(exc))


def _serializes(serde: SerializerProtocol, value: Any) -> bool:
    try:
        serde.dumps_typed(value)
    except (TypeError, ValueError):
        return False
    return True
