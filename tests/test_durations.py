"""Durations given by a caller: seconds or a timedelta, refused naming what was given."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from nestegg.durations import seconds
from nestegg.errors import ConfigurationError


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        (timedelta(seconds=-5), "-5 s"),  # was: datetime.timedelta(days=-1, seconds=86395)
        (timedelta(milliseconds=-1500), "-1.5 s"),
        (timedelta(days=365 * 101), "3.18514e+09 s"),
        (-5, "-5"),
        (float("nan"), "nan"),
        (True, "True"),
        ("5", "'5'"),
    ],
)
def test_a_refused_duration_is_named_readably(given: Any, shown: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        seconds(given, "sleep's duration")
    assert str(refused.value) == (
        "sleep's duration must be a timedelta or a number of seconds from 0 to 100 years, "
        f"got {shown}"
    )


def test_a_duration_in_range_is_its_seconds() -> None:
    assert seconds(timedelta(minutes=2), "timeout") == 120.0
    assert seconds(0, "timeout") == 0.0
