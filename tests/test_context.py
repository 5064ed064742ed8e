"""get_context() and the per-run context: state, history, metadata, isolation."""

from __future__ import annotations

import asyncio
from datetime import date
from typing import Any

import pytest
from pydantic import BaseModel

from nestegg import Clutch, ClutchContext, ClutchState, Strategy, get_context
from nestegg.checkpoint import CheckpointConfig, MemoryCheckpointStorage
from nestegg.context import current_context, set_context
from nestegg.errors import ConfigurationError, NestEggError, NoActiveContextError


class Ticket(BaseModel):
    text: str


class Dated(BaseModel):
    text: str
    on: date
    ticket: Ticket


class TestOutsideARun:
    def test_get_context_raises_outside_a_run(self) -> None:
        with pytest.raises(NoActiveContextError, match="outside"):
            get_context()

    def test_the_message_begins_as_eggai_clutchs(self) -> None:
        with pytest.raises(RuntimeError, match=r"^No active Clutch context: get_context"):
            get_context()

    def test_the_error_is_a_runtime_error_of_the_tree(self) -> None:
        assert issubclass(NoActiveContextError, RuntimeError)
        assert issubclass(NoActiveContextError, NestEggError)
        with pytest.raises(RuntimeError):
            get_context()

    def test_current_context_is_none_outside_a_run(self) -> None:
        assert current_context() is None

    async def test_context_does_not_leak_after_a_run(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def agent(data: Any) -> Any:
            get_context()
            return data

        await clutch.run("test")
        with pytest.raises(RuntimeError):
            get_context()

    async def test_context_does_not_leak_after_a_failed_run(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def agent(data: Any) -> Any:
            raise ValueError("x")

        with pytest.raises(ValueError):
            await clutch.run("test")
        assert current_context() is None


class TestInsideARun:
    async def test_agent_sees_id_turn_source_and_data(self) -> None:
        captured: dict[str, Any] = {}
        clutch = Clutch("p")

        @clutch.agent()
        async def inspector(data: Any) -> Any:
            ctx = get_context()
            captured.update(
                clutch_id=ctx.state.clutch_id,
                run_id=ctx.run_id,
                turn=ctx.state.turn,
                source=ctx.source,
                data=ctx.data,
                strategy=ctx.state.strategy,
                members=list(ctx.state.members),
            )
            return data

        await clutch.run("test")
        assert captured["turn"] == 0
        assert captured["source"] == "input"
        assert captured["data"] == "test"
        assert captured["strategy"] == "sequential"
        assert captured["members"] == ["inspector"]
        assert captured["clutch_id"] and captured["run_id"] == captured["clutch_id"]

    async def test_each_run_gets_a_new_id(self) -> None:
        ids: list[str] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def agent(data: Any) -> Any:
            ids.append(get_context().state.clutch_id)
            return data

        await clutch.run(1)
        await clutch.run(2)
        assert len(set(ids)) == 2

    async def test_turn_counts_steps_that_produced_data(self) -> None:
        turns: list[int] = []
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=4)

        @clutch.agent()
        async def agent(data: int) -> int:
            turns.append(get_context().state.turn)
            return data + 1

        await clutch.run(0)
        assert turns == [0, 1, 2, 3]

    async def test_on_step_hook_can_read_the_context(self) -> None:
        seen: list[tuple[str, int]] = []

        async def on_step(name: str, input_data: Any, output: Any) -> None:
            ctx = get_context()
            seen.append((ctx.source, ctx.state.turn))

        clutch = Clutch("p", on_step=on_step)

        @clutch.agent()
        async def a(data: Any) -> Any:
            return data

        await clutch.run("in")
        # The hook runs after the agent returned and before its output becomes current.
        assert seen == [("input", 0)]

    async def test_metadata_persists_across_steps(self) -> None:
        seen: list[dict[str, Any]] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def writer(data: Any) -> Any:
            get_context().metadata["tokens"] = 12
            return data

        @clutch.agent()
        async def reader(data: Any) -> Any:
            seen.append(dict(get_context().metadata))
            return data

        await clutch.run("in")
        assert seen == [{"tokens": 12}]

    async def test_metadata_starts_empty_for_every_run(self) -> None:
        seen: list[dict[str, Any]] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def agent(data: Any) -> Any:
            ctx = get_context()
            seen.append(dict(ctx.metadata))
            ctx.metadata["ran"] = True
            return data

        await clutch.run(1)
        await clutch.run(2)
        assert seen == [{}, {}]

    async def test_context_survives_awaits_inside_an_agent(self) -> None:
        ids: list[tuple[str, str]] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def agent(data: Any) -> Any:
            before = get_context().state.clutch_id
            await asyncio.sleep(0)
            ids.append((before, get_context().state.clutch_id))
            return data

        await asyncio.gather(clutch.run(1), clutch.run(2))
        assert all(before == after for before, after in ids)
        assert len({before for before, _ in ids}) == 2

    async def test_context_reaches_tasks_an_agent_starts(self) -> None:
        ids: list[str] = []
        clutch = Clutch("p")

        async def helper() -> str:
            return get_context().state.clutch_id

        @clutch.agent()
        async def agent(data: Any) -> Any:
            ids.append(await asyncio.create_task(helper()))
            ids.append(get_context().state.clutch_id)
            return data

        await clutch.run("in")
        assert ids[0] == ids[1]


def entry(source: str, data: Any) -> dict[str, Any]:
    return {"source": source, "data": data}


def steps(ctx: ClutchContext, outputs: range) -> list[ClutchContext]:
    """``ctx`` and the contexts of the steps of agent "a" after it that gave ``outputs``."""
    contexts = [ctx]
    for output in outputs:
        contexts.append(contexts[-1].next("a", output))
    return contexts


class TestKeptContexts:
    """Each step gets its own context, as in eggai-clutch: one an agent keeps (to log it
    later, say) goes on saying what its step saw: data, source, turn, history, metadata."""

    @staticmethod
    def pipeline(kept: list[ClutchContext], fail: list[bool], **options: Any) -> Clutch:
        clutch = Clutch("kept", strategy=Strategy.ROUND_ROBIN, max_turns=4, **options)

        @clutch.agent()
        async def count(data: int) -> int:
            ctx = get_context()
            ctx.metadata["seen"] = ctx.metadata.get("seen", 0) + 1
            if fail and fail.pop():
                raise ValueError("failed on purpose")
            kept.append(ctx)
            return data + 1

        return clutch

    @staticmethod
    def what_each_step_saw(kept: list[ClutchContext]) -> list[Any]:
        return [(c.data, c.source, c.state.turn, c.state.history, c.metadata) for c in kept]

    def expected(self) -> list[Any]:
        inputs = [entry("input", 0)] + [entry("count", n) for n in (1, 2, 3)]
        return [(n, "count" if n else "input", n, inputs[:n], {"seen": n + 1}) for n in range(4)]

    async def test_a_kept_context_says_what_its_step_saw(self) -> None:
        kept: list[ClutchContext] = []
        assert await self.pipeline(kept, []).run(0) == 4
        assert self.what_each_step_saw(kept) == self.expected()
        assert len({id(ctx) for ctx in kept}) == 4

    async def test_a_kept_context_of_a_resumed_run_reads_its_history_after_the_run(
        self,
    ) -> None:
        store = MemoryCheckpointStorage()
        kept: list[ClutchContext] = []
        failing = self.pipeline(kept, [True, False, False], checkpoint=CheckpointConfig(store))
        with pytest.raises(ValueError, match="on purpose"):
            await failing.run(0, run_id="r")
        resumed: list[ClutchContext] = []
        clutch = self.pipeline(resumed, [], checkpoint=CheckpointConfig(store))
        assert await clutch.resume_latest("r") == 4
        # no agent read the history while the run went on: the earlier entries are read now
        assert self.what_each_step_saw(kept + resumed) == self.expected()


class TestModelHistory:
    """The history holds a pydantic model's ``model_dump()``, as eggai-clutch's does (a date
    stays a date), in a plain run and in a resumed one, whose entries come from the store."""

    @staticmethod
    def pipeline(histories: list[Any], fail: list[bool], **options: Any) -> Clutch:
        clutch = Clutch("dated", **options)

        @clutch.agent()
        async def draft(data: Dated) -> Dated:
            return data.model_copy(update={"text": "draft"})

        @clutch.agent()
        async def review(data: Dated) -> Dated:
            histories.append(list(get_context().state.history))
            if fail and fail.pop():
                raise ValueError("failed on purpose")
            return data.model_copy(update={"text": "reviewed"})

        @clutch.agent()
        async def publish(data: Dated) -> Dated:
            histories.append(list(get_context().state.history))
            return data

        return clutch

    async def test_the_entries_are_model_dumps_in_plain_and_resumed_runs(self) -> None:
        given = Dated(text="in", on=date(2024, 1, 2), ticket=Ticket(text="t"))
        dumped = {"on": date(2024, 1, 2), "ticket": {"text": "t"}}
        inputs = [
            entry("input", {"text": "in", **dumped}),
            entry("draft", {"text": "draft", **dumped}),
        ]
        result = {"text": "reviewed", **dumped}
        plain: list[Any] = []
        assert await self.pipeline(plain, []).run(given) == result
        assert plain == [inputs[:1], inputs]  # what review, then publish, saw
        store = MemoryCheckpointStorage()
        failing = self.pipeline([], [True], checkpoint=CheckpointConfig(store))
        with pytest.raises(ValueError, match="on purpose"):
            await failing.run(given, run_id="r")
        resumed: list[Any] = []
        clutch = self.pipeline(resumed, [], checkpoint=CheckpointConfig(store))
        assert await clutch.resume_latest("r") == result
        assert resumed == plain


class TestStateObjects:
    def test_next_appends_the_previous_data_and_counts_a_turn(self) -> None:
        ctx = ClutchContext("in", state=ClutchState("run-1", "sequential", ["a", "b"]))
        after = ctx.next("a", "out_a").next("b", "out_b")
        assert (after.data, after.source, after.state.turn) == ("out_b", "b", 2)
        assert after.state.history == [entry("input", "in"), entry("a", "out_a")]
        assert (after.run_id, after.state.strategy, after.state.members) == (
            "run-1",
            "sequential",
            ["a", "b"],
        )
        assert (ctx.data, ctx.source, ctx.state.turn, ctx.state.history) == ("in", "input", 0, [])

    def test_a_context_read_after_later_steps_says_what_its_step_saw(self) -> None:
        contexts = steps(ClutchContext(0), range(1, 6))
        expected = [entry("input", 0)] + [entry("a", n) for n in range(1, 5)]
        for ctx in [*contexts[::2], *reversed(contexts)]:  # out of order, each twice or more
            turn = ctx.state.turn
            assert (ctx.data, ctx.state.history) == (turn, expected[:turn])
            assert ctx.source == ("a" if turn else "input")

    def test_the_current_steps_share_one_history_list(self) -> None:
        ctx = ClutchContext(0)
        history = ctx.state.history
        for output in range(1, 1001):
            ctx = ctx.next("a", output)
        assert ctx.state.history is history and len(history) == 1000

    def test_a_context_followed_twice_goes_two_ways(self) -> None:
        first, second = steps(ClutchContext("in"), range(1, 2))
        third = second.next("a", "x")
        other = second.next("b", "y")  # second was followed already
        assert third.state.history == [entry("input", "in"), entry("a", 1)]
        assert other.state.history == [entry("input", "in"), entry("a", 1)]
        assert other.next("c", "z").state.history[-1] == entry("b", "y")
        assert third.next("c", "z").state.history[-1] == entry("a", "x")
        assert first.state.history == [] and second.state.history == [entry("input", "in")]

    def test_metadata_is_copied_to_the_next_step(self) -> None:
        ctx = ClutchContext("in", metadata={"tokens": 1})
        after = ctx.next("a", "out")
        after.metadata["tokens"] = 2
        ctx.metadata["late"] = True
        assert ctx.metadata == {"tokens": 1, "late": True}
        assert after.metadata == {"tokens": 2}
        assert after.next("b", "x").metadata == {"tokens": 2}

    def test_the_history_holds_a_models_dump(self) -> None:
        after = ClutchContext(Ticket(text="hi")).next("a", Ticket(text="re"))
        assert after.state.history == [entry("input", {"text": "hi"})]
        assert after.data == Ticket(text="re")

    def test_model_dump_is_a_copy(self) -> None:
        state = ClutchState("run-1", "graph", ["a"], turn=1, history=[{"source": "x", "data": 1}])
        dumped = state.model_dump()
        assert dumped == {
            "clutch_id": "run-1",
            "strategy": "graph",
            "members": ["a"],
            "turn": 1,
            "history": [{"source": "x", "data": 1}],
        }
        dumped["history"].append({})
        dumped["members"].append("z")
        assert len(state.history) == 1 and state.members == ["a"]

    def test_to_dict(self) -> None:
        state = ClutchState("run-1", "sequential", ["a"])
        ctx = ClutchContext(data={"k": 1}, source="a", state=state, metadata={"m": 2})
        assert ctx.to_dict() == {
            "data": {"k": 1},
            "source": "a",
            "state": state.model_dump(),
            "metadata": {"m": 2},
        }
        assert ctx.run_id == "run-1"

    def test_defaults(self) -> None:
        state = ClutchState("run-1", "sequential", [])
        ctx = ClutchContext(data=None, source="input", state=state)
        assert state.turn == 0 and state.history == []
        assert ctx.metadata == {}


class TestBuiltLikeEggaiClutch:
    """The constructors take eggai-clutch 0.2.2's defaults, so an agent's unit test builds
    the context it gives the agent (with ``set_context``) as it did there."""

    def test_a_state_with_no_arguments(self) -> None:
        state = ClutchState()
        assert (state.strategy, state.members, state.turn, state.history) == (
            "sequential",
            [],
            0,
            [],
        )
        assert len(state.clutch_id) == 32 and int(state.clutch_id, 16) >= 0
        assert ClutchState().clutch_id != state.clutch_id

    def test_a_state_copies_the_history_it_is_given(self) -> None:
        given = [{"source": "input", "data": 1}]
        state = ClutchState(clutch_id="r", strategy="graph", members=["a"], turn=1, history=given)
        state.history.append({"source": "a", "data": 2})
        assert given == [{"source": "input", "data": 1}] and len(state.history) == 2

    def test_a_context_of_data_alone(self) -> None:
        ctx = ClutchContext({"key": "value"})
        assert ctx.data == {"key": "value"} and ctx.source == "input"
        assert ctx.metadata == {} and ctx.state.turn == 0 and ctx.state.history == []
        assert ctx.run_id == ctx.state.clutch_id

    def test_to_dict_dumps_a_model_and_from_dict_takes_it_back(self) -> None:
        state = ClutchState(clutch_id="r", members=["a"], turn=2, history=[{"source": "x"}])
        ctx = ClutchContext(Ticket(text="hi"), "a", state, {"m": 1})
        raw = ctx.to_dict()
        assert raw["data"] == {"text": "hi"} and raw["source"] == "a"
        back = ClutchContext.from_dict(raw)
        assert back.to_dict() == raw
        assert ClutchContext.from_dict({**raw, "metadata": None}).metadata == {}
        del raw["metadata"]
        assert ClutchContext.from_dict(raw).metadata == {}

    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            ({"data": 1}, "no 'source', 'state'"),
            ({"data": 1, "source": "a", "state": ["x"]}, "got a list"),
            ({"data": 1, "source": "a", "state": {"turns": 1}}, "unknown keys \\['turns'\\]"),
        ],
    )
    def test_from_dict_names_what_is_wrong(self, raw: dict[str, Any], message: str) -> None:
        with pytest.raises(ConfigurationError, match=message):
            ClutchContext.from_dict(raw)

    async def test_an_agent_tested_alone_reads_the_context_it_is_given(self) -> None:
        async def agent(data: str) -> str:
            ctx = get_context()
            return f"{data} by {ctx.metadata['user']} at turn {ctx.state.turn}"

        set_context(ClutchContext("hello", metadata={"user": "u1"}))
        try:
            assert await agent("hi") == "hi by u1 at turn 0"
        finally:
            set_context(None)


class TestDeferredHistory:
    EARLIER = (entry("input", 0), entry("a", 1))

    def deferred(self, reads: list[int]) -> ClutchState:
        state = ClutchState("run", "sequential", ["a"], turn=2)

        def earlier() -> list[dict[str, Any]]:
            reads.append(1)
            return list(self.EARLIER)

        state.defer_history(earlier)
        return state

    def test_deferred_entries_are_read_once_on_first_use_and_come_first(self) -> None:
        reads: list[int] = []
        state = ClutchContext(2, "a", self.deferred(reads)).next("a", 3).state
        assert reads == []
        assert state.history == [*self.EARLIER, entry("a", 2)]
        assert len(state.history) == 3 and state.turn == 3
        assert reads == [1]

    @pytest.mark.parametrize("order", ["oldest first", "newest first"])
    def test_contexts_of_a_resumed_run_read_the_deferred_entries_before_their_own(
        self, order: str
    ) -> None:
        reads: list[int] = []
        contexts = steps(ClutchContext(2, "a", self.deferred(reads)), range(3, 6))
        if order == "newest first":
            contexts.reverse()
        for ctx in contexts:
            mine = [entry("a", n) for n in range(2, ctx.data)]
            assert ctx.state.history == [*self.EARLIER, *mine]
        assert reads == [1]

    def test_a_failed_read_of_deferred_entries_fails_again_instead_of_dropping_them(
        self,
    ) -> None:
        state = ClutchState("run", "sequential", ["a"])
        outcomes: list[Any] = [ValueError("damaged"), [entry("input", 0)]]

        def earlier() -> list[dict[str, Any]]:
            outcome = outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return list(outcome)

        state.defer_history(earlier)
        first = ClutchContext(1, "a", state)
        after = first.next("a", 2)
        with pytest.raises(ValueError, match="damaged"):
            _ = first.state.history
        assert after.state.history == [entry("input", 0), entry("a", 1)]
        assert first.state.history == [entry("input", 0)]

    def test_assigning_the_history_drops_deferred_entries(self) -> None:
        state = ClutchState("run", "sequential", ["a"])
        state.defer_history(lambda: [entry("input", 0)])
        state.history = [entry("x", 1)]
        assert state.history == [entry("x", 1)]
        assert state.model_dump()["history"] == [entry("x", 1)]
