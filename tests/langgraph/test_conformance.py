"""LangGraph's own conformance suite (langgraph-checkpoint-conformance) against NestEggSaver
on every store: all eight capabilities, none skipped."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from nestegg.langgraph import NestEggSaver
from tests.langgraph.conftest import SaverFactory, kinds

conformance = pytest.importorskip("langgraph.checkpoint.conformance")
from langgraph.checkpoint.conformance.capabilities import Capability  # noqa: E402


@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_all_eight_capabilities_pass(saver_factory: SaverFactory, defer_writes: bool) -> None:
    @conformance.checkpointer_test(name="NestEggSaver")
    async def factory() -> AsyncIterator[NestEggSaver]:
        yield saver_factory(defer_writes=defer_writes)

    report = await conformance.validate(factory)
    results = report.results
    assert sorted(results) == sorted(c.value for c in Capability)
    failures = {name: r.failures for name, r in results.items() if not r.passed}
    assert not failures, failures
    assert all(r.detected and r.tests_skipped == 0 and r.tests_passed > 0 for r in results.values())
