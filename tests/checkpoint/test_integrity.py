"""Damaged records: a torn or altered checkpoint is skipped with a warning, a damaged step
record makes the checkpoints that need it unusable, a damaged input is an error; never a
raw JSONDecodeError, never a wrong state."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import pytest

from nestegg.checkpoint.codec import seal
from nestegg.checkpoint.loader import load_state, unusable_checkpoints
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.errors import (
    CheckpointCorruptedError,
    CheckpointFallbackWarning,
    NestEggError,
)

from .conftest import Flaky, Pipeline, Tamper, stored_view

NAMES = ("a", "b", "c", "d")
BODY_KEY = b',"body":'


async def failed_at_d(store: CheckpointStorage, run_id: str) -> Pipeline:
    """A run of a, b, c, d that failed at d, with checkpoints after a, b and c."""
    pipeline = Pipeline(store, NAMES, keep_latest=None)
    pipeline.fail.add("d")
    with pytest.raises(Flaky):
        await pipeline.clutch.run(["in"], run_id=run_id)
    assert [c.seq for c in await pipeline.clutch.list_checkpoints(run_id)] == [1, 2, 3]
    pipeline.fail.clear()
    pipeline.calls.clear()
    return pipeline


async def refused_one_by_one(store: CheckpointStorage, run_id: str) -> dict[str, str]:
    """The run's checkpoints :func:`load_state` refuses, each loaded alone, with why;
    asserting that :func:`unusable_checkpoints`, which reads the steps once for them all,
    names the same ones for the same reasons."""
    run = await store.get_run(run_id)
    assert run is not None
    checkpoints = await store.list_checkpoints(run_id)
    refused = {}
    for checkpoint in checkpoints:
        try:
            await load_state(store, run, checkpoint)
        except CheckpointCorruptedError as error:
            refused[checkpoint.checkpoint_id] = str(error)
    listed = await unusable_checkpoints(store, run, checkpoints)
    assert {key: str(error) for key, error in listed.items()} == refused
    return refused


async def resume_counting_warnings(pipeline: Pipeline, run_id: str) -> tuple[object, int]:
    """resume_latest's result and how many damaged checkpoints its one
    CheckpointFallbackWarning (if any) names."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await pipeline.clutch.resume_latest(run_id)
    fallbacks = [
        str(w.message) for w in caught if issubclass(w.category, CheckpointFallbackWarning)
    ]
    assert len(fallbacks) <= 1, fallbacks  # one warning, however many it skipped
    if not fallbacks:
        return result, 0
    skipped = re.match(r"skipping (a|\d+) damaged checkpoints?: ", fallbacks[0])
    assert skipped is not None, fallbacks[0]
    return result, 1 if skipped[1] == "a" else int(skipped[1])


def flip(offset: int) -> Callable[[bytes], bytes]:
    def damage(raw: bytes) -> bytes:
        return raw[:offset] + bytes([raw[offset] ^ 0x01]) + raw[offset + 1 :]

    return damage


def truncate(offset: int) -> Callable[[bytes], bytes]:
    return lambda raw: raw[:offset]


def offsets(length: int, count: int = 24) -> list[int]:
    step = max(1, length // count)
    return sorted({*range(0, length, step), 1, length - 2, length - 1})


# --------------------------------------------------------------- one checkpoint


async def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = await failed_at_d(checkpoint_store, "fallback")
    [*_, newest] = await pipeline.clutch.list_checkpoints("fallback")
    stored = await tamper.stored_checkpoint_bytes(newest.checkpoint_id)
    await tamper.damage_checkpoint(newest.checkpoint_id, flip(len(stored) - 10))

    with pytest.raises(CheckpointCorruptedError, match=newest.checkpoint_id):
        await pipeline.clutch.get_checkpoint(newest.checkpoint_id)
    with pytest.raises(CheckpointCorruptedError, match=newest.checkpoint_id):
        await pipeline.clutch.resume(newest.checkpoint_id)
    with pytest.warns(CheckpointFallbackWarning, match=newest.checkpoint_id):
        result = await pipeline.clutch.resume_latest("fallback")

    assert result == ["in", *NAMES]
    assert pipeline.calls == ["c", "d"]
    assert [c.seq for c in await pipeline.clutch.list_checkpoints("fallback")] == [1, 2, 3, 4]


@pytest.mark.parametrize("how", ["flip", "truncate"])
async def test_damage_at_many_offsets_is_detected_and_skipped(
    how: str, checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    probe = await failed_at_d(checkpoint_store, "probe")
    [*_, newest] = await probe.clutch.list_checkpoints("probe")
    stored = await tamper.stored_checkpoint_bytes(newest.checkpoint_id)
    body_from = stored.index(BODY_KEY) + len(BODY_KEY) if tamper.kind == "file" else 0
    body_to = stored.rindex(b"}") if tamper.kind == "file" else len(stored)
    misses: list[str] = []

    for offset in offsets(len(stored)):
        run_id = f"{how}-{offset}"
        pipeline = await failed_at_d(checkpoint_store, run_id)
        [*_, newest] = await pipeline.clutch.list_checkpoints(run_id)
        damage = flip(offset) if how == "flip" else truncate(offset)
        await tamper.damage_checkpoint(newest.checkpoint_id, damage)

        result, fallbacks = await resume_counting_warnings(pipeline, run_id)

        assert result == ["in", *NAMES], f"offset {offset}"
        fell_back = fallbacks == 1 and pipeline.calls == ["c", "d"]
        # Damage the checksum does not cover (a file's header) may go unnoticed, but only
        # if the checkpoint still restores the right state.
        unnoticed_header = (
            how == "flip"
            and not body_from <= offset < body_to
            and fallbacks == 0
            and pipeline.calls == ["d"]
        )
        if not (fell_back or unnoticed_header):
            misses.append(
                f"{how} at {offset} of {len(stored)}: {fallbacks} warning(s), re-ran "
                f"{pipeline.calls}; stored {damage(stored)[:70]!r}..."
            )
    assert misses == [], "\n".join(misses)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b"\x00\xff\xfe",
        b'{"crc":"zzzzzzzz","body":{"seq":3}}',
        seal(b"not json at all"),
        seal(b"[1, 2, 3]"),
        seal(b'"a string"'),
        seal(b'{"seq": "three", "turn": 3}'),
        seal(b'{"seq": 3}'),
        seal(b'{"seq": 3, "turn": 99, "metadata": {}}'),
        seal(b'{"seq": 99, "turn": 99, "metadata": {}}'),
    ],
    ids=lambda b: repr(b[:40]),
)
async def test_a_checkpoint_body_that_is_not_a_checkpoint_is_skipped(
    body: bytes, checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = await failed_at_d(checkpoint_store, "garbage")
    [*_, newest] = await pipeline.clutch.list_checkpoints("garbage")
    await tamper.checkpoint_body(newest.checkpoint_id, body)

    with pytest.raises(CheckpointCorruptedError):
        await pipeline.clutch.get_checkpoint(newest.checkpoint_id)
    result, fallbacks = await resume_counting_warnings(pipeline, "garbage")
    assert fallbacks == 1
    assert result == ["in", *NAMES] and pipeline.calls == ["c", "d"]


async def test_every_checkpoint_damaged_falls_back_to_the_input(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = await failed_at_d(checkpoint_store, "all-bad")
    for checkpoint in await pipeline.clutch.list_checkpoints("all-bad"):
        await tamper.damage_checkpoint(checkpoint.checkpoint_id, truncate(40))

    result, fallbacks = await resume_counting_warnings(pipeline, "all-bad")
    assert fallbacks == 3
    assert result == ["in", *NAMES] and pipeline.calls == list(NAMES)


# ------------------------------------------------------------------ step records


@pytest.mark.parametrize(
    "damage",
    [flip(30), truncate(25), lambda raw: seal(b"not json"), lambda raw: seal(b'{"agent":"b"}')],
    ids=["flipped", "truncated", "sealed-garbage", "sealed-without-data"],
)
async def test_a_damaged_step_record_makes_the_checkpoints_needing_it_unusable(
    damage: Callable[[bytes], bytes], checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = await failed_at_d(checkpoint_store, "bad-step")
    [*_, step_two, _] = await checkpoint_store.load_steps("bad-step")
    assert step_two.seq == 2
    await tamper.step_body("bad-step", 2, damage(step_two.body))
    refused = await refused_one_by_one(checkpoint_store, "bad-step")
    checkpoints = await checkpoint_store.list_checkpoints("bad-step")
    assert set(refused) == {c.checkpoint_id for c in checkpoints if c.seq >= 2}

    result, fallbacks = await resume_counting_warnings(pipeline, "bad-step")
    # Checkpoints 3 and 2 need step 2; checkpoint 1 does not.
    assert fallbacks == 2
    assert result == ["in", *NAMES]
    assert pipeline.calls == ["b", "c", "d"]
    assert [s.seq for s in await checkpoint_store.load_steps("bad-step")] == [1, 2, 3, 4]


# ------------------------------------------------------------------------- input


@pytest.mark.parametrize(
    "damage",
    [flip(20), truncate(12), lambda raw: b"", lambda raw: seal(b"{not json")],
    ids=["flipped", "truncated", "empty", "sealed-garbage"],
)
async def test_a_damaged_input_raises_checkpoint_corrupted(
    damage: Callable[[bytes], bytes], checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = await failed_at_d(checkpoint_store, "bad-input")
    run = await checkpoint_store.get_run("bad-input")
    assert run is not None
    await tamper.run_input("bad-input", damage(run.input))
    before = await stored_view(checkpoint_store, "bad-input")
    [first, *_] = await pipeline.clutch.list_checkpoints("bad-input")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        with pytest.raises(CheckpointCorruptedError, match="input"):
            await pipeline.clutch.resume_latest("bad-input")
    with pytest.raises(CheckpointCorruptedError, match="input"):
        await pipeline.clutch.resume(first.checkpoint_id)
    with pytest.raises(CheckpointCorruptedError):
        await pipeline.clutch.get_checkpoint(first.checkpoint_id)

    assert pipeline.calls == []
    assert await stored_view(checkpoint_store, "bad-input") == before


async def test_damage_never_surfaces_as_anything_but_a_nestegg_error(
    checkpoint_store: CheckpointStorage, tamper: Tamper
) -> None:
    pipeline = await failed_at_d(checkpoint_store, "no-raw")
    run = await checkpoint_store.get_run("no-raw")
    assert run is not None
    await tamper.run_input("no-raw", b'{"crc":"00000000","body":{')
    for checkpoint in await pipeline.clutch.list_checkpoints("no-raw"):
        await tamper.damage_checkpoint(checkpoint.checkpoint_id, truncate(30))
        with pytest.raises(NestEggError):
            await pipeline.clutch.get_checkpoint(checkpoint.checkpoint_id)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointFallbackWarning)
        with pytest.raises(CheckpointCorruptedError):
            await pipeline.clutch.resume_latest("no-raw")
