"""What checkpointing needs of the orchestrator: the ``Pipeline`` Protocol.

``Clutch`` fills it with public methods; nothing under ``nestegg/checkpoint/`` imports
``nestegg.clutch``. The checkpointed-runs service builds a run's context and cursor,
restores them from a checkpoint, builds the execution with its checkpointer and drives it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from nestegg.context import ClutchContext
from nestegg.execution import Recorder, RunExecution
from nestegg.strategies import Cursor
from nestegg.task import StepListeners


class Pipeline(Protocol):
    """A pipeline definition that runs can be built from and driven by (a ``Clutch``)."""

    @property
    def name(self) -> str:
        """The pipeline's name, stored with each run."""

    @property
    def agent_names(self) -> tuple[str, ...]:
        """The registered agents' names."""

    @property
    def max_turns(self) -> int:
        """The turns after which a run stops."""

    def input_type(self, agent: str | None) -> type | None:
        """The annotation of ``agent``'s first parameter (None: of the selector's)."""

    @property
    def on_checkpoint(self) -> Callable[[Any], Awaitable[None]] | None:
        """Awaited with a CheckpointInfo after each stored checkpoint."""

    def validate(self) -> None:
        """Check the definition (raises ConfigurationError)."""

    def new_context(self, run_id: str, data: Any) -> ClutchContext:
        """A fresh context of run ``run_id`` holding ``data``."""

    def new_cursor(self) -> Cursor:
        """The strategy's cursor for a run at its start."""

    def new_execution(
        self,
        ctx: ClutchContext,
        recorder: Recorder,
        listeners: StepListeners,
        *,
        cursor: Cursor | None = None,
        seq: int = 0,
        data_seq: int = 0,
        next_agent: str | None = None,
    ) -> RunExecution:
        """The execution of the run of ``ctx``, recording through ``recorder``."""

    async def drive(
        self,
        execution: RunExecution,
        input_data: Any,
        *,
        fresh: bool,
        refused: Callable[[Exception], Awaitable[None]] | None = None,
    ) -> Any:
        """Run ``execution`` to its end with the pipeline's hooks (``on_request`` when
        ``fresh``; ``refused`` awaited with its exception if it raises); its result."""
