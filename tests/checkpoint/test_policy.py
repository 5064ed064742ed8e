"""The checkpoint policy: when checkpoints are taken, how many are kept, when runs expire."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from nestegg import Strategy, get_context
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import ConfigurationError
from nestegg.testing import FakeClock

from .conftest import Flaky, Pipeline, replace_agent, wait_for

SEVEN = ("a", "b", "c", "d", "e", "f", "g")


async def seqs_and_reasons(pipeline: Pipeline, run_id: str) -> list[tuple[int, str]]:
    return [(c.seq, c.reason) for c in await pipeline.clutch.list_checkpoints(run_id)]


# -------------------------------------------------------------------------- when


async def test_every_n_steps_checkpoints_every_nth_step_and_the_end(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, SEVEN, every_n_steps=3, keep_latest=None)
    assert await pipeline.clutch.run([], run_id="seven") == list(SEVEN)
    assert await seqs_and_reasons(pipeline, "seven") == [
        (3, "policy"),
        (6, "policy"),
        (7, "final"),
    ]

    six = Pipeline(checkpoint_store, SEVEN[:6], every_n_steps=3, keep_latest=None)
    await six.clutch.run([], run_id="six")
    assert await seqs_and_reasons(six, "six") == [(3, "policy"), (6, "policy")]


async def test_every_n_steps_counts_again_after_a_resume(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, SEVEN, every_n_steps=3, keep_latest=None)
    pipeline.fail.add("e")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="counted")
    # The failure leaves a checkpoint of the last good step (4).
    assert await seqs_and_reasons(pipeline, "counted") == [(3, "policy"), (4, "final")]

    pipeline.fail.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("counted") == list(SEVEN)
    assert pipeline.calls == ["e", "f", "g"]
    assert await seqs_and_reasons(pipeline, "counted") == [
        (3, "policy"),
        (4, "final"),
        (7, "policy"),
    ]


async def test_on_agent_complete_forces_a_checkpoint_after_the_named_agents(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(
        checkpoint_store,
        ("a", "b", "c"),
        strategy=Strategy.ROUND_ROBIN,
        max_turns=8,
        every_n_steps=100,
        on_agent_complete=["b"],
        keep_latest=None,
    )
    await pipeline.clutch.run([], run_id="forced")
    assert await seqs_and_reasons(pipeline, "forced") == [
        (2, "policy"),
        (5, "policy"),
        (8, "policy"),
    ]

    both = Pipeline(
        checkpoint_store,
        SEVEN,
        every_n_steps=3,
        on_agent_complete=("a", "e"),
        keep_latest=None,
    )
    await both.clutch.run([], run_id="both")
    # N counts the steps since the last checkpoint, forced ones included.
    assert [seq for seq, _ in await seqs_and_reasons(both, "both")] == [1, 4, 5, 7]


async def test_on_agent_complete_naming_no_agent_is_refused_before_anything_is_stored(
    checkpoint_store: CheckpointStorage,
) -> None:
    # it was taken silently: no checkpoint was ever forced, as a misspelled name says none
    pipeline = Pipeline(checkpoint_store, ("a", "b"), on_agent_complete=["b", "nosuch"])
    for start in (pipeline.clutch.run, pipeline.clutch.submit):
        with pytest.raises(ConfigurationError) as refused:
            await start([], run_id="named")
        assert str(refused.value) == (
            "CheckpointPolicy.on_agent_complete names agent 'nosuch', which is not "
            "registered on Clutch 'pipeline' (known: ['a', 'b'])"
        )
    assert pipeline.calls == []
    assert await checkpoint_store.list_runs() == []


# -------------------------------------------------------------------------- keep


async def test_keep_latest_keeps_exactly_the_newest_checkpoints(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(checkpoint_store, SEVEN, keep_latest=2)
    seen: list[list[int]] = []

    async def g(data: list[str]) -> list[str]:
        seen.append([c.seq for c in await pipeline.clutch.list_checkpoints("kept")])
        return [*data, "g"]

    replace_agent(pipeline.clutch, g)
    await pipeline.clutch.run([], run_id="kept")

    assert seen == [[5, 6]]
    kept = await pipeline.clutch.list_checkpoints("kept")
    assert [c.seq for c in kept] == [6, 7]
    pruned = [e for e in await pipeline.clutch.events("kept") if e.kind == "checkpoint_pruned"]
    assert sum(len(e.data["checkpoint_ids"]) for e in pruned) == 5


async def test_pruning_never_breaks_resuming_from_the_kept_checkpoints(
    checkpoint_store: CheckpointStorage,
) -> None:
    names = SEVEN
    pipeline = Pipeline(checkpoint_store, names, keep_latest=2)
    pipeline.fail.add("f")
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["in"], run_id="pruned")
    kept = await pipeline.clutch.list_checkpoints("pruned")
    assert [c.seq for c in kept] == [4, 5]

    for checkpoint in kept:
        state = await pipeline.clutch.get_checkpoint(checkpoint.checkpoint_id)
        assert state.data == ["in", *names[: checkpoint.seq]]
        assert [h["source"] for h in state.history] == ["input", *names[: checkpoint.seq - 1]]

    pipeline.fail.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume(kept[0].checkpoint_id) == ["in", *names]
    assert pipeline.calls == ["e", "f", "g"]

    latest = await pipeline.clutch.list_checkpoints("pruned")
    assert [c.seq for c in latest] == [6, 7]
    pipeline.calls.clear()
    assert await pipeline.clutch.resume(latest[0].checkpoint_id) == ["in", *names]
    assert pipeline.calls == ["g"]


async def test_keep_latest_one_still_resumes_a_long_run(
    checkpoint_store: CheckpointStorage,
) -> None:
    names = tuple(f"s{index}" for index in range(30))
    pipeline = Pipeline(checkpoint_store, names, keep_latest=1)
    pipeline.fail.add("s20")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="long")
    assert [c.seq for c in await pipeline.clutch.list_checkpoints("long")] == [20]

    pipeline.fail.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("long") == list(names)
    assert pipeline.calls == list(names[20:])
    assert len(await checkpoint_store.load_steps("long")) == 30


async def test_cleanup_prunes_to_keep_latest_and_returns_counts(
    checkpoint_store: CheckpointStorage,
) -> None:
    keep_all = Pipeline(checkpoint_store, SEVEN, keep_latest=None)
    await keep_all.clutch.run([], run_id="first")
    await keep_all.clutch.run([], run_id="second")
    keep_all.fail.add("d")
    with pytest.raises(Flaky):
        await keep_all.clutch.run([], run_id="third")
    assert await keep_all.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 0}

    keep_two = Pipeline(checkpoint_store, SEVEN, keep_latest=2)
    assert await keep_two.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 5 + 5 + 1}
    assert [c.seq for c in await keep_two.clutch.list_checkpoints("first")] == [6, 7]
    assert [c.seq for c in await keep_two.clutch.list_checkpoints("third")] == [2, 3]
    assert await keep_two.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 0}

    assert await keep_two.clutch.resume_latest("third") == list(SEVEN)
    assert keep_two.calls == ["d", "e", "f", "g"]


async def test_cleanup_leaves_other_pipelines_alone(checkpoint_store: CheckpointStorage) -> None:
    other = Pipeline(checkpoint_store, SEVEN, name="other", keep_latest=None)
    await other.clutch.run([], run_id="other-run")
    mine = Pipeline(checkpoint_store, SEVEN, keep_latest=1, ttl=timedelta(0))
    assert await mine.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 0}
    assert len(await other.clutch.list_checkpoints("other-run")) == 7
    assert [r.run_id for r in await other.clutch.list_runs()] == ["other-run"]


# ---------------------------------------------------------------- min_interval


async def test_min_interval_throttles_policy_checkpoints_but_not_the_final_one(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(
        checkpoint_store, SEVEN[:5], min_interval=timedelta(seconds=60), keep_latest=None
    )
    await pipeline.clutch.run([], run_id="throttled")
    assert await seqs_and_reasons(pipeline, "throttled") == [(1, "policy"), (5, "final")]

    pipeline.fail.add("d")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="throttled-failure")
    assert await seqs_and_reasons(pipeline, "throttled-failure") == [
        (1, "policy"),
        (3, "final"),
    ]
    pipeline.fail.clear()
    pipeline.calls.clear()
    assert await pipeline.clutch.resume_latest("throttled-failure") == list(SEVEN[:5])
    assert pipeline.calls == ["d", "e"]


async def test_min_interval_lets_a_checkpoint_through_once_it_has_passed(
    checkpoint_store: CheckpointStorage,
) -> None:
    clock = FakeClock()
    pipeline = Pipeline(
        checkpoint_store,
        ("a", "b", "c", "d"),
        min_interval=timedelta(seconds=30),
        keep_latest=None,
        clock=clock,
    )
    slow = pipeline.appender("b")

    async def b(data: list[str]) -> list[str]:
        clock.advance(31)
        return await slow(data)

    replace_agent(pipeline.clutch, b)
    await pipeline.clutch.run([], run_id="interval")
    assert await seqs_and_reasons(pipeline, "interval") == [
        (1, "policy"),
        (2, "policy"),
        (4, "final"),
    ]


async def test_min_interval_does_not_throttle_manual_checkpoints(
    checkpoint_store: CheckpointStorage,
) -> None:
    pipeline = Pipeline(
        checkpoint_store, ("a", "b", "c", "d"), min_interval=timedelta(seconds=60), keep_latest=None
    )
    taken: list[str] = []
    release = pipeline.gate("c")

    async def b(data: list[str]) -> list[str]:
        taken.append(await pipeline.clutch.checkpoint())
        get_context().metadata["b"] = True
        return [*data, "b"]

    replace_agent(pipeline.clutch, b)
    task = await pipeline.clutch.submit([], run_id="manual")
    await wait_for(pipeline.entered["c"])
    outside = asyncio.ensure_future(pipeline.clutch.checkpoint())
    await asyncio.sleep(0.01)
    release.set()
    taken.append(await asyncio.wait_for(outside, 5))
    await task.result(timeout=5)

    assert await seqs_and_reasons(pipeline, "manual") == [
        (1, "policy"),
        (1, "agent"),
        (3, "manual"),
        (4, "final"),
    ]
    ids = [c.checkpoint_id for c in await pipeline.clutch.list_checkpoints("manual")]
    assert ids[1:3] == taken


# ------------------------------------------------------------------------- ttl


async def test_ttl_expires_finished_runs_after_inactivity(
    checkpoint_store: CheckpointStorage,
) -> None:
    clock = FakeClock()
    pipeline = Pipeline(checkpoint_store, ttl=timedelta(seconds=30), clock=clock)
    await pipeline.clutch.run([], run_id="old")
    pipeline.fail.add("b")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="old-failed")
    pipeline.fail.clear()
    clock.advance(31)
    # The write path expires what is due: finishing "new" removes both old runs.
    await pipeline.clutch.run([], run_id="new")
    assert [r.run_id for r in await pipeline.clutch.list_runs()] == ["new"]
    assert await pipeline.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 0}

    clock.advance(31)
    assert await pipeline.clutch.cleanup() == {"runs_expired": 1, "checkpoints_pruned": 0}
    assert await pipeline.clutch.list_runs() == []
    assert await checkpoint_store.load_steps("new") == []
    assert await checkpoint_store.read_events("new") == []


async def test_ttl_measures_inactivity_from_the_last_update(
    checkpoint_store: CheckpointStorage,
) -> None:
    clock = FakeClock()
    pipeline = Pipeline(checkpoint_store, ttl=timedelta(seconds=30), clock=clock)
    pipeline.fail.add("c")
    with pytest.raises(Flaky):
        await pipeline.clutch.run([], run_id="revived")
    clock.advance(31)
    pipeline.fail.clear()
    # Resumed long after it was created: its last update is recent, so it stays.
    assert await pipeline.clutch.resume_latest("revived") == ["a", "b", "c"]
    assert await pipeline.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 0}
    [info] = await pipeline.clutch.list_runs()
    assert (info.updated_at - info.created_at).total_seconds() == 31

    clock.advance(31)
    assert await pipeline.clutch.cleanup() == {"runs_expired": 1, "checkpoints_pruned": 0}


async def test_ttl_never_expires_a_running_run(checkpoint_store: CheckpointStorage) -> None:
    clock = FakeClock()
    pipeline = Pipeline(checkpoint_store, ttl=timedelta(seconds=10), clock=clock)
    release = pipeline.gate("b")
    task = await pipeline.clutch.submit([], run_id="slow")
    await wait_for(pipeline.entered["b"])
    clock.advance(20)
    assert await pipeline.clutch.cleanup() == {"runs_expired": 0, "checkpoints_pruned": 0}
    release.set()
    assert await task.result(timeout=5) == ["a", "b", "c"]
    assert [r.status for r in await pipeline.clutch.list_runs()] == ["completed"]


# ------------------------------------------------------------------ bad values


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("every_n_steps", 0),
        ("every_n_steps", -3),
        ("every_n_steps", 1.5),
        ("every_n_steps", "3"),
        ("every_n_steps", None),
        ("keep_latest", 0),
        ("keep_latest", -1),
        ("keep_latest", 2.0),
        ("keep_latest", "2"),
        ("ttl", 3600),
        ("ttl", timedelta(seconds=-1)),
        ("min_interval", 0.5),
        ("min_interval", timedelta(seconds=-0.5)),
        ("durability", "never"),
        ("durability", None),
        ("on_agent_complete", "summarize"),
        ("on_agent_complete", [1, 2]),
        ("on_agent_complete", 5),
        ("on_agent_complete", {"summarize": 1}),
        ("on_agent_complete", (name for name in ["a"])),
    ],
)
def test_bad_policy_values_raise_configuration_error_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(ConfigurationError, match=rf"CheckpointPolicy\.{field}\b"):
        CheckpointPolicy(**{field: value})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (5, "must be a list of agent names, got 5"),  # was: 'int' object is not iterable
        ("b", "must be a list of agent names, got 'b' (write on_agent_complete=['b'])"),
        (["a", None], "must be agent names (strings), got None"),
    ],
)
def test_on_agent_complete_that_is_not_a_list_of_names_is_named(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        CheckpointPolicy(on_agent_complete=value)
    assert str(refused.value) == f"CheckpointPolicy.on_agent_complete {message}"


def test_on_agent_complete_takes_a_list_a_tuple_or_a_set_of_names() -> None:
    for given in (["a", "b"], ("a", "b"), {"a", "b"}, frozenset({"a", "b"})):
        assert sorted(CheckpointPolicy(on_agent_complete=given).on_agent_complete or ()) == [
            "a",
            "b",
        ]


@pytest.mark.parametrize(
    ("field", "value", "takes"),
    [
        ("every_n_steps", True, "an int >= 1"),
        ("every_n_steps", False, "an int >= 1"),
        ("keep_latest", True, "an int >= 1 or None"),
        ("keep_latest", False, "an int >= 1 or None"),
    ],
)
def test_a_bool_is_not_a_count_of_the_policy(field: str, value: bool, takes: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        CheckpointPolicy(**{field: value})
    assert str(refused.value) == (
        f"CheckpointPolicy.{field} must be {takes}, got {value!r} (a bool, not a number)"
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("policy", {"every_n_steps": 1}), ("lease", timedelta(0)), ("lease", 30)],
)
def test_bad_config_values_raise_configuration_error_naming_the_field(
    field: str, value: Any
) -> None:
    with pytest.raises(ConfigurationError, match=rf"CheckpointConfig\.{field}\b"):
        CheckpointConfig(**{field: value})


def test_policy_defaults_match_the_documented_ones() -> None:
    policy = CheckpointPolicy()
    assert policy.every_n_steps == 1
    assert policy.on_agent_complete is None
    assert policy.keep_latest == 3
    assert policy.ttl is None and policy.min_interval is None
    assert policy.durability == "sync"
    config = CheckpointConfig()
    assert config.storage is None and config.run_id is None
    assert config.policy == CheckpointPolicy()
