"""Clutch: definition, definition errors, hooks, streaming and whole pipelines."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from nestegg import Clutch, Handover, StepEvent, Strategy, Terminate, get_context
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.constants import DEFAULT_DB_NAME, HOME_ENV, MAX_NAME_LENGTH
from nestegg.errors import ConfigurationError, InvalidIdentifierError, NestEggError


class Request(BaseModel):
    query: str
    limit: int = 10


class Response(BaseModel):
    results: list[str]


class Item(BaseModel):
    name: str
    price: float


async def echo(data: Any) -> Any:
    return data


class TestRegistration:
    def test_agent_with_parentheses(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def my_agent(data: Any) -> Any:
            return data

        assert clutch.agent_names == ("my_agent",)
        assert clutch.run_order == ["my_agent"]

    async def test_agent_without_parentheses(self) -> None:
        clutch = Clutch("p")

        @clutch.agent
        async def shout(data: str) -> str:
            return data.upper()

        assert clutch.agent_names == ("shout",)
        assert await clutch.run("hi") == "HI"

    def test_decorator_returns_the_function_unchanged(self) -> None:
        clutch = Clutch("p")

        async def plain(data: Any) -> Any:
            return data

        assert clutch.agent()(plain) is plain
        assert clutch.agent(plain) is plain

    def test_registration_order_is_kept(self) -> None:
        clutch = Clutch("p")
        for name in ("b", "a", "c"):

            async def agent(data: Any) -> Any:
                return data

            agent.__name__ = name
            clutch.agent(agent)
        assert clutch.agent_names == ("b", "a", "c")
        assert clutch.run_order == ["b", "a", "c"]

    async def test_two_functions_of_one_name_are_refused(self) -> None:
        # Two modules' functions named alike: the second silently replaced the first, and
        # a two-agent SEQUENTIAL pipeline ran one step.
        clutch = Clutch("p", strategy=Strategy.SEQUENTIAL)

        def named(module: str, value: int) -> Any:
            async def step(data: Any) -> int:
                return value

            step.__module__, step.__qualname__ = module, "step"
            return step

        clutch.agent()(named("pkg.fetch", 1))
        with pytest.raises(ConfigurationError) as caught:
            clutch.agent(named("pkg.store", 2))
        message = str(caught.value)
        assert "agent name 'step'" in message
        assert "pkg.fetch.step" in message and "pkg.store.step" in message
        assert "rename one of the two functions" in message
        assert clutch.agent_names == ("step",)
        assert await clutch.run("in") == 1  # the first one stays, unchanged

    def test_a_name_taken_through_either_form_of_the_decorator_is_refused(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent
        async def a(data: Any) -> Any:
            return data

        async def other(data: Any) -> Any:
            return data

        other.__name__ = "a"
        for register in (clutch.agent, clutch.agent(), clutch.agent(["a"])):
            with pytest.raises(ConfigurationError, match="agent name 'a' is taken"):
                register(other)
        assert clutch.agent_names == ("a",)

    def test_one_function_registered_again_with_other_edges_is_refused(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH)
        clutch.agent(["b"])(echo)
        clutch.agent(["b"])(echo)  # the same registration again: nothing changes
        with pytest.raises(ConfigurationError) as caught:
            clutch.agent(["c"])(echo)
        assert str(caught.value) == (
            "function tests.test_clutch.echo is registered as agent 'echo' on Clutch 'p' "
            "already, with edges ['b']: register it once, with all its edges (not ['c'] again)"
        )
        assert clutch.agent_names == ("echo",)

    async def test_a_function_redefined_replaces_its_agent_in_place(self) -> None:
        # a notebook cell run again defines a new function of the same module and qualname
        cell = "async def step(data):\n    return data + [{!r}]\n"

        def run_cell(value: str) -> Any:
            namespace: dict[str, Any] = {"__name__": "notebook"}
            exec(cell.format(value), namespace)
            return namespace["step"]

        clutch = Clutch("p", strategy=Strategy.GRAPH)
        clutch.agent(["b"])(run_cell("old"))
        clutch.agent()(echo)
        clutch.agent(["echo"])(run_cell("new"))  # its edges as redefined
        assert clutch.agent_names == ("step", "echo")
        assert await clutch.run([]) == ["new"]

    async def test_a_selector_redefined_replaces_the_selector(self) -> None:
        cell = "async def choose(data):\n    return {!r} if data == [] else None\n"

        def run_cell(target: str) -> Any:
            namespace: dict[str, Any] = {"__name__": "notebook"}
            exec(cell.format(target), namespace)
            return namespace["choose"]

        clutch = Clutch("p", strategy=Strategy.SELECTOR, max_turns=2)
        clutch.agent(echo)

        @clutch.agent
        async def tag(data: Any) -> Any:
            return [*data, "tagged"]

        clutch.selector(run_cell("echo"))
        clutch.selector(run_cell("tag"))  # the cell run again: it replaces the selector
        assert await clutch.run([]) == ["tagged"]

    async def test_a_module_reloaded_replaces_its_agents(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        source = tmp_path / "reloaded_agents.py"
        source.write_text("async def step(data):\n    return 'old'\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        clutch = Clutch("p")
        try:
            module = importlib.import_module("reloaded_agents")
            clutch.agent()(module.step)
            source.write_text("async def step(data):\n    return 'new, reloaded'\n")
            clutch.agent()(importlib.reload(module).step)
        finally:
            sys.modules.pop("reloaded_agents", None)
        assert clutch.agent_names == ("step",)
        assert await clutch.run("in") == "new, reloaded"

    def test_two_functions_made_by_one_definition_are_refused(self) -> None:
        def made(value: int) -> Any:
            async def step(data: Any) -> int:
                return value

            return step

        clutch = Clutch("p", strategy=Strategy.SEQUENTIAL)
        clutch.agent()(made(1))
        with pytest.raises(ConfigurationError) as caught:
            clutch.agent()(made(2))
        name = f"tests.test_clutch.{made(0).__qualname__}"
        assert str(caught.value) == (
            f"agent name 'step' is taken on Clutch 'p' by {name}; another function that "
            "definition made has the same name and would replace it: an agent is named by "
            "its function's __name__, so give each its own"
        )
        assert clutch.agent_names == ("step",)

    async def test_edges_are_followed(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH)
        for name, edges in (("a", ["c"]), ("b", None), ("c", None)):

            async def agent(data: str, name: str = name) -> str:
                return data + name

            agent.__name__ = name
            clutch.agent(edges)(agent)
        assert await clutch.run(">") == ">ac"  # a's edge skips b

    async def test_selector_with_and_without_parentheses(self) -> None:
        first = Clutch("p", strategy=Strategy.SELECTOR, max_turns=1)
        second = Clutch("p", strategy=Strategy.SELECTOR, max_turns=1)
        picked: list[Any] = []

        async def pick(data: Request) -> str:
            picked.append(data)
            return "echo"

        async def pick_untyped(data: Any) -> str:
            picked.append(data)
            return "echo"

        assert first.selector()(pick) is pick
        assert second.selector(pick_untyped) is pick_untyped
        for clutch in (first, second):
            clutch.agent(echo)
            await clutch.run({"query": "q"})
        assert picked == [Request(query="q"), {"query": "q"}]

    async def test_a_second_selector_is_refused(self) -> None:
        # It silently replaced the first: the pipeline picked its agents with another.
        clutch = Clutch("p", strategy=Strategy.SELECTOR, max_turns=1)

        async def first(data: Any) -> str:
            return "echo"

        async def second(data: Any) -> str | None:
            return None

        clutch.agent(echo)
        clutch.selector(first)
        clutch.selector()(first)  # the same function again: nothing changes
        with pytest.raises(ConfigurationError) as caught:
            clutch.selector(second)
        prefix = "tests.test_clutch.TestRegistration.test_a_second_selector_is_refused.<locals>"
        assert str(caught.value) == (
            f"Clutch 'p' has a selector already, {prefix}.first; {prefix}.second would "
            "replace it: a Clutch has one selector, so register only one"
        )
        assert await clutch.run("in") == "in"  # the first one picks, unchanged

    def test_attributes(self) -> None:
        clutch = Clutch("review", strategy=Strategy.ROUND_ROBIN, max_turns=7)
        assert clutch.name == "review"
        assert clutch.strategy is Strategy.ROUND_ROBIN
        assert clutch.max_turns == 7

    def test_to_typed_is_kept_for_compatibility(self) -> None:
        clutch = Clutch("p")
        data = {"query": "q"}
        assert clutch._to_typed(data, None) is data
        typed = clutch._to_typed(data, Request)
        assert isinstance(typed, Request) and typed.query == "q"
        assert clutch._to_typed(typed, Request) is typed
        assert clutch._to_typed("text", Request) == "text"

    async def test_async_with_returns_the_clutch(self) -> None:
        async with Clutch("p") as clutch:
            clutch.agent(echo)
            assert await clutch.run("x") == "x"

    async def test_a_clutch_runs_many_times_independently(self) -> None:
        clutch = Clutch("p")
        histories: list[int] = []

        @clutch.agent()
        async def a(data: int) -> int:
            return data + 1

        @clutch.agent()
        async def b(data: int) -> int:
            histories.append(len(get_context().state.history))
            return data * 10

        assert await clutch.run(1) == 20
        assert await clutch.run(2) == 30
        assert histories == [1, 1]


class TestDefinitionErrors:
    def test_strategy_must_be_a_strategy(self) -> None:
        with pytest.raises(ConfigurationError, match="'sequential'"):
            Clutch("p", strategy="sequential")  # type: ignore[arg-type]

    def test_transport_needs_checkpointing(self) -> None:
        with pytest.raises(ConfigurationError, match="transport= needs checkpoint"):
            Clutch("p", transport="redis://127.0.0.1:6379/0")

    @pytest.mark.parametrize("checkpoint", [True, False, "yes", 1, {"storage": None}])
    def test_checkpoint_must_be_a_checkpoint_config(self, checkpoint: Any) -> None:
        with pytest.raises(ConfigurationError) as caught:
            Clutch("p", checkpoint=checkpoint)
        message = str(caught.value)
        assert "checkpoint= must be a CheckpointConfig" in message
        assert f"got {checkpoint!r}" in message

    def test_a_store_or_url_as_checkpoint_is_pointed_to_checkpoint_config(self) -> None:
        with pytest.raises(ConfigurationError, match=r"CheckpointConfig\(storage=store\)"):
            Clutch("p", checkpoint=MemoryCheckpointStorage())  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"open_store\('sqlite:///x.db'\)"):
            Clutch("p", checkpoint="sqlite:///x.db")  # type: ignore[arg-type]

    @pytest.mark.parametrize("max_turns", [-1, 1.5, "3"])
    def test_max_turns_must_be_a_non_negative_int(self, max_turns: Any) -> None:
        with pytest.raises(ConfigurationError, match="max_turns"):
            Clutch("p", max_turns=max_turns)

    @pytest.mark.parametrize("max_turns", [True, False])
    def test_max_turns_is_not_a_bool(self, max_turns: bool) -> None:
        with pytest.raises(ConfigurationError) as refused:
            Clutch("p", max_turns=max_turns)
        assert str(refused.value) == (
            f"max_turns must be an int >= 0, got {max_turns!r} (a bool, not a number)"
        )

    @pytest.mark.parametrize("hook", ["on_request", "on_response", "on_step"])
    def test_hooks_must_be_async(self, hook: str) -> None:
        def not_async(*args: Any) -> None:
            return None

        with pytest.raises(ConfigurationError, match=hook):
            Clutch("p", **{hook: not_async})

    @pytest.mark.parametrize(
        ("hook", "arguments"),
        [
            ("on_request", "request"),
            ("on_response", "request, response"),
            ("on_step", "agent_name, input, output"),
            ("on_checkpoint", "info"),
        ],
    )
    def test_a_hook_that_cannot_take_its_arguments_is_refused_when_built(
        self, hook: str, arguments: str
    ) -> None:
        # an on_response of one parameter failed once the run had completed:
        # TypeError: hr() takes 1 positional argument but 2 were given
        async def hr(r: Any, s: Any, t: Any, u: Any) -> None:
            return None

        async def one(r: Any) -> None:
            return None

        taken = hr if arguments.count(",") == 0 else one
        with pytest.raises(ConfigurationError) as refused:
            Clutch("p", **{hook: taken})
        shown = "hr(r, s, t, u)" if taken is hr else "one(r)"
        assert (
            str(refused.value) == f"{hook} is awaited with ({arguments}), which {shown} cannot take"
        )

    async def test_a_hook_of_any_form_that_takes_its_arguments_is_taken(self) -> None:
        async def variadic(*args: Any) -> None:
            return None

        async def defaults(request: Any, response: Any = None, extra: int = 0) -> None:
            return None

        for hook in ("on_request", "on_response", "on_step", "on_checkpoint"):
            Clutch("p", **{hook: variadic})
        Clutch("p", on_request=defaults, on_response=defaults)

    def test_agent_must_be_async(self) -> None:
        clutch = Clutch("p")

        def sync_agent(data: Any) -> Any:
            return data

        with pytest.raises(ConfigurationError, match=r"'sync_agent'.*async"):
            clutch.agent()(sync_agent)
        assert clutch.agent_names == ()

    @pytest.mark.parametrize("given", [5, None, "echo", functools.partial(echo)])
    def test_an_agent_that_is_no_named_function_is_refused_naming_it(self, given: Any) -> None:
        clutch = Clutch("p")
        with pytest.raises(ConfigurationError) as refused:  # was AttributeError: __name__
            clutch.agent()(given)
        assert str(refused.value) == (
            "Clutch 'p': agent() registers an async function (async def), named by its "
            f"__name__; got {given!r}"
        )
        assert clutch.agent_names == ()

    async def test_selector_must_be_async(self) -> None:
        clutch = Clutch("p", strategy=Strategy.SELECTOR)

        def sync_select(data: Any) -> str:
            return "a"

        with pytest.raises(ConfigurationError, match=r"'sync_select'.*async"):
            clutch.selector(sync_select)  # type: ignore[arg-type]
        clutch.agent(echo)
        assert await clutch.run("in") == "in"  # no selector: no agent runs

    @pytest.mark.parametrize(
        "bad_name", ["a/b", "a\\b", "..", "up..here", "x" * (MAX_NAME_LENGTH + 1)]
    )
    def test_agent_names_are_validated(self, bad_name: str) -> None:
        clutch = Clutch("p")

        async def agent(data: Any) -> Any:
            return data

        agent.__name__ = bad_name
        with pytest.raises(InvalidIdentifierError):
            clutch.agent(agent)
        assert clutch.agent_names == ()

    def test_longest_allowed_agent_name(self) -> None:
        clutch = Clutch("p")

        async def agent(data: Any) -> Any:
            return data

        agent.__name__ = "x" * MAX_NAME_LENGTH
        clutch.agent(agent)
        assert clutch.agent_names == ("x" * MAX_NAME_LENGTH,)

    async def test_unknown_name_in_order_fails_at_start(self) -> None:
        ran: list[str] = []
        clutch = Clutch("pipe", order=["a", "ghost"])

        @clutch.agent()
        async def a(data: Any) -> Any:
            ran.append("a")
            return data

        with pytest.raises(ConfigurationError, match=r"'ghost'.*'pipe'"):
            await clutch.run("in")
        with pytest.raises(ConfigurationError, match="'ghost'"):
            await clutch.submit("in")
        with pytest.raises(ConfigurationError, match="'ghost'"):
            clutch.validate()
        assert ran == []

    async def test_unknown_edge_fails_at_start(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["b", "nowhere"])
        async def a(data: Any) -> Any:
            return data

        @clutch.agent()
        async def b(data: Any) -> Any:
            return data

        with pytest.raises(ConfigurationError, match=r"agent 'a'.*'nowhere'"):
            await clutch.run("in")

    async def test_round_robin_without_agents_fails_at_start(self) -> None:
        clutch = Clutch("idle", strategy=Strategy.ROUND_ROBIN)
        with pytest.raises(ConfigurationError, match="'idle'"):
            await clutch.run("in")

    async def test_stream_reports_definition_errors_too(self) -> None:
        clutch = Clutch("p", order=["ghost"])
        with pytest.raises(ConfigurationError, match="'ghost'"):
            async for _ in clutch.stream("in"):
                pass

    def test_configuration_error_is_a_nestegg_value_error(self) -> None:
        assert issubclass(ConfigurationError, NestEggError)
        assert issubclass(ConfigurationError, ValueError)

    def test_a_valid_definition_validates(self) -> None:
        clutch = Clutch("p", strategy=Strategy.GRAPH, order=["b", "a"])

        @clutch.agent(edges=["b"])
        async def a(data: Any) -> Any:
            return data

        @clutch.agent()
        async def b(data: Any) -> Any:
            return data

        clutch.validate()


class TestExplicitOrder:
    async def test_order_overrides_registration_order(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", order=["b", "a"])

        @clutch.agent()
        async def a(data: Any) -> Any:
            log.append("a")
            return data

        @clutch.agent()
        async def b(data: Any) -> Any:
            log.append("b")
            return data

        await clutch.run("in")
        assert log == ["b", "a"]

    async def test_order_may_leave_agents_out(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", order=["c", "a"])

        for name in ("a", "b", "c"):

            async def agent(data: Any, _name: str = name) -> Any:
                log.append(_name)
                return data

            agent.__name__ = name
            clutch.agent(agent)

        await clutch.run("in")
        assert log == ["c", "a"]

    async def test_members_follow_the_order(self) -> None:
        members: list[list[str]] = []
        clutch = Clutch("p", order=["b", "a"])

        @clutch.agent()
        async def a(data: Any) -> Any:
            members.append(list(get_context().state.members))
            return data

        @clutch.agent()
        async def b(data: Any) -> Any:
            return data

        await clutch.run("in")
        assert members == [["b", "a"]]

    async def test_empty_order_means_registration_order(self) -> None:
        log: list[str] = []
        clutch = Clutch("p", order=[])

        @clutch.agent()
        async def a(data: Any) -> Any:
            log.append("a")
            return data

        @clutch.agent()
        async def b(data: Any) -> Any:
            log.append("b")
            return data

        await clutch.run("in")
        assert log == ["a", "b"]


class TestHooks:
    async def test_on_step_gets_name_input_and_output(self) -> None:
        calls: list[tuple[str, Any, Any]] = []

        async def on_step(name: str, input_data: Any, output: Any) -> None:
            calls.append((name, input_data, output))

        clutch = Clutch("p", on_step=on_step)

        @clutch.agent()
        async def a(data: str) -> str:
            return data + "_a"

        @clutch.agent()
        async def b(data: str) -> str:
            return data + "_b"

        await clutch.run("in")
        assert calls == [("a", "in", "in_a"), ("b", "in_a", "in_a_b")]

    async def test_on_step_sees_the_dict_form_of_models(self) -> None:
        calls: list[tuple[str, Any, Any]] = []

        async def on_step(name: str, input_data: Any, output: Any) -> None:
            calls.append((name, input_data, output))

        clutch = Clutch("p", on_step=on_step)

        @clutch.agent()
        async def search(req: Request) -> Response:
            return Response(results=[req.query])

        await clutch.run(Request(query="q", limit=1))
        assert calls == [("search", {"query": "q", "limit": 1}, {"results": ["q"]})]

    async def test_on_step_is_not_called_for_signals(self) -> None:
        calls: list[str] = []

        async def on_step(name: str, input_data: Any, output: Any) -> None:
            calls.append(name)

        clutch = Clutch("p", on_step=on_step)

        @clutch.agent()
        async def a(data: Any) -> Any:
            raise Handover("b", data)

        @clutch.agent()
        async def b(data: Any) -> Any:
            return data

        @clutch.agent()
        async def c(data: Any) -> Any:
            raise Terminate("end")

        assert await clutch.run("in") == "end"
        assert calls == ["b"]

    async def test_request_step_and_response_hooks_in_order(self) -> None:
        events: list[tuple[Any, ...]] = []
        run_ids: list[str] = []

        async def on_request(request: dict[str, Any]) -> None:
            events.append(("request", request))

        async def on_step(name: str, input_data: Any, output: Any) -> None:
            events.append(("step", name))

        async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
            events.append(("response", request, response))

        clutch = Clutch("p", on_request=on_request, on_step=on_step, on_response=on_response)

        @clutch.agent()
        async def a(data: str) -> str:
            run_ids.append(get_context().state.clutch_id)
            return data + "_a"

        assert await clutch.run("in") == "in_a"
        [run_id] = run_ids
        request = {"clutch_id": run_id, "input": "in"}
        response = {"_clutch_response": True, "clutch_id": run_id, "result": "in_a"}
        assert events == [("request", request), ("step", "a"), ("response", request, response)]

    async def test_on_request_is_awaited_before_the_first_step(self) -> None:
        log: list[str] = []

        async def on_request(request: dict[str, Any]) -> None:
            log.append("request")

        clutch = Clutch("p", on_request=on_request)

        @clutch.agent()
        async def a(data: Any) -> Any:
            log.append("a")
            return data

        await clutch.run("in")
        assert log == ["request", "a"]

    async def test_on_response_gets_the_dumped_input_and_terminate_result(self) -> None:
        seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

        async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
            seen.append((request, response))

        clutch = Clutch("p", on_response=on_response)

        @clutch.agent()
        async def stop(req: Request) -> Any:
            raise Terminate({"done": req.query})

        await clutch.run(Request(query="q"))
        [(request, response)] = seen
        assert request["input"] == {"query": "q", "limit": 10}
        assert response["result"] == {"done": "q"}
        assert response["_clutch_response"] is True
        assert request["clutch_id"] == response["clutch_id"]

    async def test_on_response_is_not_called_when_an_agent_fails(self) -> None:
        responses: list[Any] = []

        async def on_response(request: dict[str, Any], response: dict[str, Any]) -> None:
            responses.append(response)

        clutch = Clutch("p", on_response=on_response)

        @clutch.agent()
        async def broken(data: Any) -> Any:
            raise KeyError("boom")

        with pytest.raises(KeyError):
            await clutch.run("in")
        assert responses == []

    async def test_a_failing_hook_fails_the_run(self) -> None:
        async def on_step(name: str, input_data: Any, output: Any) -> None:
            raise RuntimeError("hook broke")

        clutch = Clutch("p", on_step=on_step)
        clutch.agent(echo)
        with pytest.raises(RuntimeError, match="hook broke"):
            await clutch.run("in")


class TestStream:
    async def test_one_event_per_step_then_the_result(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            return data + "_a"

        @clutch.agent()
        async def b(data: str) -> str:
            return data + "_b"

        events = [event async for event in clutch.stream("in")]
        assert [(e.step, e.data, e.final) for e in events] == [
            ("a", "in_a", False),
            ("b", "in_a_b", False),
            ("_result", "in_a_b", True),
        ]
        assert all(isinstance(e, StepEvent) for e in events)

    async def test_signal_steps_are_streamed_with_the_data_after_them(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            raise Handover("c", "handed")

        @clutch.agent()
        async def b(data: str) -> str:
            return "skipped"

        @clutch.agent()
        async def c(data: str) -> str:
            raise Terminate()

        events = [(e.step, e.data, e.final) async for e in clutch.stream("in")]
        assert events == [
            ("a", "handed", False),
            ("c", "handed", False),
            ("_result", "handed", True),
        ]

    async def test_without_agents_only_the_result(self) -> None:
        events = [(e.step, e.data, e.final) async for e in Clutch("p").stream("in")]
        assert events == [("_result", "in", True)]

    async def test_models_are_streamed_in_dict_form(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def make(data: Any) -> Item:
            return Item(name="w", price=1.5)

        events = [e async for e in clutch.stream({})]
        assert events[0].data == {"name": "w", "price": 1.5}
        assert events[-1].data == {"name": "w", "price": 1.5}

    async def test_a_failing_agent_raises_after_the_earlier_events(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            return "ok"

        @clutch.agent()
        async def b(data: str) -> str:
            raise ValueError("bad step")

        seen: list[str] = []
        with pytest.raises(ValueError, match="bad step"):
            async for event in clutch.stream("in"):
                seen.append(event.step)
        assert seen == ["a"]

    async def test_long_round_robin_stream_loses_nothing(self) -> None:
        clutch = Clutch("p", strategy=Strategy.ROUND_ROBIN, max_turns=500)

        @clutch.agent()
        async def inc(data: int) -> int:
            return data + 1

        events = [e async for e in clutch.stream(0)]
        assert [e.data for e in events[:-1]] == list(range(1, 501))
        assert events[-1].final and events[-1].data == 500


class TestPipelines:
    async def test_only_a_clutch_given_checkpoint_stores_its_runs_in_the_default_store(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As the README's first example says: without checkpoint= nothing is stored (as
        in eggai-clutch); CheckpointConfig() stores in the embedded SQLite store."""
        monkeypatch.setenv(HOME_ENV, str(tmp_path))
        plain = Clutch("plain")
        plain.agent()(echo)
        assert await plain.run("in") == "in"
        assert list(tmp_path.iterdir()) == []  # no store opened, no file written
        stored = Clutch("stored", checkpoint=CheckpointConfig())
        stored.agent()(echo)
        async with stored:
            await stored.run("in", run_id="r1")
            assert [run.run_id for run in await stored.list_runs()] == ["r1"]
        assert (tmp_path / DEFAULT_DB_NAME).is_file()

    async def test_three_stage_pipeline(self) -> None:
        clutch = Clutch("pipeline")

        @clutch.agent()
        async def validate(data: dict[str, Any]) -> dict[str, Any]:
            return {"validated": True, **data}

        @clutch.agent()
        async def enrich(data: dict[str, Any]) -> dict[str, Any]:
            return {"enriched": True, **data}

        @clutch.agent()
        async def format_output(data: dict[str, Any]) -> dict[str, Any]:
            return {"formatted": True, **data}

        assert await clutch.run({"user": "test"}) == {
            "user": "test",
            "validated": True,
            "enriched": True,
            "formatted": True,
        }

    async def test_accumulator_loop_terminates(self) -> None:
        clutch = Clutch("loop", strategy=Strategy.ROUND_ROBIN, max_turns=100)

        @clutch.agent()
        async def accumulator(data: dict[str, int]) -> dict[str, int]:
            value = data.get("value", 0) + 1
            if value >= 5:
                raise Terminate({"final": value})
            return {"value": value}

        assert await clutch.run({}) == {"final": 5}

    async def test_dynamic_routing(self) -> None:
        clutch = Clutch("router", strategy=Strategy.SELECTOR)

        @clutch.selector
        async def route(data: dict[str, Any]) -> str | None:
            if "result" in data:
                return None
            return {"quick": "fast_handler", "complex": "slow_handler"}.get(data.get("type"))

        @clutch.agent()
        async def fast_handler(data: dict[str, Any]) -> dict[str, Any]:
            return {"result": "fast", **data}

        @clutch.agent()
        async def slow_handler(data: dict[str, Any]) -> dict[str, Any]:
            return {"result": "slow", **data}

        assert (await clutch.run({"type": "quick"}))["result"] == "fast"
        assert (await clutch.run({"type": "complex"}))["result"] == "slow"
        assert await clutch.run({"type": "other"}) == {"type": "other"}

    async def test_graph_workflow_with_validation_exit(self) -> None:
        clutch = Clutch("workflow", strategy=Strategy.GRAPH)

        @clutch.agent(edges=["validator"])
        async def intake(data: dict[str, Any]) -> dict[str, Any]:
            return {"intake": True, **data}

        @clutch.agent(edges=["processor"])
        async def validator(data: dict[str, Any]) -> dict[str, Any]:
            if not data.get("valid", True):
                raise Terminate({"error": "invalid"})
            return {"validated": True, **data}

        @clutch.agent()
        async def processor(data: dict[str, Any]) -> dict[str, Any]:
            return {"processed": True, **data}

        result = await clutch.run({"item": "test"})
        assert result["intake"] and result["validated"] and result["processed"]
        assert await clutch.run({"item": "bad", "valid": False}) == {"error": "invalid"}


class TestTypedData:
    async def test_model_in_model_out(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def search(req: Request) -> Response:
            assert isinstance(req, Request)
            return Response(results=[req.query] * req.limit)

        assert await clutch.run({"query": "test", "limit": 3}) == {
            "results": ["test", "test", "test"]
        }

    async def test_model_output_reaches_the_next_agent_as_a_dict(self) -> None:
        received: list[Any] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def create_item(data: Any) -> Item:
            return Item(name="Widget", price=9.99)

        @clutch.agent()
        async def process_item(data: Any) -> dict[str, Any]:
            received.append(data)
            return {"processed": data["name"], "cost": data["price"]}

        assert await clutch.run({}) == {"processed": "Widget", "cost": 9.99}
        assert received == [{"name": "Widget", "price": 9.99}]

    async def test_model_input_to_run_is_dumped_then_rebuilt(self) -> None:
        seen: list[Any] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def untyped(data: Any) -> Any:
            seen.append(data)
            return data

        @clutch.agent()
        async def typed(req: Request) -> Request:
            seen.append(req)
            return req

        assert await clutch.run(Request(query="q")) == {"query": "q", "limit": 10}
        assert seen[0] == {"query": "q", "limit": 10}
        assert seen[1] == Request(query="q")

    async def test_history_holds_dict_forms(self) -> None:
        history: list[dict[str, Any]] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def first(req: Request) -> Response:
            return Response(results=["x"])

        @clutch.agent()
        async def second(data: Any) -> Any:
            history.extend(get_context().state.history)
            return data

        await clutch.run(Request(query="q"))
        assert history == [
            {"source": "input", "data": {"query": "q", "limit": 10}},
        ]

    async def test_dict_that_does_not_fit_the_model_fails_the_step(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def search(req: Request) -> Response:
            return Response(results=[])

        with pytest.raises(ValidationError):
            await clutch.run({"limit": "not a number"})

    async def test_non_dict_data_is_passed_unchanged_to_a_typed_agent(self) -> None:
        received: list[Any] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def search(req: Request) -> Any:
            received.append(req)
            return req

        assert await clutch.run("plain text") == "plain text"
        assert received == ["plain text"]

    async def test_plain_annotations_are_left_alone(self) -> None:
        clutch = Clutch("p")

        @clutch.agent()
        async def anything(data: Any) -> Any:
            return data

        @clutch.agent()
        async def text(data: str) -> Any:
            return data

        assert await clutch.run({"k": 1}) == {"k": 1}


class TestHistory:
    async def test_history_tracks_the_previous_steps(self) -> None:
        captured: list[Any] = []
        clutch = Clutch("history")

        @clutch.agent()
        async def a(data: str) -> str:
            return "from_a"

        @clutch.agent()
        async def b(data: str) -> str:
            ctx = get_context()
            captured.append((list(ctx.state.history), ctx.source, ctx.data, ctx.state.turn))
            return "from_b"

        @clutch.agent()
        async def c(data: str) -> str:
            ctx = get_context()
            captured.append((list(ctx.state.history), ctx.source, ctx.data, ctx.state.turn))
            return "from_c"

        await clutch.run("input")
        assert captured == [
            ([{"source": "input", "data": "input"}], "a", "from_a", 1),
            (
                [{"source": "input", "data": "input"}, {"source": "a", "data": "from_a"}],
                "b",
                "from_b",
                2,
            ),
        ]

    async def test_signals_with_data_add_to_history_and_turn(self) -> None:
        captured: list[Any] = []
        clutch = Clutch("p")

        @clutch.agent()
        async def a(data: str) -> str:
            raise Handover("b", "handed")

        @clutch.agent()
        async def b(data: str) -> str:
            ctx = get_context()
            captured.append((list(ctx.state.history), ctx.source, ctx.state.turn))
            raise Handover("c")

        @clutch.agent()
        async def c(data: str) -> str:
            ctx = get_context()
            captured.append((list(ctx.state.history), ctx.source, ctx.state.turn))
            return data

        await clutch.run("in")
        expected = ([{"source": "input", "data": "in"}], "a", 1)
        # b's hand-over carried no data: neither history nor turn moved.
        assert captured == [expected, expected]
