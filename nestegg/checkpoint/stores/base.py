"""The store contract: one async Protocol that every checkpoint store fills.

A store keeps records; it does not interpret them. Ownership is a compare-and-set on
the run's fencing token (``claim_run``), and every change to a run is one atomic,
fenced :class:`~nestegg.checkpoint.records.Commit`. The contract suite in
:mod:`nestegg.testing` runs unchanged against every store.

Optional capabilities are small Protocols of their own, checked with ``isinstance``:
:class:`DroppableStore` (``drop()``), :class:`BlockHistoryStore` (``load_history()``,
for a store that packs step records in blocks; :func:`load_history` reads either kind) and
:class:`StepAdmission` (``step_admission()``, for a store that holds steps back while its
commits pile up), :class:`CheckpointListing` (``list_checkpoints_of()``: the checkpoints
of many runs in one read; :func:`checkpoints_of` reads them from either kind) and
:class:`ForkListing` (``list_forks()``: the runs forked from a run, found by an index;
:func:`forks_of` finds them in either kind).
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Protocol, Self, runtime_checkable

from nestegg.checkpoint.records import (
    CheckpointRecord,
    Commit,
    EventRecord,
    JournalRecord,
    Owner,
    RunRecord,
    SignalRecord,
    StepBlock,
    StepRecord,
)
from nestegg.constants import CHECKPOINT_LISTING_BATCH, FORK_SCAN_PAGE


@runtime_checkable
class CheckpointStorage(Protocol):
    """Where runs, steps, checkpoints, events, journal entries and signals live.

    Missing runs: writers (``claim_run``, ``commit``) raise ``RunNotFoundError``;
    readers return None or an empty list. A lost compare-and-set raises
    ``RunLockedError`` (claim; ``RunFinishedError`` for a finished run) or
    ``StaleOwnerError`` (commit); an unreachable server raises
    ``StorageUnavailableError``; any other failure of the store ``StorageError``.
    Lists come oldest first (by sequence number), except ``list_runs`` (newest first).
    Records are stored and returned byte for byte: a store never decodes a body.
    """

    @classmethod
    def from_url(cls, url: str) -> Self:
        """A store for ``url`` (the scheme its registry entry names); opens nothing yet."""

    async def setup(self) -> None:
        """Create what the store needs (idempotent); called before first use."""

    async def close(self) -> None:
        """Release connections and threads the store opened itself."""

    async def create_run(self, run: RunRecord) -> None:
        """Insert a new run; RunExistsError if the id is taken."""

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None."""

    async def list_runs(
        self,
        *,
        pipeline: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int | None = None,
        before: tuple[float, str] | None = None,
    ) -> list[RunRecord]:
        """Runs, newest first (by ``created_at``, then ``run_id``), filtered by pipeline and
        status; with ``before=(created_at, run_id)`` only the runs after that one in this
        order (the next page: pass the last run of the previous one)."""

    async def claim_run(
        self,
        run_id: str,
        expected_fence: int,
        owner: Owner,
        lease_until: float,
        now: float,
        *,
        reopen: bool = False,
    ) -> RunRecord:
        """Make ``owner`` the owner if the fence is still ``expected_fence``.

        Sets status running, the owner, the lease, ``updated_at = now`` and fence + 1,
        and returns the run as stored. A finished run (completed, failed, cancelled) is
        claimed only with ``reopen`` (a resume of it on purpose). Raises RunLockedError
        if the fence moved on, its RunFinishedError if the run is finished and ``reopen``
        is false (nothing changes), RunNotFoundError if there is no run.
        """

    async def commit(self, commit: Commit) -> None:
        """Apply one fenced change to a run atomically: all of it or nothing.

        The order is the one :class:`~nestegg.checkpoint.records.Commit` gives; with
        ``truncate_after`` set, the step records, checkpoints and journal entries of the
        steps past it go first (events stay). A step, journal entry or checkpoint whose
        key exists (step seq, journal position, checkpoint id) is replaced; events are
        never rewritten, and what a duplicate event seq does is not defined. Raises
        StaleOwnerError if the run's fence is not ``commit.fence``, and, before writing
        anything, RecordTooLargeError if its records add up past COMMIT_MAX_BYTES
        (:func:`~nestegg.checkpoint.stores.common.check_size`).
        """

    async def load_steps(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> list[StepRecord]:
        """Step records with ``after < seq <= upto``, in order.

        A store that keeps blocks of step records raises CheckpointCorruptedError when the
        head of a block it has to open is damaged (a damaged record comes back as stored).
        """

    async def list_checkpoints(self, run_id: str) -> list[CheckpointRecord]:
        """The run's checkpoints, oldest first."""

    async def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord | None:
        """One checkpoint, or None (also for an id no checkpoint can have, like ``../x``)."""

    async def read_events(
        self, run_id: str, since_seq: int = 0, limit: int | None = None
    ) -> list[EventRecord]:
        """Events with ``seq > since_seq``, in order."""

    async def read_journal(self, run_id: str, step: int) -> list[JournalRecord]:
        """Journal entries of one step, by position."""

    async def put_signal(self, signal: SignalRecord, replace: bool = False) -> bool:
        """Store a signal of a run, at most one per name: True when stored; False when a
        signal of that name is stored already and ``replace`` is false (nothing changes).
        Not fenced: any process may signal a run. RunNotFoundError if there is no run."""

    async def read_signals(self, run_id: str) -> list[SignalRecord]:
        """The run's signals, by name."""

    async def delete_run(self, run_id: str) -> bool:
        """Delete the run and everything of it; False if there was none."""

    async def delete_checkpoints(self, run_id: str, checkpoint_ids: Sequence[str]) -> int:
        """Delete those checkpoints of the run (no fence: maintenance); how many went."""

    async def expire_runs(
        self, statuses: Sequence[str], updated_before: float, pipeline: str | None = None
    ) -> list[str]:
        """Delete whole runs in ``statuses`` updated strictly before ``updated_before``
        (optionally of one pipeline), with everything of them; their ids."""


@runtime_checkable
class DroppableStore(Protocol):
    """A store that can delete everything it keeps, its schema included (tests, removal)."""

    async def drop(self) -> None:
        """Delete this store's tables or keys with everything stored in them."""


@runtime_checkable
class BlockHistoryStore(Protocol):
    """A store that keeps step records packed in blocks, and gives them as it keeps them."""

    async def load_history(
        self, run_id: str, after: int = 0, upto: int | None = None
    ) -> Sequence[StepRecord | StepBlock]:
        """The step records with ``after < seq <= upto``, in order, as the store keeps them:
        one by one, or packed in :class:`~nestegg.checkpoint.records.StepBlock` s (what a
        resume reads; a block is given whole only when all its steps are in the range, and
        :func:`~nestegg.checkpoint.step_blocks.step_records` gives the records).
        """


@runtime_checkable
class StepAdmission(Protocol):
    """A store that holds the next steps of its runs back while its commits pile up (see
    :mod:`nestegg.checkpoint.stores.step_gate`)."""

    def step_admission(self) -> Awaitable[None] | None:
        """None when a run may start its next step now; else what it awaits first."""


@runtime_checkable
class CheckpointListing(Protocol):
    """A store that lists the checkpoints of many runs in one read (`nestegg runs` and
    `nestegg prune` read those of every run they list)."""

    async def list_checkpoints_of(
        self, run_ids: Sequence[str]
    ) -> dict[str, list[CheckpointRecord]]:
        """Each run's checkpoints, oldest first, as ``list_checkpoints`` gives them; a run
        with none, or not stored, is left out."""


@runtime_checkable
class ForkListing(Protocol):
    """A store that finds the runs forked from a run by an index of their parent, not by
    reading the runs of its pipeline (`nestegg show` and the web inspector's run page list
    them)."""

    async def list_forks(self, run_id: str, limit: int | None = None) -> list[RunRecord]:
        """The runs whose ``parent_run`` is ``run_id``, whatever their pipeline and whether
        or not that run is still stored, newest first (by ``created_at``, then ``run_id``,
        as ``list_runs``); the newest ``limit`` of them (None: all)."""


async def forks_of(
    store: CheckpointStorage,
    run_id: str,
    *,
    pipeline: str,
    created_at: float,
    scan: int | None = None,
) -> tuple[list[RunRecord], bool]:
    """The runs forked from run ``run_id`` (of ``pipeline``, created at ``created_at``),
    newest first, and whether that is all of them: from a :class:`ForkListing`, the newest
    ``scan`` (None: all), false when there are more; else those among the runs of the
    pipeline newer than it, read :data:`~nestegg.constants.FORK_SCAN_PAGE` at a time, at
    most ``scan`` of them (None: all), false when runs were left unread. Either way at most
    ``scan`` runs are read (a page of the web inspector, ``show``: a run forked a million
    times reads a bounded few)."""
    if isinstance(store, ForkListing):
        found = await store.list_forks(run_id, None if scan is None else scan + 1)
        if scan is not None and len(found) > scan:
            return found[:scan], False
        return found, True
    forks: list[RunRecord] = []
    before: tuple[float, str] | None = None
    left = scan
    while left is None or left > 0:
        size = FORK_SCAN_PAGE if left is None else min(FORK_SCAN_PAGE, left)
        page = await store.list_runs(pipeline=pipeline, limit=size, before=before)
        for other in page:
            if other.created_at < created_at:  # a fork is newer than its parent
                return forks, True
            if other.parent_run == run_id:
                forks.append(other)
        if len(page) < size:
            return forks, True
        before = (page[-1].created_at, page[-1].run_id)
        left = None if left is None else left - len(page)
    return forks, False


async def checkpoints_of(
    store: CheckpointStorage, run_ids: Sequence[str]
) -> list[list[CheckpointRecord]]:
    """The checkpoints of each run in ``run_ids``, in its order, oldest first: read
    :data:`~nestegg.constants.CHECKPOINT_LISTING_BATCH` runs at a time by a
    :class:`CheckpointListing`, else run by run (``list_checkpoints``)."""
    if not isinstance(store, CheckpointListing):
        return [await store.list_checkpoints(run_id) for run_id in run_ids]
    listed: list[list[CheckpointRecord]] = []
    for start in range(0, len(run_ids), CHECKPOINT_LISTING_BATCH):
        batch = run_ids[start : start + CHECKPOINT_LISTING_BATCH]
        found = await store.list_checkpoints_of(batch)
        listed.extend(found.get(run_id, []) for run_id in batch)
    return listed


async def load_history(
    store: CheckpointStorage, run_id: str, after: int = 0, upto: int | None = None
) -> Sequence[StepRecord | StepBlock]:
    """The run's step records with ``after < seq <= upto`` as ``store`` keeps them: packed
    in blocks by a :class:`BlockHistoryStore`, else one by one (``load_steps``)."""
    if isinstance(store, BlockHistoryStore):
        return await store.load_history(run_id, after, upto)
    return await store.load_steps(run_id, after, upto)
