"""The code of yours that picks the next agent fails a run as an agent that raises does: a
selector that raises, or names the next agent by what is no str (as does a hand-over), leaves
the run stored failed with the error, its step_failed and run_failed events written, the
caller given the error, and neither recover() nor a later run of its id taking it as
interrupted."""

from __future__ import annotations

from typing import Any

import pytest

from nestegg import Clutch, Handover, Strategy
from nestegg.checkpoint.formats import parse_event, parse_failure
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import FAILED, RUN_FAILED, RUN_STARTED, STEP_FAILED
from nestegg.errors import InvalidIdentifierError, RunExistsError, RunFailedError

from .conftest import Flaky, config


class Picking:
    """A SELECTOR Clutch whose agent ``count`` adds 1 to ``n`` and whose selector picks it
    until ``n`` is 3, raising Flaky once ``n`` reaches ``breaks_at`` (None: never)."""

    def __init__(self, store: CheckpointStorage, breaks_at: int | None) -> None:
        self.breaks_at = breaks_at
        self.requests = 0
        self.clutch = Clutch(
            "picking", strategy=Strategy.SELECTOR, checkpoint=config(store), on_request=self.gate
        )
        self.clutch.selector(self.pick)
        self.clutch.agent()(count)

    async def gate(self, request: dict[str, Any]) -> None:
        self.requests += 1

    async def pick(self, data: dict[str, int]) -> str | None:
        if self.breaks_at is not None and data["n"] >= self.breaks_at:
            raise Flaky(f"no route at n={data['n']}")
        return "count" if data["n"] < 3 else None


async def count(data: dict[str, int]) -> dict[str, int]:
    return {"n": data["n"] + 1}


async def stored_failure(store: CheckpointStorage, run_id: str) -> dict[str, Any]:
    """The stored error of the failed run ``run_id`` (its traceback left out)."""
    run = await store.get_run(run_id)
    assert run is not None and run.status == FAILED and run.error is not None
    failure = parse_failure(run.error, "error")
    failure.pop("traceback")
    return failure


async def test_a_selector_that_raises_fails_the_run_with_its_error(
    checkpoint_store: CheckpointStorage,
) -> None:
    picking = Picking(checkpoint_store, breaks_at=2)
    with pytest.raises(Flaky, match="no route at n=2"):  # as an agent's error is raised
        await picking.clutch.run({"n": 0}, run_id="broke")
    failure = await stored_failure(checkpoint_store, "broke")
    assert failure.pop("started") > 0 and failure.pop("duration") >= 0
    assert failure == {
        "type": "Flaky",
        "message": "no route at n=2",
        "agent": None,
        "hook": "selector",
        "seq": 3,
    }
    events = await checkpoint_store.read_events("broke")
    assert [e.kind for e in events][-2:] == [STEP_FAILED, RUN_FAILED]
    detail = parse_event(events[-2].body, "event")
    assert (detail["agent"], detail["hook"], detail["seq"]) == (None, "selector", 3)
    run = await checkpoint_store.get_run("broke")
    assert run is not None and run.step_seq == 2
    assert [r.status for r in await picking.clutch.list_runs()] == [FAILED]
    assert await picking.clutch.list_interrupted() == [] and await picking.clutch.recover() == {}
    with pytest.raises(RunExistsError, match="status 'failed'"):
        await picking.clutch.run({"n": 0}, run_id="broke")
    with pytest.raises(RunFailedError) as failed:
        await picking.clutch.result("broke", timeout=1)
    assert (failed.value.agent, failed.value.hook) == (None, "selector")
    assert str(failed.value) == "run 'broke' failed in selector: Flaky: no route at n=2"

    picking.breaks_at = None  # fixed: its resume asks the selector again at step 3
    assert await picking.clutch.resume_latest("broke") == {"n": 3}
    assert picking.requests == 1


async def test_a_selector_that_raises_before_the_first_step_fails_the_run(
    checkpoint_store: CheckpointStorage,
) -> None:
    picking = Picking(checkpoint_store, breaks_at=0)
    with pytest.raises(Flaky, match="no route at n=0"):
        await picking.clutch.run({"n": 0}, run_id="first")
    failure = await stored_failure(checkpoint_store, "first")
    assert (failure["agent"], failure["hook"], failure["seq"]) == (None, "selector", 1)
    kinds = [e.kind for e in await checkpoint_store.read_events("first")]
    assert (kinds[0], kinds[-1]) == (RUN_STARTED, RUN_FAILED) and STEP_FAILED in kinds
    assert await picking.clutch.recover() == {}

    picking.breaks_at = None  # on_request passed: its resume does not await it again
    assert await picking.clutch.resume_latest("first") == {"n": 3}
    assert picking.requests == 1


async def test_a_selector_that_names_no_agent_by_a_str_fails_the_run_by_name(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch = Clutch("listing", strategy=Strategy.SELECTOR, checkpoint=config(checkpoint_store))

    @clutch.selector
    async def pick(data: dict[str, int]) -> Any:
        return ["count"] if data["n"] == 1 else "count"

    clutch.agent()(count)
    with pytest.raises(InvalidIdentifierError) as refused:
        await clutch.run({"n": 0}, run_id="listed")
    assert str(refused.value) == (
        f"selector {__name__}.{pick.__qualname__} returned ['count'] (a list), not the name "
        "of an agent: a selector returns the name of the agent to run next (a str), or "
        "None to stop"
    )
    failure = await stored_failure(checkpoint_store, "listed")
    assert (
        failure.items() >= {"type": "InvalidIdentifierError", "hook": "selector", "seq": 2}.items()
    )
    assert await clutch.recover() == {}


async def test_a_handover_to_what_is_no_str_fails_the_step_by_name(
    checkpoint_store: CheckpointStorage,
) -> None:
    clutch = Clutch("handing", checkpoint=config(checkpoint_store))

    @clutch.agent()
    async def first(data: dict[str, int]) -> dict[str, int]:
        raise Handover(["second"], data)

    @clutch.agent()
    async def second(data: dict[str, int]) -> dict[str, int]:
        return data

    with pytest.raises(InvalidIdentifierError) as refused:
        await clutch.run({"n": 0}, run_id="handed")
    assert str(refused.value) == (
        "Handover(['second']) names no agent: hand over to an agent by its name (a str)"
    )
    failure = await stored_failure(checkpoint_store, "handed")
    assert failure.items() >= {"type": "InvalidIdentifierError", "agent": "first"}.items()
    assert await clutch.recover() == {}
