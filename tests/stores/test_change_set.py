"""A commit's meaning is worked out once, above the stores: the change set they apply."""

from __future__ import annotations

from nestegg.checkpoint.records import Commit
from nestegg.checkpoint.stores.common import RUN_FIELDS, change_set


def test_only_the_run_fields_a_commit_carries_are_set() -> None:
    assert change_set(Commit("r", 1)).run_fields == {}
    changes = change_set(Commit("r", 1, status="completed", result=b"x", step_seq=0))
    assert changes.run_fields == {"status": "completed", "result": b"x", "step_seq": 0}


def test_updated_at_zero_means_unset_and_any_other_time_is_set() -> None:
    assert "updated_at" not in change_set(Commit("r", 1, updated_at=0.0)).run_fields
    assert change_set(Commit("r", 1, updated_at=12.5)).run_fields == {"updated_at": 12.5}


def test_every_run_field_set_at_once_in_one_order() -> None:
    commit = Commit("r", 1, status="failed", result=b"r", error=b"e", lease_until=3.0)
    commit.step_seq, commit.event_seq, commit.updated_at = 4, 5, 6.0
    changes = change_set(commit)
    assert list(changes.run_fields) == [*RUN_FIELDS, "updated_at"]
    assert list(changes.run_fields.values()) == ["failed", b"r", b"e", 3.0, 4, 5, 6.0]


def test_a_truncation_keeps_the_journal_through_the_step_it_names() -> None:
    plain = change_set(Commit("r", 1))
    assert (plain.truncate_after, plain.journal_after) == (None, None)
    cut = change_set(Commit("r", 1, truncate_after=4))
    assert (cut.truncate_after, cut.journal_after) == (4, 4)
    kept = change_set(Commit("r", 1, truncate_after=4, journal_after=6))
    assert (kept.truncate_after, kept.journal_after) == (4, 6)


def test_the_records_and_the_fence_pass_through_unchanged() -> None:
    commit = Commit("r", 7, prune=["c-1"])
    changes = change_set(commit)
    assert (changes.run_id, changes.fence, list(changes.prune)) == ("r", 7, ["c-1"])
    assert changes.steps is commit.steps and changes.checkpoints is commit.checkpoints
