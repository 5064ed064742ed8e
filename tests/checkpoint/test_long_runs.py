"""Runs longer than a block of steps (the SQLite store packs their records): resumed from
their newest checkpoint or from one inside a block, with their whole history; a damaged
block is detected and skipped like a damaged record."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nestegg import Clutch, Strategy, get_context
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.constants import STEP_BLOCK_STEPS
from nestegg.errors import CheckpointFallbackWarning
from tests.stores.test_sqlite_blocks import rewrite_block

from .conftest import Flaky, config
from .test_integrity import refused_one_by_one

Reopen = Callable[[], Awaitable[CheckpointStorage]]
STEPS = 2 * STEP_BLOCK_STEPS + 30


class Loop:
    """Two agents taking turns for STEPS steps; each adds its step to the data and notes
    the history it was shown. ``fail_at``: the step that raises Flaky, once."""

    def __init__(self, store: CheckpointStorage, fail_at: int | None = None, **policy: Any):
        self.fail_at = fail_at
        self.histories: dict[int, list[dict[str, Any]]] = {}
        self.clutch = Clutch(
            "loop",
            strategy=Strategy.ROUND_ROBIN,
            max_turns=STEPS,
            checkpoint=config(store, **policy),
        )
        for name in ("ping", "pong"):
            self.clutch.agent()(self.agent(name))

    def agent(self, name: str) -> Any:
        async def step(data: dict[str, Any]) -> dict[str, Any]:
            turn = len(data["steps"]) + 1
            if turn == self.fail_at:
                self.fail_at = None
                raise Flaky(f"step {turn} failed on purpose")
            self.histories[turn] = list(get_context().state.history)
            return {"steps": [*data["steps"], f"{name}-{turn}"]}

        step.__name__ = step.__qualname__ = name
        return step


async def whole_run(store: CheckpointStorage) -> tuple[Loop, Any]:
    loop = Loop(store)
    return loop, await loop.clutch.run({"steps": []}, run_id="whole")


async def test_a_long_failed_run_resumes_with_its_whole_history(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    whole, expected = await whole_run(checkpoint_store)
    failing = Loop(checkpoint_store, fail_at=STEPS - 3)
    with pytest.raises(Flaky):
        await failing.clutch.run({"steps": []}, run_id="cut")
    resumed = Loop(await reopen_store())
    result = await resumed.clutch.resume_latest("cut")
    assert result == expected
    assert result["steps"] == [f"{'ping' if n % 2 else 'pong'}-{n}" for n in range(1, STEPS + 1)]
    assert sorted(resumed.histories) == list(range(STEPS - 3, STEPS + 1))
    for turn, history in resumed.histories.items():
        assert history == whole.histories[turn], turn


async def test_resume_from_a_checkpoint_inside_a_block_runs_the_later_steps_again(
    checkpoint_store: CheckpointStorage, reopen_store: Reopen
) -> None:
    whole, expected = await whole_run(checkpoint_store)
    first = Loop(checkpoint_store, keep_latest=None)
    await first.clutch.run({"steps": []}, run_id="again")
    for at in (STEP_BLOCK_STEPS + 7, STEP_BLOCK_STEPS, STEP_BLOCK_STEPS // 2):  # each earlier
        [checkpoint] = [c for c in await first.clutch.list_checkpoints("again") if c.seq == at]
        again = Loop(await reopen_store(), keep_latest=None)
        assert await again.clutch.resume(checkpoint.checkpoint_id) == expected
        assert sorted(again.histories) == list(range(at + 1, STEPS + 1)), at
        for turn, history in again.histories.items():
            assert history == whole.histories[turn], (at, turn)
    later = Loop(await reopen_store())
    assert await later.clutch.run({"steps": []}, run_id="again") == expected
    [info] = [r for r in await later.clutch.list_runs() if r.run_id == "again"]
    assert info.steps == STEPS


@pytest.mark.parametrize(
    ("column", "at", "named"),
    [
        ("body", 5000, r"step \d+ of run 'cut' (failed its checksum|is torn)"),
        ("head", 40, f"the block of steps 1 to {STEP_BLOCK_STEPS} of run 'cut'"),
    ],
)
async def test_a_damaged_block_falls_back_past_every_checkpoint_that_needs_it(
    tmp_path: Path, column: str, at: int, named: str
) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    failing = Loop(store, fail_at=STEPS)
    with pytest.raises(Flaky):
        await failing.clutch.run({"steps": []}, run_id="cut")
    await store.close()
    rewrite_block(path, column, at)
    reopened = SQLiteCheckpointStorage(path)
    resumed = Loop(reopened)
    with pytest.warns(CheckpointFallbackWarning, match=named):
        result = await resumed.clutch.resume_latest("cut")
    assert len(result["steps"]) == STEPS
    assert sorted(resumed.histories) == list(range(1, STEPS + 1))  # from the input again
    await reopened.close()


async def test_a_damaged_later_block_does_not_stop_a_resume_from_before_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "n.db"
    store = SQLiteCheckpointStorage(path)
    whole, expected = await whole_run(store)
    first = Loop(store, keep_latest=None)
    await first.clutch.run({"steps": []}, run_id="again")
    [checkpoint] = [
        c for c in await first.clutch.list_checkpoints("again") if c.seq == STEP_BLOCK_STEPS
    ]
    await store.close()
    rewrite_block(path, "head", 40, block=3)  # the second block of run "again"
    reopened = SQLiteCheckpointStorage(path)
    again = Loop(reopened, keep_latest=None)
    assert await again.clutch.resume(checkpoint.checkpoint_id) == expected
    assert sorted(again.histories) == list(range(STEP_BLOCK_STEPS + 1, STEPS + 1))
    assert [len(h) for h in again.histories.values()] == [
        len(whole.histories[turn]) for turn in again.histories
    ]
    await reopened.close()


@pytest.mark.parametrize(
    ("column", "block", "first_refused"),
    [("body", 0, 150), ("head", 0, 1), ("body", 1, STEP_BLOCK_STEPS + 20)],
)
async def test_the_checkpoints_a_damaged_block_makes_unusable_are_listed_as_loaded(
    tmp_path: Path, column: str, block: int, first_refused: int
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    await Loop(store, keep_latest=None).clutch.run({"steps": []}, run_id="every")
    sizes = [len(record.body) for record in await store.load_steps("every")]
    await store.close()
    before = sizes[block * STEP_BLOCK_STEPS : first_refused - 1]  # the records before it
    at = sum(before) + 40 if column == "body" else 40  # a body: in step first_refused
    rewrite_block(tmp_path / "n.db", column, at, block=block)
    reopened = SQLiteCheckpointStorage(tmp_path / "n.db")
    try:
        refused = await refused_one_by_one(reopened, "every")  # inside, across and past it
        checkpoints = await reopened.list_checkpoints("every")
        assert set(refused) == {c.checkpoint_id for c in checkpoints if c.seq >= first_refused}
    finally:
        await reopened.close()
