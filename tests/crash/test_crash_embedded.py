"""Crash tests on the embedded stores (file, SQLite): real child processes, SIGKILLed.

Replay a failure with the seed it printed: ``NESTEGG_CRASH_SEED=<seed> pytest tests/crash``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.crash.child import STRATEGIES
from tests.crash.harness import CrashReport, StoreTarget
from tests.crash.scenarios import (
    FAILING_STRATEGY,
    exit_durability_starts_over,
    failed_step_replays_its_calls,
    journaled_calls_survive_kills,
    killed_and_resumed,
    killed_in_its_first_step,
    long_run_killed_at_block_edges,
    racing_resumers,
    recovered_in_fresh_process,
)

pytestmark = pytest.mark.crash


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_killed_run_resumes_to_the_uninterrupted_result(
    embedded_store: StoreTarget,
    strategy: str,
    tmp_path: Path,
    crash_rng: tuple[random.Random, CrashReport],
) -> None:
    await killed_and_resumed(embedded_store, strategy, tmp_path, *crash_rng)


async def test_racing_resumers_exactly_one_proceeds(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await racing_resumers(embedded_store, tmp_path, *crash_rng)


async def test_recover_in_a_fresh_process_finishes_every_interrupted_run(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await recovered_in_fresh_process(embedded_store, tmp_path, *crash_rng)


@pytest.mark.parametrize("strategy", STRATEGIES)
async def test_killed_run_makes_again_only_the_interrupted_journaled_calls(
    embedded_store: StoreTarget,
    strategy: str,
    tmp_path: Path,
    crash_rng: tuple[random.Random, CrashReport],
) -> None:
    await journaled_calls_survive_kills(embedded_store, strategy, tmp_path, *crash_rng)


async def test_failed_step_resumed_in_another_process_makes_every_call_once(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await failed_step_replays_its_calls(embedded_store, FAILING_STRATEGY, tmp_path, crash_rng[1])


async def test_long_run_killed_where_blocks_of_steps_complete_resumes_to_the_same_result(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await long_run_killed_at_block_edges(embedded_store, tmp_path, *crash_rng)


async def test_a_run_killed_in_its_first_step_resumes_to_the_uninterrupted_result(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await killed_in_its_first_step(embedded_store, tmp_path, crash_rng[1])


async def test_a_run_of_durability_exit_killed_mid_run_starts_over_and_pays_again(
    embedded_store: StoreTarget, tmp_path: Path, crash_rng: tuple[random.Random, CrashReport]
) -> None:
    await exit_durability_starts_over(embedded_store, tmp_path, crash_rng[1])
