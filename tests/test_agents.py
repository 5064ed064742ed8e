"""Agents: AgentNode, input types, typed and plain data, name checks."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from nestegg.agents import AgentNode, input_type_of, to_plain, to_typed
from nestegg.constants import MAX_NAME_LENGTH
from nestegg.errors import ConfigurationError, InvalidIdentifierError
from nestegg.identifiers import check_name


class InputModel(BaseModel):
    query: str


async def untyped(data):  # type: ignore[no-untyped-def]
    return data


async def typed(data: InputModel) -> InputModel:
    return data


class TestAgentNode:
    def test_fields(self) -> None:
        node = AgentNode("test", untyped)
        assert node.name == "test"
        assert node.handler is untyped
        assert node.edges == []
        assert node.input_type is None

    def test_edges_are_copied(self) -> None:
        edges = ["a", "b"]
        node = AgentNode("test", untyped, edges=edges)
        edges.append("c")
        assert node.edges == ["a", "b"]

    @pytest.mark.parametrize("edges", ["b", 3, {"b": 1}])
    def test_edges_that_are_not_a_list_of_names_are_rejected(self, edges: Any) -> None:
        with pytest.raises(ConfigurationError, match="edges of agent 'test' must be a list"):
            AgentNode("test", untyped, edges=edges)

    def test_a_string_edge_suggests_the_list(self) -> None:
        with pytest.raises(ConfigurationError, match=r"write edges=\['b'\]"):
            AgentNode("test", untyped, edges="b")

    def test_edges_that_are_not_names_are_rejected(self) -> None:
        with pytest.raises(ConfigurationError, match="got 3"):
            AgentNode("test", untyped, edges=["b", 3])

    def test_input_type_is_the_first_parameters_annotation(self) -> None:
        assert AgentNode("test", typed).input_type is InputModel

    def test_sync_function_is_rejected(self) -> None:
        def sync(data: Any) -> Any:
            return data

        with pytest.raises(ConfigurationError, match="'sync'"):
            AgentNode("sync", sync)

    def test_bad_name_is_rejected(self) -> None:
        with pytest.raises(InvalidIdentifierError):
            AgentNode("../etc", untyped)


class TestInputType:
    def test_without_parameters(self) -> None:
        async def nothing() -> None:
            return None

        assert input_type_of(nothing) is None

    def test_plain_annotations(self) -> None:
        async def text(data: str) -> str:
            return data

        assert input_type_of(text) is str

    def test_generic_annotations_are_not_types(self) -> None:
        async def mapping(data: dict[str, Any]) -> Any:
            return data

        async def optional(data: InputModel | None) -> Any:
            return data

        assert input_type_of(mapping) is None
        assert input_type_of(optional) is None

    def test_unresolvable_annotation_is_ignored(self) -> None:
        async def broken(data: NoSuchModel) -> Any:  # type: ignore[name-defined]  # noqa: F821
            return data

        assert input_type_of(broken) is None

    def test_only_the_first_parameter_counts(self) -> None:
        async def second(data, extra: InputModel | None = None):  # type: ignore[no-untyped-def]
            return data

        assert input_type_of(second) is None


class TestToTyped:
    def test_no_target_passes_through(self) -> None:
        data = {"query": "q"}
        assert to_typed(data, None) is data

    def test_dict_becomes_the_model(self) -> None:
        result = to_typed({"query": "q"}, InputModel)
        assert isinstance(result, InputModel) and result.query == "q"

    def test_model_instance_passes_through(self) -> None:
        model = InputModel(query="q")
        assert to_typed(model, InputModel) is model

    def test_non_dict_passes_through(self) -> None:
        assert to_typed("text", InputModel) == "text"
        assert to_typed(None, InputModel) is None

    @pytest.mark.parametrize("target", [str, int, dict, Any, object])
    def test_non_model_targets_pass_through(self, target: Any) -> None:
        data = {"k": "v"}
        assert to_typed(data, target) is data
        assert to_typed(3, target) == 3

    def test_dict_that_does_not_fit_raises_the_validation_error(self) -> None:
        with pytest.raises(ValidationError):
            to_typed({"other": 1}, InputModel)


class TestToPlain:
    def test_model_is_dumped(self) -> None:
        assert to_plain(InputModel(query="q")) == {"query": "q"}

    def test_a_model_of_a_model_is_dumped(self) -> None:
        class Subclass(InputModel):
            extra: int = 2

        assert to_plain(Subclass(query="q")) == {"query": "q", "extra": 2}

    @pytest.mark.parametrize(
        "value",
        ["s", 1, 1.5, True, None, [1, 2], (1,), {"k": InputModel(query="q")}, OrderedDict(k=1)],
    )
    def test_other_values_are_unchanged(self, value: Any) -> None:
        assert to_plain(value) is value


class TestCheckName:
    @pytest.mark.parametrize("name", ["a", "agent_1", "Über-Agent", "a.b", "x" * MAX_NAME_LENGTH])
    def test_good_names(self, name: str) -> None:
        assert check_name(name, "agent name") == name

    @pytest.mark.parametrize(
        "name",
        ["", ".", "..", "a..b", "a/b", "a\\b", "a\0b", "a\nb", "a\rb", "x" * (MAX_NAME_LENGTH + 1)],
    )
    def test_bad_names(self, name: str) -> None:
        with pytest.raises(InvalidIdentifierError, match="agent name"):
            check_name(name, "agent name")

    @pytest.mark.parametrize(
        ("name", "found"),
        [
            ("a\0b", "contains a NUL (U+0000) at index 1"),
            ("ab\nc", "contains a line feed (U+000A) at index 2"),
            ("\rx", "contains a carriage return (U+000D) at index 0"),
            ("x/y", "contains a path separator '/' at index 1"),
            ("x\\y", "contains a path separator '\\' at index 1"),
            ("run..2", "contains '..' at index 3"),
            ("a/..", "contains a path separator '/' at index 1"),  # the first one found
            ("..", "contains '..' at index 0"),
            (".", "is '.', the name of the folder it would be in"),
        ],
    )
    def test_a_bad_name_says_what_it_holds_and_where(self, name: str, found: str) -> None:
        with pytest.raises(InvalidIdentifierError) as refused:
            check_name(name, "run id")
        assert str(refused.value) == (  # it said "or a control character", which is taken
            f"run id {name!r} {found} (a path separator, '..', a NUL, a line feed or a "
            "carriage return is not allowed)"
        )

    @pytest.mark.parametrize("name", ["a\tb", "a\x1bb", "a\u202eb", "a\x7fb", "a\u2028b"])
    def test_other_control_characters_are_taken_as_the_refusal_says(self, name: str) -> None:
        assert check_name(name, "run id") == name

    @pytest.mark.parametrize("name", [None, 3, b"bytes"])
    def test_non_strings(self, name: Any) -> None:
        with pytest.raises(InvalidIdentifierError):
            check_name(name, "agent name")
