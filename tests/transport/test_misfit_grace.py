"""When the misfit grace of a step set aside for a model starts: at its first set-aside,
not when the step became due (a step that waited in the broker longer than the grace, a
backlog or every worker down during a deploy, still gets it)."""

from __future__ import annotations

from types import SimpleNamespace

from nestegg.checkpoint.records import RunRecord
from nestegg.errors import IncompatibleDataError
from nestegg.transport.lacking import LackingAgents, due_since, set_aside_since
from nestegg.transport.verdicts import Claim

NOW = 1_700_000_000.0
GRACE = 300.0
ERROR = IncompatibleDataError("r", 1, "second", "Page", "pages: Field required")


def _run(*, updated_at: float, lease_until: float, fence: int = 3) -> RunRecord:
    return RunRecord(
        "r", "p", "running", b"", NOW - 900, updated_at,
        fence=fence, lease_until=lease_until, step_seq=1, event_seq=5,
    )  # fmt: skip


def _lacking() -> LackingAgents:
    book = SimpleNamespace(config=SimpleNamespace(clock=lambda: NOW))
    return LackingAgents(None, book, misfit_grace=GRACE)  # type: ignore[arg-type]


def test_a_step_that_waited_in_the_broker_past_the_grace_is_set_aside_first() -> None:
    # released 400 s ago after its step 1 (a plain release: lease_until == updated_at)
    read = _run(updated_at=NOW - 400, lease_until=NOW - 400)
    claim = Claim(_run(updated_at=NOW, lease_until=NOW + 30, fence=4), read, None)
    assert due_since(claim, NOW) == NOW
    assert _lacking().misfit(claim, ERROR) is None  # it failed the run on sight


def test_a_step_set_aside_for_the_grace_fails_its_run() -> None:
    read = _run(updated_at=NOW - 10, lease_until=NOW - GRACE - 1)  # the set-aside's mark
    assert set_aside_since(read) == NOW - GRACE - 1
    claim = Claim(_run(updated_at=NOW, lease_until=NOW + 30, fence=4), read, None)
    failed = _lacking().misfit(claim, ERROR)
    assert isinstance(failed, IncompatibleDataError)
    assert "within 300 s" in str(failed)


def test_a_step_set_aside_for_less_than_the_grace_stays_set_aside() -> None:
    read = _run(updated_at=NOW - 10, lease_until=NOW - GRACE + 5)
    claim = Claim(_run(updated_at=NOW, lease_until=NOW + 30, fence=4), read, None)
    assert _lacking().misfit(claim, ERROR) is None
