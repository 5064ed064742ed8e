"""Statuses, step outcomes, checkpoint reasons and event kinds are StrEnums whose values are
the strings stored before they were enums: stored data reads the same."""

from __future__ import annotations

import orjson

from nestegg.constants import (
    FINISHED,
    RUNNING,
    STATUSES,
    CheckpointReason,
    EventKind,
    RunStatus,
    StepOutcome,
)

STORED = {
    RunStatus: ["running", "completed", "failed", "cancelled", "waiting"],
    StepOutcome: ["completed", "terminated", "handover"],
    CheckpointReason: ["policy", "manual", "agent", "final", "fork"],
    EventKind: [
        "run_started",
        "run_interrupted",
        "run_resumed",
        "run_forked",
        "run_completed",
        "run_failed",
        "run_cancelled",
        "run_waiting",
        "signal_received",
        "step_started",
        "step_completed",
        "step_failed",
        "checkpoint_saved",
        "checkpoint_pruned",
    ],
}


def test_values_are_the_stored_strings() -> None:
    for enum, values in STORED.items():
        assert [member.value for member in enum] == values
        for member, value in zip(enum, values, strict=True):
            assert member == value and hash(member) == hash(value)
            assert (str(member), f"{member}", repr(member)) == (value, value, repr(value))
            assert orjson.dumps({"v": [member]}) == orjson.dumps({"v": [value]})


def test_the_short_names_are_the_members() -> None:
    assert RUNNING is RunStatus.RUNNING
    assert STATUSES == tuple(RunStatus)
    assert repr(FINISHED) == "('completed', 'failed', 'cancelled')"
