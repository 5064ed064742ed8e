"""The stored-run methods of a Clutch that read and keep its runs: history, listings,
events, recover, signal, cancel, delete and cleanup (``nestegg.clutch.Clutch`` has them
from here; the methods that start or continue runs, and the distributed mode, are its
own)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nestegg.options import check_flag
from nestegg.pipeline import PipelineBase
from nestegg.task import StepListeners

if TYPE_CHECKING:
    from nestegg.checkpoint.runs import CheckpointedRuns
    from nestegg.checkpoint.views import (
        CheckpointInfo,
        CheckpointState,
        Event,
        RunHistory,
        RunInfo,
    )


class StoredRuns(PipelineBase):
    """A pipeline's stored runs, read and kept (the base of :class:`~nestegg.Clutch`)."""

    async def history(self, run_id: str) -> RunHistory:
        """A run's steps and checkpoints with their parents, and the runs forked from it.

        Raises:
            RunNotFoundError: no such run.
            ConfigurationError: the run belongs to another pipeline.
        """
        return await self._checkpointing().history(run_id)

    async def list_runs(self, status: str | None = None) -> list[RunInfo]:
        """This pipeline's stored runs, newest first (optionally of one status).

        Raises:
            ConfigurationError: ``status`` is not a stored status (running, completed,
                failed, cancelled, waiting), naming them; ``interrupted`` is not stored:
                :meth:`list_interrupted` lists those runs; nor is ``queued``: such a run
                is stored running with no owner (``list_runs("running")``, ``owner`` None).
        """
        return await self._checkpointing().list_runs(status)

    async def list_checkpoints(self, run_id: str) -> list[CheckpointInfo]:
        """A run's checkpoints, oldest first.

        Raises:
            RunNotFoundError: no such run.
            ConfigurationError: the run belongs to another pipeline.
        """
        return await self._checkpointing().list_checkpoints(run_id)

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointState:
        """The state a checkpoint restores (data, history, metadata, turn, next agent).

        Raises:
            CheckpointNotFoundError: no such checkpoint.
            ConfigurationError: the checkpoint's run belongs to another pipeline.
        """
        return await self._checkpointing().get_checkpoint(checkpoint_id)

    async def events(self, run_id: str, since_seq: int = 0) -> list[Event]:
        """A run's event log after ``since_seq``.

        Raises:
            RunNotFoundError: no such run.
            ConfigurationError: the run belongs to another pipeline, or ``since_seq`` is
                not an int >= 0.
        """
        return await self._checkpointing().events(run_id, since_seq)

    async def list_interrupted(self) -> list[RunInfo]:
        """Runs of this pipeline left running by an owner that is gone, and waiting runs
        whose deadline or timer has passed (never one that still waits, nor a run queued
        for workers that none took yet: a worker's sweep publishes it)."""
        return await self._checkpointing().list_interrupted()

    async def list_resumable(self) -> list[RunInfo]:
        """The runs :meth:`recover` resumes: those of :meth:`list_interrupted`, and the
        waiting runs whose signal is stored (sent with ``resume=False``)."""
        return await self._checkpointing().list_resumable()

    async def recover(self) -> dict[str, Any]:
        """Resume every interrupted run of this pipeline concurrently, and every waiting
        run whose deadline or timer has passed or whose signal is stored, in this process.

        A run a caller stored for workers that none took yet (shown ``queued``) is not
        interrupted: it is left to the workers, whose sweeps publish it;
        ``resume_latest(run_id, here=True)`` runs it here on purpose (without ``here``, a
        Clutch with a transport hands it to its workers).

        Returns:
            run id -> result, or the exception a resumed run raised (an
            IncompatibleCheckpointError for a run refused as the pipeline changed, an
            EventLogDamagedError for a waiting run whose event log is torn: nothing of
            them stored changed). Runs another worker took first are left out.
        """
        return await self._checkpointing().recover()

    async def signal(
        self,
        run_id: str,
        name: str,
        value: Any = None,
        *,
        replace: bool = False,
        resume: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """Send the signal ``name`` with ``value`` to a run (from any process).

        The signal is stored durably, once per run and name. If the run waits for it
        (:func:`nestegg.wait_for`), it is resumed here (with a transport: handed back to
        the workers, as :meth:`resume_latest` does, and its result awaited): its waiting
        step runs again from its start, with its journaled calls replayed, and gets
        ``value``. A signal sent before the run waits for it is kept until it does.

        Args:
            run_id: the run.
            name: the signal's name.
            value: its value (stored like step data: JSON, a pydantic model's dict).
            replace: store ``value`` even if a signal of that name was sent already (a
                step that received the earlier value keeps it); it keeps the time the
                first came, so a wait that signal reached by its deadline stays met.
            resume: resume the run (here, or on the workers) when it waits for this
                signal (or, what it waits for unreadable, its event log torn or its
                ``run_waiting`` event damaged, when its deadline has passed: its wait is
                over whatever it was); False
                only stores it, for ``recover()`` or a worker's sweeper to pick up. A
                signal the run does not wait for now, one that comes after its wait's
                deadline, or one whose name could not be checked (what the run waits for
                cannot be read) is stored with a warning on the ``nestegg`` logger saying
                so.
            timeout: seconds to wait for the resumed run (None: no limit).

        Returns:
            The run's result when it was resumed here and completed; None otherwise.

        Raises:
            RunWaiting: the resumed run waits again (for another signal or a timer).
            SignalExistsError: a signal of that name was sent to the run already.
            SignalRefusedError: the run completed (nothing is stored).
            ConfigurationError: the run is another pipeline's, or ``replace`` or
                ``resume`` is not a bool (nothing is stored).
            RunNotFoundError: no such run.
            CheckpointSerializationError: a value that cannot be stored.
            EventLogDamagedError: with ``resume``, the run waits, its deadline has not
                passed and its event log is torn (what it waits for is unknown): nothing is
                stored. Past its deadline such a run is resumed, its wait over.

        Example:
            >>> result = await clutch.signal(run_id, "approval", {"approved": True})
        """
        check_flag(replace, "replace", "signal()")
        check_flag(resume, "resume", "signal()")
        book = self._checkpointing()
        task = await self._launch(
            lambda lst: book.signal(
                run_id,
                name,
                value,
                replace=replace,
                resume=resume,
                resume_with=self._resumer(book, lst),
            ),
            StepListeners(),
        )
        return await task.result(timeout=timeout)

    def _resumer(
        self, book: CheckpointedRuns, listeners: StepListeners
    ) -> Callable[[str], Awaitable[Any]] | None:
        """How a run that waited goes on once a signal ends its wait: None, in this
        process (a Clutch with a transport hands it back to its workers)."""
        return None

    async def cancel(self, run_id: str) -> bool:
        """Cancel a run of this pipeline from any process: stored cancelled, with a
        ``run_cancelled`` event naming this process, it is left alone by sweeps,
        ``recover()`` and timers until ``resume_latest`` continues it on purpose.

        A running run is claimed from its owner, if alive (a local process, a worker):
        its next commit fails with StaleOwnerError saying that the run was cancelled, and
        it stops (with ``durability="exit"``, at the next step boundary after its lease
        renewal, every third of the lease, found the run taken); the step under way
        finishes its current call first (a journaled call in flight is paid, its result
        not recorded). A waiting, queued or interrupted run is
        cancelled at once.

        Returns:
            True when cancelled now; False when it was cancelled already.

        Raises:
            RunNotFoundError: no such run.
            RunFinishedError: the run completed or failed (nothing changes).
            ConfigurationError: the run belongs to another pipeline.

        Example:
            >>> await clutch.cancel("run-0193")
        """
        return (await self._checkpointing().cancel(run_id)).done

    async def delete_run(self, run_id: str) -> bool:
        """Delete a run of this pipeline and everything stored of it; False if there was
        none.

        Raises:
            ConfigurationError: the run belongs to another pipeline (nothing is deleted).
            RunLockedError: a live process executes the run (nothing is deleted).
        """
        return await self._checkpointing().delete_run(run_id)

    async def cleanup(self) -> dict[str, int]:
        """Apply the policy's keep_latest and ttl now; counts of what went."""
        return await self._checkpointing().cleanup()


__all__ = ["StoredRuns"]
