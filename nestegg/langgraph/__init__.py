"""LangGraph on nestegg: :class:`NestEggSaver`, a LangGraph checkpointer over any nestegg
store (``pip install 'nestegg[langgraph]'``).

Example:
    >>> from nestegg.langgraph import NestEggSaver
    >>> with NestEggSaver.from_url("sqlite:///graph.db") as saver:
    ...     graph = builder.compile(checkpointer=saver)
"""

from __future__ import annotations

try:
    import langgraph.checkpoint.base  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    from nestegg.errors import MissingDependencyError

    raise MissingDependencyError(
        f"nestegg.langgraph needs langgraph-checkpoint ({exc.name}): "
        "pip install 'nestegg[langgraph]'"
    ) from exc

from nestegg.langgraph.saver import NestEggSaver

__all__ = ["NestEggSaver"]
