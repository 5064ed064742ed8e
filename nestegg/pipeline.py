"""The base of Clutch: a pipeline's hooks, store and transport, and the building and
driving of its runs' executions, which is what checkpointing needs of it (the
``Pipeline`` Protocol of ``nestegg.checkpoint.pipeline``); its definition (agents,
selector, order) is its own base's, ``nestegg.definition.PipelineDefinition``.

:class:`~nestegg.Clutch` adds the public API on top: run, submit and stream, the
stored-run methods, and the distributed mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Self

from nestegg import telemetry_attempts
from nestegg.agents import AgentNode, to_plain
from nestegg.context import ClutchContext, ClutchState
from nestegg.definition import PipelineDefinition, Selector
from nestegg.errors import ConfigurationError
from nestegg.execution import NullRecorder, Recorder, RunExecution, StepHook
from nestegg.identifiers import check_pipeline_name
from nestegg.options import is_count, shown
from nestegg.strategies import Cursor, Strategy, make_cursor
from nestegg.task import ClutchTask, Late, StepListeners, until_started

if TYPE_CHECKING:
    from nestegg.checkpoint.config import CheckpointConfig
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.transport.base import Transport

RequestHook = Callable[[dict[str, Any]], Awaitable[None]]
ResponseHook = Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]]
CheckpointHook = Callable[[Any], Awaitable[None]]
RefusalHook = Callable[[Exception], Awaitable[None]]


class PipelineBase(PipelineDefinition):
    """A pipeline's definition and the executions of its runs (the base of Clutch, whose
    docstring describes the arguments)."""

    def __init__(
        self,
        name: str,
        strategy: Strategy = Strategy.SEQUENTIAL,
        max_turns: int = 100,
        transport: Any = None,
        order: list[str] | None = None,
        on_request: RequestHook | None = None,
        on_response: ResponseHook | None = None,
        on_step: StepHook | None = None,
        *,
        checkpoint: CheckpointConfig | None = None,
        on_checkpoint: CheckpointHook | None = None,
    ) -> None:
        if checkpoint is not None:  # checked, and its code loaded now, not in the first run
            from nestegg.checkpoint.config import check_checkpoint

            check_checkpoint(checkpoint, name)
            import nestegg.checkpoint.runs  # noqa: F401
        if checkpoint is not None or transport is not None:  # stored with every run
            check_pipeline_name(name)
        if not isinstance(strategy, Strategy):
            raise ConfigurationError(
                f"strategy must be a nestegg.Strategy (one of "
                f"{', '.join(s.name for s in Strategy)}), got {strategy!r}"
            )
        if not is_count(max_turns, least=0):
            raise ConfigurationError(f"max_turns must be an int >= 0, got {shown(max_turns)}")
        for hook_name, hook in (
            ("on_request", on_request),
            ("on_response", on_response),
            ("on_step", on_step),
            ("on_checkpoint", on_checkpoint),
        ):
            if hook is not None:
                _check_hook(hook_name, hook)
        self.name = name
        self.strategy = strategy
        self.max_turns = max_turns
        self._explicit_order = list(order) if order is not None else None
        self._agents: dict[str, AgentNode] = {}
        self._agent_order: list[str] = []
        self._selector: Selector | None = None
        self._selector_input_type: type | None = None
        self._on_request = on_request
        self._on_response = on_response
        self._on_step = on_step
        self._on_checkpoint = on_checkpoint
        self._checkpoint_config = checkpoint
        self._runbook: CheckpointedRuns | None = None
        self._executions: dict[str, RunExecution] = {}
        self.transport: Transport | None = _transport(name, transport, checkpoint)
        self._transport_held = contextlib.AsyncExitStack()
        """The transport's connection held in use by ``async with clutch`` (Clutch)."""

    def validate(self) -> None:
        """Check the definition (names in ``order=`` and ``edges=`` exist) and that the
        agents the checkpoint policy's ``on_agent_complete`` names do: when a run starts,
        resumes or is forked, before anything is stored.

        Raises:
            ConfigurationError: naming the unknown agent and where it was named.
        """
        super().validate()
        if self._checkpoint_config is not None:
            named = self._checkpoint_config.policy.on_agent_complete or ()
            self.check_registered(named, "CheckpointPolicy.on_agent_complete")

    # ------------------------------------------ the seam used by checkpointing

    @property
    def agent_names(self) -> tuple[str, ...]:
        """The registered agents' names, in registration order."""
        return tuple(self._agents)

    def input_type(self, agent: str | None) -> type | None:
        """The annotation of ``agent``'s first parameter (None: of the selector's), which
        the data it gets is rebuilt as; None without one, or for an unknown agent."""
        if agent is None:
            return self._selector_input_type
        node = self._agents.get(agent)
        return node.input_type if node is not None else None

    @property
    def run_order(self) -> list[str]:
        """The agents in the order the strategy runs them (``order=`` or registration)."""
        return list(self._get_order())

    @property
    def on_checkpoint(self) -> CheckpointHook | None:
        """The hook awaited with a CheckpointInfo after each stored checkpoint."""
        return self._on_checkpoint

    @property
    def checkpoint_config(self) -> CheckpointConfig | None:
        """The CheckpointConfig given (None: no checkpointing)."""
        return self._checkpoint_config

    def new_context(self, run_id: str, data: Any) -> ClutchContext:
        """A fresh context of run ``run_id`` holding ``data`` (its source: the input)."""
        state = ClutchState(run_id, self.strategy.value, list(self._get_order()))
        return ClutchContext(data=data, source="input", state=state)

    def new_cursor(self) -> Cursor:
        """The strategy's cursor for a run at its start (``restore`` moves it)."""
        choose = self._select if self._selector else None
        return make_cursor(self.strategy, self._get_order(), self._agents, choose)

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
        """The execution of the run of ``ctx``, recording through ``recorder``.

        Args:
            ctx: the run's context (:meth:`new_context`).
            recorder: where its steps go (a checkpointer, or a NullRecorder).
            listeners: the queues that stream its steps.
            cursor: the strategy's cursor (None: a new one, :meth:`new_cursor`).
            seq: the last step recorded (0: none).
            data_seq: the step that produced the current data (0: the input).
            next_agent: the agent to run next before asking the cursor.
        """
        return RunExecution(
            ctx=ctx,
            cursor=cursor if cursor is not None else self.new_cursor(),
            agents=self._agents,
            max_turns=self.max_turns,
            recorder=recorder,
            listeners=listeners,
            on_step=self._on_step,
            seq=seq,
            data_seq=data_seq,
            next_agent=next_agent,
        )

    async def drive(
        self,
        execution: RunExecution,
        input_data: Any,
        *,
        fresh: bool,
        refused: RefusalHook | None = None,
    ) -> Any:
        """Run ``execution`` to its end with this Clutch's hooks; its result.

        ``on_request`` is awaited first when ``fresh`` (the run starts from its input), and
        ``on_response`` after it; meanwhile :meth:`checkpoint` reaches the execution.
        ``refused`` is awaited with the exception of an ``on_request`` that raises.
        """
        if execution.recorder.journals:  # a checkpointed attempt is a span already
            return await self._drive(execution, input_data, fresh, refused)
        # A partial, not a lambda: this coroutine, alive as long as its run, keeps no cells.
        work = functools.partial(self._drive, execution, input_data, fresh, refused)
        return await telemetry_attempts.traced_plain_run(self, execution, work)

    async def _drive(
        self,
        execution: RunExecution,
        input_data: Any,
        fresh: bool,
        refused: RefusalHook | None,
    ) -> Any:
        run_id = execution.run_id
        self._executions[run_id] = execution
        work = functools.partial(self._execute, execution)  # no closures held per run
        try:
            return await self.call_with_hooks(
                run_id, input_data, work, fresh=fresh, refused=refused
            )
        finally:
            self._forget(execution)

    async def _execute(self, execution: RunExecution) -> Any:
        try:
            return await execution.execute()
        finally:
            self._forget(execution)  # before on_response: checkpoint() no longer reaches the run

    def _forget(self, execution: RunExecution) -> None:
        if self._executions.get(execution.run_id) is execution:
            del self._executions[execution.run_id]

    async def call_with_hooks(
        self,
        run_id: str,
        input_data: Any,
        work: Callable[[], Awaitable[Any]],
        *,
        fresh: bool = True,
        refused: RefusalHook | None = None,
    ) -> Any:
        """Await ``work()`` between this Clutch's ``on_request`` and ``on_response`` hooks.

        The run's hooks for whoever produces its result: a local execution
        (:meth:`drive`) or a caller waiting for workers (``transport=``).

        Args:
            run_id: the run (the hooks' ``clutch_id``).
            input_data: the run's input, as plain data (the request's ``input``).
            work: produces the run's result.
            fresh: the run starts from its input now (False: a resume from a recorded
                step, ``on_request`` is not awaited).
            refused: awaited with the exception of an ``on_request`` that raises, before
                it is raised (and ``work`` is not awaited): it records the run as failed.

        Returns:
            What ``work()`` returned.

        Example:
            >>> await clutch.call_with_hooks(run_id, data, lambda: wait_for_workers(run_id))
        """
        request = {"clutch_id": run_id, "input": input_data}
        if fresh and self._on_request is not None:
            try:
                await self._on_request(request)
            except Exception as error:
                if refused is not None:
                    await refused(error)
                raise
        result = await work()
        if self._on_response is not None:
            response = {"_clutch_response": True, "clutch_id": run_id, "result": result}
            await self._on_response(request, response)
        return result

    def checkpointed_runs(self) -> CheckpointedRuns:
        """The service that starts, resumes, forks and reads this Clutch's stored runs.

        Raises:
            ConfigurationError: the Clutch has no checkpointing.
        """
        return self._checkpointing()

    @contextlib.contextmanager
    def using_store(self, storage: CheckpointStorage) -> Iterator[Self]:
        """Point this Clutch at ``storage`` for the duration of the ``with`` block.

        Its CheckpointConfig is kept except for the store; the Clutch's own store is
        neither closed nor replaced for good (the caller closes ``storage``).

        Raises:
            ConfigurationError: the Clutch has no checkpointing.

        Example:
            >>> with clutch.using_store(other_store):
            ...     await clutch.resume_latest("run-1")
        """
        config = self._checkpoint_config
        if config is None:
            raise ConfigurationError(
                f"Clutch {self.name!r} has no checkpointing: pass checkpoint=CheckpointConfig()"
            )
        saved = self._runbook
        self._checkpoint_config = dataclasses.replace(config, storage=storage)
        self._runbook = None
        try:
            yield self
        finally:
            self._checkpoint_config = config
            self._runbook = saved

    def _book(self) -> CheckpointedRuns:
        if self._runbook is None:
            from nestegg.checkpoint.runs import CheckpointedRuns

            assert self._checkpoint_config is not None
            self._runbook = CheckpointedRuns(self, self._checkpoint_config)
        return self._runbook

    def _checkpointing(self) -> CheckpointedRuns:
        if self._checkpoint_config is None:
            raise ConfigurationError(
                f"Clutch {self.name!r} has no checkpointing: pass checkpoint=CheckpointConfig()"
            )
        return self._book()

    async def _run_plain(self, input_data: Any, listeners: StepListeners) -> Any:
        from nestegg.checkpoint.records import new_run_id

        data = to_plain(input_data)
        ctx = self.new_context(new_run_id(), data)
        execution = self.new_execution(ctx, NullRecorder(), listeners)
        return await self.drive(execution, data, fresh=True)

    async def _launch(
        self,
        work: Callable[[StepListeners], Coroutine[Any, Any, Any]],
        listeners: StepListeners,
        late: Late | None = None,
        started: asyncio.Event | None = None,
    ) -> ClutchTask:
        self.validate()
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(work(listeners))
        if started is not None:
            await until_started(task, started)
        return ClutchTask(f"task-{id(task):x}", task, listeners, late)


HOOK_ARGUMENTS = {
    "on_request": ("request",),
    "on_response": ("request", "response"),
    "on_step": ("agent_name", "input", "output"),
    "on_checkpoint": ("info",),
}
"""What each hook of a Clutch is awaited with, in order."""


def _check_hook(hook_name: str, hook: Callable[..., Any]) -> None:
    """Refuse a hook that is not async, or that cannot take what it is awaited with (a
    TypeError at the end of a run, its steps done)."""
    if not inspect.iscoroutinefunction(hook):
        raise ConfigurationError(f"{hook_name} must be an async function")
    arguments = HOOK_ARGUMENTS[hook_name]
    try:
        signature = inspect.signature(hook)
        signature.bind(*arguments)
    except ValueError:  # no signature to read: it is called as it is
        return
    except TypeError:
        bare = signature.replace(  # its parameters as written, without annotations
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        raise ConfigurationError(
            f"{hook_name} is awaited with ({', '.join(arguments)}), which "
            f"{getattr(hook, '__name__', hook)}{bare} cannot take"
        ) from None


def _transport(name: str, transport: Any, checkpoint: CheckpointConfig | None) -> Any:
    """The Clutch's transport from ``transport=`` (a Transport or a URL), checked against
    its checkpointing: workers need a store they all reach."""
    if transport is None:
        return None
    from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
    from nestegg.transport.base import Transport, transport_from_url

    if checkpoint is None:
        raise ConfigurationError(
            f"Clutch {name!r}: transport= needs checkpoint=CheckpointConfig(storage=...) with "
            "a store every worker reaches (PostgreSQL, Redis; SQLite for one host)"
        )
    if isinstance(checkpoint.storage, MemoryCheckpointStorage):
        raise ConfigurationError(
            f"Clutch {name!r}: transport= cannot use the memory store (workers in other "
            "processes do not see it); use PostgreSQL, Redis or SQLite (one host)"
        )
    if isinstance(transport, str):
        return transport_from_url(transport)
    if not isinstance(transport, Transport):
        raise ConfigurationError(
            f"Clutch {name!r}: transport= must be a URL (redis://, rediss://, amqp://, "
            f"amqps://) or a nestegg Transport, got {transport!r}"
        )
    return transport
