"""Clutch: a set of async agents run by a strategy, optionally checkpointed to a store.

This module holds the public API of running (run, submit, stream), the distributed mode
(serve, result) and the methods that start or continue stored runs (checkpoint, resume,
fork); those that read and keep them (history, listing, events, recover, signal, cancel,
delete, cleanup) are its base, ``nestegg.stored_runs.StoredRuns``, and the definition and
the executions that one's, ``nestegg.pipeline.PipelineBase``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from nestegg.constants import REASON_AGENT, REASON_MANUAL
from nestegg.context import current_context
from nestegg.durations import seconds_or_none
from nestegg.errors import ConfigurationError, NoActiveRunError
from nestegg.identifiers import check_name
from nestegg.stored_runs import StoredRuns
from nestegg.task import ClutchTask, LocalLate, StepEvent, StepListeners


class Clutch(StoredRuns):
    """A pipeline of async agents run by a strategy; with ``checkpoint=`` it survives crashes.

    Args:
        name: the pipeline's name (also recorded with every checkpointed run and part of
            the broker's channel names): with ``checkpoint=`` or ``transport=``, a string
            with no NUL and no lone surrogate, which no store keeps; without them, any
            name, as eggai-clutch takes it.
        strategy: SEQUENTIAL, ROUND_ROBIN, GRAPH or SELECTOR.
        max_turns: stop after this many turns (steps that produced data).
        transport: a broker URL (``redis://``, ``rediss://``, ``amqp://``, ``amqps://``) or a
            :class:`~nestegg.transport.Transport`: runs are executed by workers
            (:meth:`serve`, ``nestegg worker``) and this Clutch's ``run``, ``submit`` and
            ``stream`` only store them and publish their steps. Needs ``checkpoint=`` with
            a store every worker reaches.
        order: explicit agent order (default: registration order).
        on_request: awaited with ``{"clutch_id", "input"}`` before a run's first step: when
            it starts, and again by ``resume_latest`` (and ``recover``) only when the
            store says it never passed: the run starts from its input and failed with the
            hook's error, or is running or cancelled with no step in its event log (not
            even a step's start), claimed by a process (a caller on workers stores its run
            unclaimed, once the hook passed). ``resume(checkpoint_id)`` and ``fork`` never
            await it.
            If it raises, the caller gets its exception and a checkpointed run is stored
            failed with it (``"hook": "on_request"`` in the stored error), not left for
            recover.
        on_response: awaited with two dicts once a run completes: the request
            (``{"clutch_id", "input"}``, as ``on_request`` gets it) and the response
            (``{"_clutch_response": True, "clutch_id", "result"}``); not for a run that
            fails, waits or is cancelled.
        on_step: awaited with ``(agent_name, input, output)`` after each agent returns.
        checkpoint: a CheckpointConfig to checkpoint every step to a store (None: in memory).
        on_checkpoint: awaited with a CheckpointInfo after each checkpoint is stored.

    Raises:
        InvalidIdentifierError: with ``checkpoint=`` or ``transport=``, ``name`` is no
            string or holds a NUL or a lone surrogate (naming it and why).
        ConfigurationError: ``checkpoint`` is neither a CheckpointConfig nor None,
            ``strategy`` is not a Strategy, or a hook is not async or cannot take what it
            is awaited with (naming both); a
            transport without checkpointing or with the memory store; a transport URL of an
            unknown scheme or that cannot be parsed (a bad host, port or database).
        MissingDependencyError: the broker's client is not installed.

    Example:
        >>> clutch = Clutch("review", strategy=Strategy.SEQUENTIAL)
        >>> @clutch.agent()
        ... async def summarize(text: str) -> str:
        ...     return text[:100]
        >>> await clutch.run("a long text")
    """

    async def submit(self, input_data: Any, *, run_id: str | None = None) -> ClutchTask:
        """Start a run in the background and return its handle.

        With checkpointing, it returns once the run is stored (with a transport: and its
        first step published), or its id's completed result is found, so that a run
        submitted is never lost: if the caller's event loop ends right after
        (``asyncio.run(clutch.submit(...))``), the workers run it, or, without a transport,
        it stays in the store as cancelled, for ``resume_latest``. What fails before that
        is raised here.

        Args:
            input_data: the first agent's input (a pydantic model is dumped to a dict).
            run_id: with checkpointing, the run's id (overrides the configured one).

        Returns:
            A ClutchTask to await, wait on with a timeout, stream or cancel.

        Raises:
            ConfigurationError: the Clutch's definition is inconsistent.
            RunExistsError: with checkpointing, the run id belongs to an unfinished run
                (resume it instead), or to a completed run of another input.
            StorageUnavailableError, TransportError: with a transport, the store or the
                broker failed before the run's first step was published.
        """
        return await self._submit(input_data, run_id, StepListeners(), until_published=True)

    async def _submit(
        self,
        input_data: Any,
        run_id: str | None,
        listeners: StepListeners,
        until_published: bool = False,
    ) -> ClutchTask:
        if self._checkpoint_config is None:
            if run_id is not None:
                raise ConfigurationError("run_id= needs checkpointing (checkpoint=...)")
            return await self._launch(lambda lst: self._run_plain(input_data, lst), listeners)
        book = self._book()
        if self.transport is not None:
            from nestegg.transport.caller import RemoteProgress, run_remote

            transport, progress = self.transport, RemoteProgress(self.name)
            published = asyncio.Event()
            return await self._launch(
                lambda lst: run_remote(
                    self, book, transport, input_data, run_id, lst, progress, published.set
                ),
                listeners,
                progress.late,
                published if until_published else None,
            )
        stored, chosen = asyncio.Event(), book.new_id(run_id)
        return await self._launch(
            lambda lst: book.run(input_data, chosen, lst, stored.set),
            listeners,
            LocalLate(chosen, stored, book.store),
            stored if until_published else None,
        )

    async def run(
        self, input_data: Any, timeout: float | None = 30.0, *, run_id: str | None = None
    ) -> Any:
        """Run the pipeline on ``input_data`` and return the last data.

        With checkpointing, a ``run_id`` that already completed with the same input returns
        its stored result without executing anything.

        Args:
            input_data: the first agent's input.
            timeout: seconds to wait (None: no limit); on timeout the run goes on.
            run_id: with checkpointing, the run's id (overrides the configured one).

        Raises:
            TimeoutError: the run did not finish within ``timeout``; its message says that
                it goes on, and with checkpointing how to get its outcome
                (``clutch.result(run_id)``), or that its cancel was requested from outside
                (``nestegg cancel``), which takes effect at its next commit.
            TransportError: with a transport, the broker failed or did not answer before
                the run's first step was published (also when ``timeout`` ended while a
                RabbitMQ connection waited for its AMQP handshake); the run is stored and
                the message says what becomes of it.
            ConfigurationError: ``timeout`` is not None, a timedelta or seconds from 0 to 100
                years.
            RunExistsError: the run id belongs to an unfinished run (resume it instead), or
                to a completed run of another input (pass a new run id, or delete that run).
            RunLockedError: another live process is executing that run.
            RunWaiting: the run waits for a signal or a timer (``nestegg.wait_for``,
                ``nestegg.sleep``); it is stored as ``waiting`` and this process is free.
        """
        seconds_or_none(timeout, "timeout")  # before anything runs or is stored
        # Not submit(): the timeout covers storing and publishing the run too.
        task = await self._submit(input_data, run_id, StepListeners())
        return await task.result(timeout=timeout)

    async def stream(
        self, input_data: Any, *, run_id: str | None = None
    ) -> AsyncIterator[StepEvent]:
        """Run the pipeline and yield a StepEvent per step, then the final result event."""
        listeners = StepListeners()
        queue = listeners.attach()
        task = await self._submit(input_data, run_id, listeners)
        async for event in task.stream(queue):
            yield event

    async def __aenter__(self) -> Clutch:
        """Hold the transport's connection open until the block ends, for every run in it
        (without ``async with``, a RabbitMQ connection lasts as long as the runs that
        use it; Redis Streams keeps its connections either way)."""
        if self.transport is not None:
            from nestegg.transport.base import using

            await self._transport_held.enter_async_context(using(self.transport))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Release the checkpoint store if this Clutch opened it, and the transport."""
        if self._runbook is not None:
            await self._runbook.close()
        if self.transport is not None:
            await self._transport_held.aclose()
            await self.transport.close()

    # ---------------------------------------------------------- distributed mode

    async def result(self, run_id: str, timeout: float | None = None) -> Any:
        """Wait for a stored run's outcome, whichever process started or executes it.

        Works with and without a transport: a caller that restarted gets the result of a
        run it started before.

        Args:
            run_id: the run.
            timeout: seconds to wait (None: no limit).

        Returns:
            The run's result once it completed.

        Raises:
            RunFailedError: the run failed (names the agent, the error's type and message)
                or was cancelled.
            RunNotFoundError: no such run.
            RunWaiting: the run waits for a signal that is not stored, or for a deadline or
                timer not passed yet. Of a timer, it says a worker's sweep resumes the run
                when this Clutch has a transport, else ``recover()``. A run whose wait is
                over is waited for when this Clutch has a transport (a worker's sweep
                resumes it); without one, nothing would resume it while this waits, so it
                raises at once (``over`` set), saying that ``recover()`` or
                ``resume_latest(run_id)`` continues the run.
            TimeoutError: not finished within ``timeout``.
            ConfigurationError: the Clutch has no checkpointing, or the run belongs to
                another pipeline.

        Example:
            >>> result = await clutch.result("run-0193...", timeout=60)
        """
        from nestegg.checkpoint.admission import check_pipeline
        from nestegg.transport.caller import wait_result

        book = self._checkpointing()
        store = await book.ready()
        run_id = check_name(run_id, "run id")

        def own(run: RunRecord) -> None:  # every look at the run: never another's result
            check_pipeline(run, self.name, ": its result is not this pipeline's")

        on_workers = self.transport is not None
        return await wait_result(
            store, run_id, timeout, seen=own, clock=book.config.clock, on_workers=on_workers
        )

    async def serve(
        self,
        concurrency: int = 1,
        agents: list[str] | None = None,
        *,
        grace: float = 30.0,
        sweep_interval: float | None = None,
        sweep_after: float | None = None,
        misfit_grace: float | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        """Be a worker: run the steps of this pipeline's runs from the transport until
        SIGTERM or SIGINT (or cancelled), then drain.

        Each message runs one step: claim the run, run the step, commit it fenced,
        publish the next step's message, ack. On SIGTERM no new messages are taken; steps
        under way get ``grace`` seconds, then their runs are released (checkpoint kept)
        for another worker to take at once.

        Args:
            concurrency: steps run at the same time.
            agents: the agents this worker hosts (None: all of them).
            grace: seconds the steps under way get to finish once stopping.
            sweep_interval: seconds between sweeps for runs whose message was lost
                (None: the lease).
            sweep_after: how long such a run must be untouched (None: five leases).
            misfit_grace: seconds a step whose data does not fit its agent's model here
                stays set aside for a worker whose model fits before the run is failed
                with IncompatibleDataError (None: ten leases).
            on_ready: called once, when the worker's channels are set up on the broker
                and it consumes them (``nestegg worker`` prints its start line then).

        Raises:
            ConfigurationError: no transport, an unknown agent, a bad concurrency, grace,
                sweep_interval (not above 0), sweep_after or misfit_grace (below 0, NaN).

        Example:
            >>> await clutch.serve(concurrency=8, agents=["classify"])
        """
        from nestegg.transport.worker import Worker, serve

        if self.transport is None:
            raise ConfigurationError(
                f"Clutch {self.name!r} has no transport: pass transport='redis://...'"
            )
        self.validate()
        worker = Worker(
            self,
            self.transport,
            concurrency=concurrency,
            agents=agents,
            grace=grace,
            sweep_interval=sweep_interval,
            sweep_after=sweep_after,
            misfit_grace=misfit_grace,
            on_ready=on_ready,
        )
        await serve(worker)

    # ------------------------------------------------------------- checkpointing

    async def checkpoint(self, run_id: str | None = None) -> str:
        """Take a checkpoint now and return its id.

        Inside an agent: a checkpoint of the state the running step started from.
        Outside: of the executing run (``run_id`` when several execute) at its next step
        boundary.

        Raises:
            NoActiveRunError: no run of this Clutch executes (or several and no run_id).
            ConfigurationError: the Clutch has no checkpointing.
        """
        self._checkpointing()
        ctx = current_context()
        execution = ctx._execution if ctx is not None else None
        if execution is not None and self._executions.get(execution.run_id) is execution:
            if run_id is None or run_id == execution.run_id:
                recorder = execution.recorder
                return await recorder.checkpoint_now(REASON_AGENT, execution.current_agent)
        if run_id is None:
            if len(self._executions) != 1:
                raise NoActiveRunError(
                    f"checkpoint() needs exactly one executing run of Clutch {self.name!r}; "
                    f"executing: {sorted(self._executions) or 'none'} (pass run_id=)"
                )
            run_id = next(iter(self._executions))
        execution = self._executions.get(run_id)
        if execution is None:
            raise NoActiveRunError(f"run {run_id!r} is not executing in this Clutch")
        return await execution.recorder.checkpoint_now(REASON_MANUAL, None)

    async def resume(
        self, checkpoint_id: str, *, timeout: float | None = None, reopen_cancelled: bool = True
    ) -> Any:
        """Resume the run of ``checkpoint_id`` from that checkpoint; steps after it run again.
        ``reopen_cancelled`` as for :meth:`resume_latest`.

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            CheckpointCorruptedError: the checkpoint or a step it needs is damaged.
            IncompatibleCheckpointError: an agent the checkpoint needs is gone, or
                (IncompatibleDataError) the data it goes on with no longer fits the model
                of the agent it goes to; nothing is claimed or stored.
            RunLockedError: a live process executes the run; (RunFinishedError) it was
                cancelled since it was read, or is cancelled and ``reopen_cancelled`` is false.
        """
        book = self._checkpointing()
        again, late = reopen_cancelled, LocalLate(None, asyncio.Event(), book.store)
        task = await self._launch(
            lambda lst: book.resume(checkpoint_id, lst, reopen_cancelled=again, named=late.named),
            StepListeners(),
            late,
        )
        return await task.result(timeout=timeout)

    async def resume_latest(
        self,
        run_id: str | None = None,
        *,
        timeout: float | None = None,
        reopen_cancelled: bool = True,
        here: bool = False,
    ) -> Any:
        """Resume a run (the configured one by default) from its newest valid checkpoint.

        A completed run returns its stored result; a run without checkpoints starts again
        from its stored input; a failed run retries the step that failed. Damaged
        checkpoints are skipped with a CheckpointFallbackWarning. A waiting run goes on
        once its wait is over: its signal is stored, or its deadline or timer has passed.
        A cancelled run goes on too (on purpose), unless ``reopen_cancelled`` is false: a
        caller that read the run unfinished passes that, so that a cancel that came first
        wins. A run cancelled after this read it, before its claim, is never reopened.

        With a transport, the run is handed back to the workers (a failed or cancelled
        run is reopened, its ``run_resumed`` written, and its next step published) and
        its result awaited as :meth:`result` does; ``here=True`` runs it in this process
        instead. The checks, and the refusals below, are the same either way.

        Raises:
            RunNotFoundError: no such run.
            RunLockedError: a live process executes the run; (RunFinishedError) it was
                cancelled since it was read, or is cancelled and ``reopen_cancelled`` is
                false.
            RunWaiting: the run waits: at once, with nothing run or stored, when its wait
                is not over (send the signal, or resume it once its time has come); or
                at its next wait, after it went on.
            ConfigurationError: the run belongs to another pipeline.
            IncompatibleCheckpointError: an agent the checkpoint needs is gone, or
                (IncompatibleDataError) the data it goes on with no longer fits the model
                of the agent it goes to; nothing is claimed or stored.
            EventLogDamagedError: its event log is torn and the resume has to read it (what
                a waiting run waits for, whether the run's ``on_request`` hook passed);
                nothing is claimed or stored.
        """
        book = self._checkpointing()
        again = reopen_cancelled
        if self.transport is not None and not here:
            task = await self._launch(
                lambda lst: self._on_workers(book, lst, reopen_cancelled=again)(run_id),
                StepListeners(),
            )
        else:
            late = LocalLate(None, asyncio.Event(), book.store)
            task = await self._launch(
                lambda lst: book.resume_latest(
                    run_id, lst, reopen_cancelled=again, named=late.named
                ),
                StepListeners(),
                late,
            )
        return await task.result(timeout=timeout)

    def _resumer(
        self, book: CheckpointedRuns, listeners: StepListeners
    ) -> Callable[[str], Awaitable[Any]] | None:
        """A run a signal ends the wait of goes on on the workers, as ``resume_latest``
        hands it back; here without a transport."""
        if self.transport is None:
            return None
        return self._on_workers(book, listeners, reopen_cancelled=False)

    def _on_workers(
        self, book: CheckpointedRuns, listeners: StepListeners, *, reopen_cancelled: bool
    ) -> Callable[[str | None], Coroutine[Any, Any, Any]]:
        """Hands a run back to this Clutch's workers and awaits its result (it has a
        transport)."""
        from nestegg.transport.handback import resume_on_workers

        transport = self.transport
        assert transport is not None

        def hand_back(run_id: str | None) -> Coroutine[Any, Any, Any]:
            return resume_on_workers(
                self, book, transport, run_id, listeners, reopen_cancelled=reopen_cancelled
            )

        return hand_back

    async def fork(
        self,
        checkpoint_id: str,
        data: Any = None,
        run_id: str | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Continue from ``checkpoint_id`` on a new run, leaving the original unchanged.

        Args:
            checkpoint_id: where to branch off (a checkpoint of this pipeline).
            data: the data to continue with instead of the checkpoint's (None: keep it).
            run_id: the new run's id (None: a new one).

        Returns:
            The new run's result. Its RunInfo names the parent run and checkpoint.

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            RunExistsError: ``run_id`` is taken.
            IncompatibleCheckpointError: the checkpoint continues with an agent this
                Clutch no longer has, or (IncompatibleDataError) ``data`` (None: the
                checkpoint's) does not fit the pydantic model of the agent it goes to;
                nothing is stored, as a resume refuses such data.

        Example:
            >>> await clutch.fork(checkpoints[-2].checkpoint_id, data={"draft": "v2"})
        """
        book = self._checkpointing()
        late = LocalLate(None, asyncio.Event(), book.store)
        task = await self._launch(
            lambda lst: book.fork(checkpoint_id, data, run_id, lst, late.named),
            StepListeners(),
            late,
        )
        return await task.result(timeout=timeout)


if TYPE_CHECKING:
    from nestegg.checkpoint.pipeline import Pipeline
    from nestegg.checkpoint.records import RunRecord
    from nestegg.checkpoint.runs import CheckpointedRuns

    def _fills_pipeline(clutch: Clutch) -> Pipeline:
        """mypy proves here that a Clutch is what checkpointing needs."""
        return clutch
