"""A run that waits in distributed mode: the worker stores it as waiting and acks its
message, the caller gets RunWaiting, and signal() resumes it in the signalling process."""

from __future__ import annotations

from typing import Any

import pytest

import nestegg
from nestegg import Clutch, RunWaiting, get_context
from tests.transport.apps import config, counter, prefix, side_effect, transport
from tests.transport.conftest import Deployment
from tests.transport.test_caller import serving


def make_approvals() -> Clutch:
    clutch = Clutch("approvals", transport=transport(), checkpoint=config())

    @clutch.agent()
    async def review(data: dict[str, Any]) -> dict[str, Any]:
        paid = await side_effect(get_context().run_id, 1)
        approval = await nestegg.wait_for("approval")
        return {**data, "paid": paid, "approval": approval}

    return clutch


@pytest.mark.server
async def test_a_waiting_run_is_resumed_by_its_signal(deployment: Deployment) -> None:
    caller, worker = make_approvals(), make_approvals()
    try:
        async with serving(worker):
            with pytest.raises(RunWaiting) as waiting:
                await caller.run({}, run_id="approve-me", timeout=30)
        assert waiting.value.signal == "approval"
        result = await caller.signal("approve-me", "approval", "yes")
    finally:
        await caller.stop()
        await worker.stop()
    assert result == {"paid": 1, "approval": "yes"}
    effects = await counter().hget(f"{prefix()}effects", "approve-me:1")
    assert int(effects) == 1
