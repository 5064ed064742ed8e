"""RunStore: a checkpointed Clutch's store and what it reads and keeps there without running
anything: new run records (a queued run's for workers too), the listings, checkpoints and
events of its runs, cancels and cleanup. :class:`~nestegg.checkpoint.runs.CheckpointedRuns`,
which starts, resumes and forks runs, is built on it."""

from __future__ import annotations

import asyncio
from typing import Any

from nestegg.agents import to_plain
from nestegg.checkpoint.admission import check_pipeline, existing_run
from nestegg.checkpoint.cancels import Cancellation, cancel_run
from nestegg.checkpoint.codec import encode_value, seal
from nestegg.checkpoint.config import CheckpointConfig
from nestegg.checkpoint.event_log import read_events
from nestegg.checkpoint.loader import load_state
from nestegg.checkpoint.ownership import (
    current_owner,
    owner_alive,
    run_state,
)
from nestegg.checkpoint.pipeline import Pipeline
from nestegg.checkpoint.records import CheckpointRecord, RunRecord, new_run_id
from nestegg.checkpoint.stores import default_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.common import check_status, run_not_found
from nestegg.checkpoint.views import (
    CheckpointInfo,
    CheckpointState,
    Event,
    RunInfo,
)
from nestegg.checkpoint.waiting import (
    resumable_or_torn,
    wait_due,
)
from nestegg.constants import (
    COMPLETED,
    FINISHED,
    INTERRUPTED,
    QUEUED,
    RUNNING,
    SHOWN_RUNNING,
    WAITING,
)
from nestegg.errors import (
    CheckpointNotFoundError,
    ConfigurationError,
    RunExistsError,
    RunLockedError,
)
from nestegg.identifiers import check_name
from nestegg.options import is_count, shown

NOT_STORED = {
    INTERRUPTED: "list_interrupted() lists the interrupted runs",
    QUEUED: "a run queued for workers is stored running with no owner: list_runs('running') "
    "lists it, its owner None",
}
"""What lists the runs of a status listings show that is not stored (see
``ownership.run_state``), for the refusal of ``list_runs`` by it."""


class RunStore:
    """A checkpointed Clutch's store, and its runs as stored.

    Args:
        clutch: the pipeline (a Clutch, through the ``Pipeline`` Protocol).
        config: where and when to checkpoint.
    """

    def __init__(self, clutch: Pipeline, config: CheckpointConfig) -> None:
        self.clutch = clutch
        self.config = config
        self.store: CheckpointStorage = config.storage or default_store()
        self.owns_store = config.storage is None
        self.lease = config.lease.total_seconds()
        self._ready: asyncio.Future[None] | None = None

    async def ready(self) -> CheckpointStorage:
        """The store, set up once (a setup that failed is tried again by the next call)."""
        if self._ready is None or _failed(self._ready):
            self._ready = asyncio.ensure_future(self.store.setup())
        await asyncio.shield(self._ready)
        return self.store

    async def close(self) -> None:
        """Close the store if this service opened it."""
        if self.owns_store:
            await self.store.close()

    def _run_id(self, run_id: str | None) -> str | None:
        chosen = run_id if run_id is not None else self.config.run_id
        return check_name(chosen, "run id") if chosen is not None else None

    def resumed_id(self, run_id: str | None) -> str:
        """The run ``resume_latest`` resumes: ``run_id``, else the configured one.

        Raises:
            ConfigurationError: neither is given.
        """
        chosen = self._run_id(run_id)
        if chosen is None:
            raise ConfigurationError(
                "resume_latest() needs a run id: pass run_id= or configure "
                "CheckpointConfig(run_id=...)"
            )
        return chosen

    def new_id(self, run_id: str | None) -> str:
        """The id a new run takes: ``run_id``, else the configured one, else a fresh one
        (raises InvalidIdentifierError for an id no run can have)."""
        return self._run_id(run_id) or new_run_id()

    async def get_run_record(self, run_id: str) -> RunRecord:
        """The stored run ``run_id``.

        Raises:
            RunNotFoundError: no such run.
        """
        store = await self.ready()
        run = await store.get_run(run_id)
        if run is None:
            raise run_not_found(run_id)
        return run

    async def own_run_record(self, run_id: str, outcome: str) -> RunRecord:
        """The stored run ``run_id`` of this pipeline (``outcome``: what a refusal adds).

        Raises:
            RunNotFoundError: no such run.
            ConfigurationError: the run belongs to another pipeline.
        """
        run = await self.get_run_record(check_name(run_id, "run id"))
        check_pipeline(run, self.clutch.name, outcome)
        return run

    async def get_checkpoint_record(self, checkpoint_id: str) -> CheckpointRecord:
        """The stored checkpoint ``checkpoint_id``.

        Raises:
            InvalidIdentifierError: an id no checkpoint can have (before the store is
                touched).
            CheckpointNotFoundError: no such checkpoint.
        """
        checkpoint_id = check_name(checkpoint_id, "checkpoint id")
        store = await self.ready()
        record = await store.get_checkpoint(checkpoint_id)
        if record is None:
            raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r} in the store")
        return record

    # ---------------------------------------------------------------- new runs

    def _new_record(self, run_id: str, sealed_input: bytes, *, owned: bool) -> RunRecord:
        """A new running run of ``sealed_input``: owned by this process, or by no one
        (workers)."""
        now = self.config.clock()
        return RunRecord(
            run_id=run_id,
            pipeline=self.clutch.name,
            status=RUNNING,
            input=sealed_input,
            created_at=now,
            updated_at=now,
            fence=1,
            owner=current_owner() if owned else None,
            lease_until=now + self.lease if owned else None,
        )

    def _existing(self, run: RunRecord, sealed_input: bytes, *, on_workers: bool = False) -> Any:
        """What run() does with an id that exists (see admission.existing_run)."""
        now = self.config.clock()
        return existing_run(run, sealed_input, self.clutch.name, now, on_workers=on_workers)

    # ---------------------------------------------- distributed mode (workers)

    async def queued_record(self, input_data: Any, run_id: str | None) -> RunRecord:
        """The record of a new run that workers execute (status running, no owner, no
        lease), not stored yet: the caller stores it (:meth:`store_queued`) once the run's
        ``on_request`` hook passed, so that no worker or sweep takes it before.

        A completed run of that id and this input is returned as stored (its result
        stands).

        Raises:
            RunExistsError: the id belongs to an unfinished run, to a run completed
                with a different input, or to another pipeline's run.
            RunLockedError: a live process executes a run of that id.
        """
        chosen = self._run_id(run_id)
        run_id = chosen or new_run_id()
        store = await self.ready()
        self.clutch.validate()
        sealed_input = seal(encode_value(to_plain(input_data), "input"))
        # an id just made names no stored run: only a chosen one is looked up
        existing = await store.get_run(run_id) if chosen is not None else None
        if existing is not None:
            # raises unless completed with this input
            self._existing(existing, sealed_input, on_workers=True)
            return existing
        return self._new_record(run_id, sealed_input, owned=False)

    async def store_queued(self, record: RunRecord) -> RunRecord:
        """Store ``record`` (:meth:`queued_record`); a run of its id stored since is
        returned as stored if it completed with the same input.

        Raises:
            RunExistsError, RunLockedError: as :meth:`queued_record`, for a run of its id
                stored since.
        """
        store = await self.ready()
        try:
            await store.create_run(record)
        except RunExistsError:
            existing = await store.get_run(record.run_id)
            if existing is None:
                raise
            # raises unless completed with this input
            self._existing(existing, record.input, on_workers=True)
            return existing
        return record

    async def create_queued(self, input_data: Any, run_id: str | None) -> RunRecord:
        """Store a new run that workers execute: status running, no owner, no lease
        (:meth:`queued_record`, then :meth:`store_queued`)."""
        record = await self.queued_record(input_data, run_id)
        if record.status == COMPLETED:
            return record
        return await self.store_queued(record)

    # ---------------------------------------------------------------- recovery

    async def list_interrupted(self) -> list[RunInfo]:
        """Running runs of this pipeline whose owner is gone, and waiting runs whose
        deadline (or timer) has passed; not the runs queued for workers (no owner ever)."""
        store = await self.ready()
        now = self.config.clock()
        runs = await store.list_runs(pipeline=self.clutch.name, statuses=[RUNNING, WAITING])
        return [
            RunInfo.from_record(r)
            for r in runs
            if run_state(r, now) == INTERRUPTED or wait_due(r, now)
        ]

    async def list_resumable(self) -> list[RunInfo]:
        """What :meth:`recover` resumes: the interrupted runs, and the waiting runs whose
        deadline passed or whose signal is stored; also the waiting runs whose event log
        is torn (what they wait for is unknown), which the resume refuses, saying so."""
        store = await self.ready()
        now = self.config.clock()
        runs = await store.list_runs(pipeline=self.clutch.name, statuses=[RUNNING, WAITING])
        return [
            RunInfo.from_record(r)
            for r in runs
            if run_state(r, now) == INTERRUPTED or await resumable_or_torn(store, r, now)
        ]

    # ----------------------------------------------------------------- reading

    async def list_runs(self, status: str | None = None) -> list[RunInfo]:
        """This pipeline's runs, newest first (ConfigurationError for an unknown status)."""
        if status in SHOWN_RUNNING:  # a tuple: a status no dict key can be is refused below
            raise ConfigurationError(f"{status!r} is not a stored status: {NOT_STORED[status]}")
        if status is not None:
            check_status(status)
        store = await self.ready()
        runs = await store.list_runs(
            pipeline=self.clutch.name, statuses=[status] if status else None
        )
        return [RunInfo.from_record(r) for r in runs]

    async def list_checkpoints(self, run_id: str) -> list[CheckpointInfo]:
        """A run's checkpoints, oldest first (RunNotFoundError for no such run)."""
        run_id = (await self.own_run_record(run_id, ": its checkpoints are not listed")).run_id
        store = await self.ready()
        return [CheckpointInfo.from_record(c) for c in await store.list_checkpoints(run_id)]

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointState:
        """The state a checkpoint restores."""
        record = await self.get_checkpoint_record(checkpoint_id)
        run = await self.own_run_record(
            record.run_id, f": checkpoint {record.checkpoint_id!r} is not this pipeline's"
        )
        return await load_state(self.store, run, record)

    async def events(self, run_id: str, since_seq: int = 0) -> list[Event]:
        """A run's events after ``since_seq`` (RunNotFoundError for no such run;
        ConfigurationError for a ``since_seq`` that is not an int >= 0)."""
        if not is_count(since_seq, least=0):  # "2" or 1.5 would fail inside the store
            raise ConfigurationError(
                f"events() takes since_seq= an int >= 0, got {shown(since_seq)}"
            )
        run_id = (await self.own_run_record(run_id, ": its events are not this pipeline's")).run_id
        store = await self.ready()
        return await read_events(store, run_id, since_seq)

    async def cancel(self, run_id: str) -> Cancellation:
        """Cancel a run of this pipeline from outside (see :func:`cancel_run`)."""
        store = await self.ready()
        return await cancel_run(
            store,
            check_name(run_id, "run id"),
            self.config.clock(),
            lease_seconds=self.lease,
            pipeline=self.clutch.name,
        )

    # ----------------------------------------------------------------- cleanup

    async def delete_run(self, run_id: str) -> bool:
        """Delete a run of this pipeline and everything of it; False if there was none.

        Raises:
            ConfigurationError: the run belongs to another pipeline (nothing is deleted).
            RunLockedError: a live process executes the run (nothing is deleted).
        """
        store = await self.ready()
        run = await store.get_run(check_name(run_id, "run id"))
        if run is not None:
            check_pipeline(run, self.clutch.name, ": it was not deleted")
        if run is not None and owner_alive(run, self.config.clock()):
            raise RunLockedError(f"run {run_id!r} is executing; it cannot be deleted", run_id)
        return await store.delete_run(run_id)

    async def cleanup(self) -> dict[str, int]:
        """Apply keep_latest and ttl to this pipeline's runs now."""
        store = await self.ready()
        policy = self.config.policy
        expired: list[str] = []
        if policy.ttl is not None:
            cutoff = self.config.clock() - policy.ttl.total_seconds()
            expired = await store.expire_runs(FINISHED, cutoff, self.clutch.name)
        pruned = 0
        if policy.keep_latest is not None:
            for run in await store.list_runs(pipeline=self.clutch.name):
                checkpoints = await store.list_checkpoints(run.run_id)
                surplus = checkpoints[: max(0, len(checkpoints) - policy.keep_latest)]
                if surplus:
                    pruned += await store.delete_checkpoints(
                        run.run_id, [c.checkpoint_id for c in surplus]
                    )
        return {"runs_expired": len(expired), "checkpoints_pruned": pruned}


def _failed(future: asyncio.Future[None]) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)


__all__ = ["RunStore"]
