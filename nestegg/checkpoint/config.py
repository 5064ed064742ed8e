"""Checkpoint settings: where to store (CheckpointConfig) and when (CheckpointPolicy)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from nestegg.constants import DEFAULT_LEASE
from nestegg.errors import ConfigurationError
from nestegg.identifiers import agent_names, check_name
from nestegg.options import is_count, shown

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage

Durability = Literal["sync", "async", "exit"]
DURABILITIES = ("sync", "async", "exit")
STORE_METHODS = ("setup", "create_run", "get_run", "commit")
"""What CheckpointConfig.storage must have to be taken for a store (a URL is not one)."""


@dataclass(frozen=True)
class CheckpointPolicy:
    """When checkpoints are taken and how long they are kept.

    Args:
        every_n_steps: checkpoint after every N-th step (1: after each step).
        on_agent_complete: agent names (a list, tuple or set) after which a checkpoint
            is always taken.
        keep_latest: keep the newest N checkpoints per run (None: keep all).
        ttl: delete whole finished runs after this long without activity.
        min_interval: never two policy checkpoints closer than this (final and manual
            ones are exempt).
        durability: "sync" commits each step before the next starts; "async" writes in
            the background and flushes before ``run`` returns; "exit" writes the run when
            it starts, and its steps and journaled calls only when it ends, fails, waits
            or is cancelled.

    Raises:
        ConfigurationError: a value out of range, naming the field.

    Example:
        >>> CheckpointPolicy(every_n_steps=1, keep_latest=3, ttl=timedelta(days=7))
    """

    every_n_steps: int = 1
    on_agent_complete: tuple[str, ...] | list[str] | set[str] | frozenset[str] | None = None
    keep_latest: int | None = 3
    ttl: timedelta | None = None
    min_interval: timedelta | None = None
    durability: Durability = "sync"

    def __post_init__(self) -> None:
        if not is_count(self.every_n_steps):
            raise ConfigurationError(
                "CheckpointPolicy.every_n_steps must be an int >= 1, got "
                f"{shown(self.every_n_steps)}"
            )
        if self.keep_latest is not None and not is_count(self.keep_latest):
            raise ConfigurationError(
                "CheckpointPolicy.keep_latest must be an int >= 1 or None, got "
                f"{shown(self.keep_latest)}"
            )
        for name in ("ttl", "min_interval"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, timedelta) or value.total_seconds() < 0
            ):
                raise ConfigurationError(
                    f"CheckpointPolicy.{name} must be a non-negative timedelta or None, "
                    f"got {value!r}"
                )
        if self.durability not in DURABILITIES:
            raise ConfigurationError(
                f"CheckpointPolicy.durability must be one of {DURABILITIES}, "
                f"got {self.durability!r}"
            )
        if (given := self.on_agent_complete) is not None:
            unordered = isinstance(given, set | frozenset)  # the order does not matter here
            where = "CheckpointPolicy.on_agent_complete"
            named = agent_names(list(given) if unordered else given, where, "on_agent_complete")
            object.__setattr__(self, "on_agent_complete", tuple(named))


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how a Clutch checkpoints its runs.

    Args:
        storage: a store, or None for the embedded default (SQLite at
            ``$NESTEGG_HOME/nestegg.db``, ``NESTEGG_HOME`` defaulting to ``~/.nestegg``).
        policy: when to checkpoint and what to keep.
        run_id: the id of every run of this Clutch that ``run()`` gets no ``run_id=`` for
            (None: a new id for every run). For a one-off job: a completed run id given
            another input raises RunExistsError, so a pipeline that runs many inputs passes
            ``run(input, run_id=...)`` instead.
        lease: how long a run's owner holds it without a heartbeat before another
            process may take it over.
        clock: the time (UNIX seconds) that leases, heartbeats, the ``ttl`` and
            ``min_interval`` of the policy and stored timestamps are measured by;
            ``time.time`` unless a test passes a fake one.

    Raises:
        ConfigurationError: a value out of range, naming the field.
        InvalidIdentifierError: ``run_id`` is not None and no run can have it (not a
            string, empty, a path separator, '..', a NUL, a line break: the rule of
            ``run(input, run_id=...)``), naming the field.

    Example:
        >>> CheckpointConfig(storage=FileCheckpointStorage(Path("./checkpoints")),
        ...                  policy=CheckpointPolicy(keep_latest=3))
    """

    storage: CheckpointStorage | None = None
    policy: CheckpointPolicy = field(default_factory=CheckpointPolicy)
    run_id: str | None = None
    lease: timedelta = DEFAULT_LEASE
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if self.storage is not None and not all(
            callable(getattr(self.storage, name, None)) for name in STORE_METHODS
        ):
            hint = (
                f" (a URL: storage=open_store({self.storage!r}), from nestegg.checkpoint)"
                if isinstance(self.storage, str)
                else ""
            )
            raise ConfigurationError(
                "CheckpointConfig.storage must be a store (SQLiteCheckpointStorage(...), "
                f"open_store(url), ...) or None, got {self.storage!r}{hint}"
            )
        if not isinstance(self.policy, CheckpointPolicy):
            raise ConfigurationError(
                f"CheckpointConfig.policy must be a CheckpointPolicy, got {self.policy!r}"
            )
        if self.run_id is not None:
            check_name(self.run_id, "CheckpointConfig.run_id")
        if not isinstance(self.lease, timedelta) or self.lease.total_seconds() <= 0:
            raise ConfigurationError(
                f"CheckpointConfig.lease must be a positive timedelta, got {self.lease!r}"
            )
        if not callable(self.clock):
            raise ConfigurationError(
                f"CheckpointConfig.clock must be a callable giving UNIX seconds, got {self.clock!r}"
            )


def check_checkpoint(value: object, pipeline: str) -> None:
    """Refuse a Clutch's ``checkpoint=`` that is not a CheckpointConfig (None, no
    checkpointing, is not passed here), when the Clutch is built rather than in its first
    run; a store or a URL gets the CheckpointConfig to put it in.

    Raises:
        ConfigurationError: naming the Clutch, the value and what ``checkpoint=`` takes.
    """
    if isinstance(value, CheckpointConfig):
        return
    if isinstance(value, str):
        hint = f"; for a store URL: CheckpointConfig(storage=open_store({value!r}))"
    elif all(callable(getattr(value, name, None)) for name in STORE_METHODS):
        hint = "; for a store: CheckpointConfig(storage=store)"
    else:
        hint = ""
    raise ConfigurationError(
        f"Clutch {pipeline!r}: checkpoint= must be a CheckpointConfig "
        f"(CheckpointConfig(storage=...), nestegg.checkpoint) or None for no checkpointing, "
        f"got {value!r}{hint}"
    )
