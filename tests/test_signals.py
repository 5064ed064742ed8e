"""Terminate, Handover and handover(): control-flow signals, not errors."""

from __future__ import annotations

import pytest

from nestegg import Handover, Terminate, handover
from nestegg.errors import InvalidIdentifierError, NestEggError


class TestTerminate:
    def test_without_result(self) -> None:
        assert Terminate().result is None

    def test_with_result(self) -> None:
        assert Terminate("final_value").result == "final_value"

    def test_with_dict_result(self) -> None:
        result = {"key": "value", "count": 42}
        assert Terminate(result).result is result

    def test_is_an_exception_but_not_an_error_of_the_tree(self) -> None:
        assert issubclass(Terminate, Exception)
        assert not issubclass(Terminate, NestEggError)


class TestHandover:
    def test_without_data(self) -> None:
        signal = Handover("next_agent")
        assert signal.agent == "next_agent"
        assert signal.data is None

    def test_with_data(self) -> None:
        signal = Handover("next_agent", {"payload": "data"})
        assert signal.agent == "next_agent"
        assert signal.data == {"payload": "data"}

    def test_is_an_exception_but_not_an_error_of_the_tree(self) -> None:
        assert issubclass(Handover, Exception)
        assert not issubclass(Handover, NestEggError)

    @pytest.mark.parametrize("agent", [["billing"], None, 3])
    def test_an_agent_that_is_no_str_is_refused_by_name(self, agent: object) -> None:
        with pytest.raises(InvalidIdentifierError, match=r"^Handover\(.+\) names no agent"):
            Handover(agent)  # type: ignore[arg-type]
        with pytest.raises(InvalidIdentifierError, match="by its name \\(a str\\)"):
            handover(agent)  # type: ignore[arg-type]

    def test_handover_function_raises_the_signal(self) -> None:
        with pytest.raises(Handover) as info:
            handover("billing", {"amount": 3})
        assert info.value.agent == "billing"
        assert info.value.data == {"amount": 3}

    def test_handover_function_without_data(self) -> None:
        with pytest.raises(Handover) as info:
            handover("billing")
        assert info.value.data is None
