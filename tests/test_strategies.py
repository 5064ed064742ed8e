"""The four strategies: which agent runs next, Terminate, Handover and max_turns.

Each behaviour is checked through a real Clutch run; the cursor objects are also checked
directly (their position is what a checkpoint stores).
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from nestegg import Clutch, Handover, Strategy, Terminate, get_context, handover
from nestegg.errors import ConfigurationError, IncompatibleCheckpointError
from nestegg.strategies import (
    Cursor,
    GraphCursor,
    OrderCursor,
    SelectorCursor,
    Undecided,
    make_cursor,
    upcoming_at,
)


class Route(BaseModel):
    route: str


def recording_agents(clutch: Clutch, names: list[str], log: list[str], **edges: list[str]) -> None:
    """Register agents that append their name to ``log`` and tag the data with it."""
    for name in names:

        async def agent(data: Any, _name: str = name) -> Any:
            log.append(_name)
            return f"{data}>{_name}"

        agent.__name__ = name
        clutch.agent(edges=edges.get(name))(agent)


class TestStrategyEnum:
    def test_values_match_eggai_clutch(self) -> None:
        assert Strategy.SEQUENTIAL.value == "sequential"
        assert Strategy.ROUND_ROBIN.value == "round_robin"
        assert Strategy.GRAPH.value == "graph"
        assert Strategy.SELECTOR.value == "selector"

    def test_there_are_exactly_four(self) -> None:
        assert len(list(Strategy)) == 4

    def test_default_strategy_is_sequential(self) -> None:
        assert Clutch("p").strategy is Strategy.SEQUENTIAL


class TestSequential:
    async def test_single_agent(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def tag(data: str) -> str:
            return data + "_a"

        assert await clutch.run("input") == "input_a"

    async def test_agents_run_once_each_in_registration_order(self) -> None:
        log: list[str] = []
        clutch = Clutch("p")
        recording_agents(clutch, ["a", "b", "c"], log)
        assert await clutch.run("in") == "in>a>b>c"
        assert log == ["a", "b", "c"]

    async def test_each_agent_gets_the_previous_output(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def double(data: int) -> int:
            return data * 2

        @clutch.agent()
        async def add_ten(data: int) -> int:
            return data + 10

        assert await clutch.run(5) == 20

    async def test_no_agents_returns_the_input(self) -> None:
        assert await Clutch("p").run({"x": 1}) == {"x": 1}

    async def test_terminate_without_result_keeps_the_current_data(self) -> None:
        log: list[str] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            return "from_a"

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            raise Terminate()

        @clutch.agent()
        async def c(data: str) -> str:
            log.append("c")
            return data

        assert await clutch.run("in") == "from_a"
        assert log == ["a", "b"]

    async def test_terminate_with_result_returns_it(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            raise Terminate("final_result")

        @clutch.agent()
        async def b(data: str) -> str:
            return data

        assert await clutch.run("in") == "final_result"

    async def test_handover_jumps_forward(self) -> None:
        log: list[str] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("c")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        @clutch.agent()
        async def c(data: str) -> str:
            log.append("c")
            return data + "_c"

        assert await clutch.run("in") == "in_c"
        assert log == ["a", "c"]

    async def test_handover_with_data_replaces_the_data(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            raise Handover("b", "modified")

        @clutch.agent()
        async def b(data: str) -> str:
            return data + "_processed"

        assert await clutch.run("in") == "modified_processed"

    async def test_handover_function_is_the_same_signal(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            handover("c", "via_function")

        @clutch.agent()
        async def b(data: str) -> str:
            return "b_ran"

        @clutch.agent()
        async def c(data: str) -> str:
            return data + "_c"

        assert await clutch.run("in") == "via_function_c"

    async def test_handover_backwards_continues_in_order_from_there(self) -> None:
        log: list[str] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: int) -> int:
            log.append("a")
            return data + 1

        @clutch.agent()
        async def b(data: int) -> int:
            log.append("b")
            if data < 3:
                raise Handover("a", data)
            return data

        assert await clutch.run(0) == 3
        assert log == ["a", "b", "a", "b", "a", "b"]

    async def test_handover_to_unknown_agent_stops(self) -> None:
        log: list[str] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("nonexistent", "last")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        assert await clutch.run("in") == "last"
        assert log == ["a"]

    async def test_handover_to_agent_outside_explicit_order_stops(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", order=["a", "b"])

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("outside")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        @clutch.agent()
        async def outside(data: str) -> str:
            log.append("outside")
            return data

        assert await clutch.run("in") == "in"
        assert log == ["a"]

    async def test_max_turns_bounds_a_handover_loop(self) -> None:
        count = 0
        clutch = Clutch("p", max_turns=3)

        @clutch.agent()
        async def a(data: str) -> str:
            nonlocal count
            count += 1
            raise Handover("a", data)

        await clutch.run("in")
        assert count == 3

    async def test_max_turns_zero_runs_nothing(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", max_turns=0)
        recording_agents(clutch, ["a"], log)
        assert await clutch.run("in") == "in"
        assert log == []

    async def test_max_turns_stops_a_long_pipeline(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", max_turns=2)
        recording_agents(clutch, ["a", "b", "c"], log)
        assert await clutch.run("in") == "in>a>b"
        assert log == ["a", "b"]


class TestRoundRobin:
    async def test_cycles_through_agents_until_max_turns(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=6)
        recording_agents(clutch, ["a", "b"], log)
        assert await clutch.run("in") == "in>a>b>a>b>a>b"
        assert log == ["a", "b", "a", "b", "a", "b"]

    async def test_single_agent_repeats(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=3)

        @clutch.agent()
        async def inc(data: int) -> int:
            return data + 1

        assert await clutch.run(0) == 3

    async def test_default_max_turns_is_100(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN)

        @clutch.agent()
        async def inc(data: int) -> int:
            return data + 1

        assert clutch.max_turns == 100
        assert await clutch.run(0) == 100

    async def test_terminate_stops_cycling(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=100)

        @clutch.agent()
        async def counter(data: int) -> int:
            if data + 1 >= 3:
                raise Terminate("done")
            return data + 1

        assert await clutch.run(0) == "done"

    async def test_handover_moves_the_rotation(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=4)

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            if len(log) == 1:
                raise Handover("c")
            raise Terminate()

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        @clutch.agent()
        async def c(data: str) -> str:
            log.append("c")
            return data

        await clutch.run("in")
        # a hands over to c; after c the rotation wraps around to a, which terminates.
        assert log == ["a", "c", "a"]

    async def test_handover_to_unknown_agent_stops(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=10)

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("ghost")

        await clutch.run("in")
        assert log == ["a"]

    async def test_explicit_order_sets_the_rotation(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=4, order=["b", "a"])
        recording_agents(clutch, ["a", "b"], log)
        await clutch.run("in")
        assert log == ["b", "a", "b", "a"]


class TestSelector:
    async def test_routes_to_the_selected_agents(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR, max_turns=3)

        @clutch.selector
        async def select(data: str) -> str | None:
            return {"input": "a", "from_a": "b"}.get(data)

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            return "from_a"

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return "from_b"

        assert await clutch.run("input") == "from_b"
        assert log == ["a", "b"]

    async def test_selector_sees_each_current_data(self) -> None:
        seen: list[Any] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector()
        async def select(data: int) -> str | None:
            seen.append(data)
            return "inc" if data < 3 else None

        @clutch.agent()
        async def inc(data: int) -> int:
            return data + 1

        assert await clutch.run(0) == 3
        assert seen == [0, 1, 2, 3]

    async def test_none_stops(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def select(data: str) -> str | None:
            return "a" if data == "input" else None

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            return "done"

        assert await clutch.run("input") == "done"
        assert log == ["a"]

    async def test_unknown_agent_stops_before_any_step(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def select(data: str) -> str:
            return "nonexistent"

        recording_agents(clutch, ["a"], log)
        assert await clutch.run("input") == "input"
        assert log == []

    async def test_without_selector_nothing_runs(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR)
        recording_agents(clutch, ["a"], log)
        assert await clutch.run("input") == "input"
        assert log == []

    async def test_typed_selector_gets_a_model(self) -> None:
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def select(data: Route) -> str | None:
            return data.route if isinstance(data, Route) else None

        @clutch.agent()
        async def handler_a(data: Any) -> str:
            return "handled_a"

        assert await clutch.run({"route": "handler_a"}) == "handled_a"

    async def test_terminate_stops_the_loop(self) -> None:
        clutch = Clutch("p", strategy=Strategy.SELECTOR, max_turns=100)

        @clutch.selector
        async def select(data: int) -> str:
            return "inc"

        @clutch.agent()
        async def inc(data: int) -> int:
            if data + 1 >= 3:
                raise Terminate("done")
            return data + 1

        assert await clutch.run(0) == "done"

    async def test_handover_forces_the_next_agent_past_the_selector(self) -> None:
        log: list[str] = []
        selector_calls = 0
        clutch = Clutch("p", strategy=Strategy.SELECTOR, max_turns=3)

        @clutch.selector
        async def select(data: str) -> str:
            nonlocal selector_calls
            selector_calls += 1
            return "a"

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("b")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            raise Terminate()

        await clutch.run("in")
        assert log == ["a", "b"]
        assert selector_calls == 1

    async def test_handover_to_unknown_agent_stops(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def select(data: str) -> str:
            return "a"

        @clutch.agent()
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("nonexistent")

        await clutch.run("in")
        assert log == ["a"]

    async def test_max_turns_bounds_an_endless_selection(self) -> None:
        count = 0
        clutch = Clutch("p", strategy=Strategy.SELECTOR, max_turns=5)

        @clutch.selector
        async def always_a(data: str) -> str:
            return "a"

        @clutch.agent()
        async def a(data: str) -> str:
            nonlocal count
            count += 1
            return data

        await clutch.run("in")
        assert count == 5

    async def test_selector_error_fails_the_run(self) -> None:
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def select(data: str) -> str:
            raise LookupError("no route")

        with pytest.raises(LookupError, match="no route"):
            await clutch.run("in")

    async def test_selector_can_read_the_context(self) -> None:
        turns: list[int] = []
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def select(data: str) -> str | None:
            turn = get_context().state.turn
            turns.append(turn)
            return "a" if turn < 2 else None

        @clutch.agent()
        async def a(data: str) -> str:
            return data

        await clutch.run("in")
        assert turns == [0, 1, 2]


class TestGraph:
    async def test_follows_edges(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH)
        recording_agents(clutch, ["a", "b", "c"], log, a=["b"], b=["c"])
        assert await clutch.run("in") == "in>a>b>c"
        assert log == ["a", "b", "c"]

    async def test_agent_without_edges_ends_the_run(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH)
        recording_agents(clutch, ["a", "b", "c"], log, a=["b"])
        await clutch.run("in")
        assert log == ["a", "b"]

    async def test_takes_the_first_edge(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH)
        recording_agents(clutch, ["a", "b", "c"], log, a=["b", "c"])
        await clutch.run("in")
        assert log == ["a", "b"]

    async def test_starts_at_the_first_agent_of_the_explicit_order(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH, order=["c", "a", "b"])
        recording_agents(clutch, ["a", "b", "c"], log, c=["a"])
        await clutch.run("in")
        assert log == ["c", "a"]

    async def test_terminate_stops_traversal(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["b"])
        async def a(data: str) -> str:
            log.append("a")
            raise Terminate("early_exit")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        assert await clutch.run("in") == "early_exit"
        assert log == ["a"]

    async def test_handover_overrides_edges(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["b"])
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("c")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        @clutch.agent()
        async def c(data: str) -> str:
            log.append("c")
            return data

        await clutch.run("in")
        assert log == ["a", "c"]

    async def test_handover_with_data(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["b"])
        async def a(data: str) -> str:
            raise Handover("b", "new_data")

        @clutch.agent()
        async def b(data: str) -> str:
            return data + "_done"

        assert await clutch.run("in") == "new_data_done"

    async def test_handover_to_unknown_agent_stops(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["b"])
        async def a(data: str) -> str:
            log.append("a")
            raise Handover("ghost")

        @clutch.agent()
        async def b(data: str) -> str:
            log.append("b")
            return data

        await clutch.run("in")
        assert log == ["a"]

    async def test_cycle_is_bounded_by_max_turns(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH, max_turns=7)

        @clutch.agent(edges=["pong"])
        async def ping(data: int) -> int:
            return data + 1

        @clutch.agent(edges=["ping"])
        async def pong(data: int) -> int:
            return data + 1

        assert await clutch.run(0) == 7

    async def test_empty_graph_returns_the_input(self) -> None:
        assert await Clutch("p", strategy=Strategy.GRAPH).run("in") == "in"

    async def test_edge_to_a_missing_agent_is_a_configuration_error(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["missing"])
        async def a(data: str) -> str:
            return data

        with pytest.raises(ConfigurationError, match=r"'a'.*'missing'"):
            await clutch.run("in")


class TestCursors:
    def test_make_cursor_picks_the_cursor_of_each_strategy(self) -> None:
        agents = {"a": object()}
        sequential = make_cursor(Strategy.SEQUENTIAL, ["a"], agents, None)
        round_robin = make_cursor(Strategy.ROUND_ROBIN, ["a"], agents, None)
        assert isinstance(sequential, OrderCursor) and not sequential.wrap
        assert isinstance(round_robin, OrderCursor) and round_robin.wrap
        assert isinstance(make_cursor(Strategy.GRAPH, ["a"], agents, None), GraphCursor)
        assert isinstance(make_cursor(Strategy.SELECTOR, ["a"], agents, None), SelectorCursor)

    async def test_sequential_position_names_the_next_agent(self) -> None:
        cursor = OrderCursor(["a", "b"], {"a": 1, "b": 2}, wrap=False)
        assert cursor.position() == {"index": 0, "agent": "a"}
        assert cursor.completed("a")
        assert cursor.position() == {"index": 1, "agent": "b"}
        cursor.completed("b")
        assert cursor.position() == {"index": 2, "agent": None}
        assert await cursor.next_agent(None) is None

    async def test_round_robin_wraps_and_keeps_counting(self) -> None:
        cursor = OrderCursor(["a", "b"], {"a": 1, "b": 2}, wrap=True)
        names = []
        for _ in range(5):
            name = await cursor.next_agent(None)
            assert name is not None
            names.append(name)
            cursor.completed(name)
        assert names == ["a", "b", "a", "b", "a"]
        assert cursor.position() == {"index": 5, "agent": "b"}

    async def test_order_restore_follows_the_named_agent_when_the_order_changed(self) -> None:
        cursor = OrderCursor(["a", "new", "b"], {"a": 1, "new": 2, "b": 3}, wrap=False)
        cursor.restore({"index": 1, "agent": "b"})
        assert await cursor.next_agent(None) == "b"

    async def test_round_robin_restore_keeps_the_rotation(self) -> None:
        cursor = OrderCursor(["a", "b", "c"], {"a": 1, "b": 2, "c": 3}, wrap=True)
        cursor.restore({"index": 7, "agent": "b"})
        assert await cursor.next_agent(None) == "b"

    def test_order_restore_of_a_lost_agent_is_incompatible(self) -> None:
        cursor = OrderCursor(["a"], {"a": 1}, wrap=False)
        with pytest.raises(IncompatibleCheckpointError, match="'gone'") as lost:
            cursor.restore({"index": 1, "agent": "gone"})
        assert lost.value.agent == "gone"

    def test_order_handover_only_to_agents_in_the_order(self) -> None:
        cursor = OrderCursor(["a", "b"], {"a": 1, "b": 2, "extra": 3}, wrap=False)
        assert cursor.handover("b")
        assert cursor.index == 1
        assert not cursor.handover("extra")
        assert not cursor.handover("ghost")

    async def test_graph_position_round_trips(self) -> None:
        node = type("Node", (), {"edges": ["b"]})()
        agents = {"a": node, "b": type("Node", (), {"edges": []})()}
        cursor = GraphCursor(["a", "b"], agents)
        assert cursor.position() == {"node": "a"}
        assert cursor.completed("a")
        assert cursor.position() == {"node": "b"}
        fresh = GraphCursor(["a", "b"], agents)
        fresh.restore(cursor.position())
        assert await fresh.next_agent(None) == "b"
        assert not fresh.completed("b")
        assert await fresh.next_agent(None) is None

    def test_graph_restore_of_a_lost_node_is_incompatible(self) -> None:
        cursor = GraphCursor(["a"], {"a": object()})
        with pytest.raises(IncompatibleCheckpointError, match="'gone'") as lost:
            cursor.restore({"node": "gone"})
        assert lost.value.agent == "gone"

    async def test_selector_forced_agent_survives_a_restore(self) -> None:
        async def never(data: Any) -> str | None:
            return None

        cursor = SelectorCursor({"a": 1, "b": 2}, never)
        assert cursor.handover("b")
        assert cursor.position() == {"forced": "b"}
        fresh = SelectorCursor({"a": 1, "b": 2}, never)
        fresh.restore(cursor.position())
        assert await fresh.next_agent(None) == "b"
        assert await fresh.next_agent(None) is None

    async def test_the_selector_is_asked_with_the_data_next_agent_is_given(self) -> None:
        asked: list[Any] = []

        async def choose(data: Any) -> str | None:
            asked.append(data)
            return "b" if data == "to b" else "ghost"

        cursor = SelectorCursor({"a": 1, "b": 2}, choose)
        assert await cursor.next_agent("to b") == "b"
        assert await cursor.next_agent({"k": 1}) is None  # an unknown name stops
        assert asked == ["to b", {"k": 1}]

    def test_selector_restore_of_a_lost_agent_is_incompatible(self) -> None:
        cursor = SelectorCursor({"a": 1}, None)
        with pytest.raises(IncompatibleCheckpointError, match="'gone'") as lost:
            cursor.restore({"forced": "gone"})
        assert lost.value.agent == "gone"

    async def test_upcoming_is_the_agent_next_agent_gives_and_a_stored_position_says_it(
        self,
    ) -> None:
        async def choose(data: Any) -> str | None:
            return "a"

        leaf = type("Node", (), {"edges": []})()
        agents = {"a": type("Node", (), {"edges": ["b"]})(), "b": leaf}
        cursors: list[tuple[Cursor, list[str | None]]] = [
            (OrderCursor(["a", "b"], agents, wrap=False), ["a", "b", None]),
            (OrderCursor(["a", "b"], agents, wrap=True), ["a", "b", "a"]),
            (GraphCursor(["a", "b"], agents), ["a", "b", None]),
        ]
        for cursor, expected in cursors:
            seen = []
            for _ in range(3):
                upcoming = cursor.upcoming()
                assert upcoming == upcoming_at(cursor.position())
                assert await cursor.next_agent(None) == upcoming
                seen.append(upcoming)
                if upcoming is None:
                    break
                cursor.completed(upcoming)
            assert seen == expected
        selector = SelectorCursor(agents, choose)
        assert selector.upcoming() is upcoming_at({"forced": None}) is Undecided.SELECTOR
        selector.handover("b")
        assert selector.upcoming() == upcoming_at(selector.position()) == "b"
        assert SelectorCursor(agents, None).upcoming() is None  # no selector: it stops
        assert upcoming_at(None) is None and upcoming_at({}) is None
