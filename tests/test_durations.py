"""Durations at the edges: what users write, turned into timedeltas and milliseconds."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beatless.core.durations import as_timedelta, describe, to_ms
from beatless.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
        (0, timedelta(0)),
        ("90", timedelta(seconds=90)),
        ("0.25", timedelta(milliseconds=250)),
        ("90s", timedelta(seconds=90)),
        ("2m", timedelta(minutes=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1h 30m", timedelta(hours=1, minutes=30)),
        ("500ms", timedelta(milliseconds=500)),
        ("1.5s", timedelta(milliseconds=1500)),
        ("2d", timedelta(days=2)),
        ("1w", timedelta(weeks=1)),
        ("  45s ", timedelta(seconds=45)),
        ("PT120S", timedelta(seconds=120)),
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("P1D", timedelta(days=1)),
        ("P1DT2H", timedelta(days=1, hours=2)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("pt2m", timedelta(minutes=2)),
        ("P2W", timedelta(weeks=2)),
        (timedelta(seconds=7), timedelta(seconds=7)),
    ],
)
def test_every_accepted_form_reads_as_the_same_timedelta(
    value: object, expected: timedelta
) -> None:
    assert as_timedelta(value) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        True,
        False,
        "",
        "   ",
        "x",
        "PT",
        "P",
        "P1DT",
        "PT1H2",
        "nan",
        "inf",
        "-inf",
        "1h30",
        "90 seconds",
        "-5s",
        float("nan"),
        float("inf"),
        1e20,
        "1e20",
        [90],
        (90,),
        None,
        {"seconds": 90},
    ],
)
def test_a_refused_value_is_a_config_error_naming_the_field(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^entry 'reports': jitter: "):
        as_timedelta(value, name="entry 'reports': jitter")  # type: ignore[arg-type]


def test_an_unreadable_string_says_which_forms_are_accepted() -> None:
    with pytest.raises(ConfigError, match=r"'90s'.*'PT120S'"):
        as_timedelta("soon")


def test_a_bad_duration_without_a_field_name_says_duration() -> None:
    with pytest.raises(ConfigError, match=r"^duration: "):
        as_timedelta("x")


@given(st.integers(-(10**12), 10**12))
def test_to_ms_reads_back_whole_milliseconds(milliseconds: int) -> None:
    assert to_ms(timedelta(milliseconds=milliseconds)) == milliseconds


def test_to_ms_rounds_a_partial_millisecond_down() -> None:
    assert to_ms(timedelta(microseconds=1999)) == 1


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=90), "1m30s"),
        (timedelta(hours=1, minutes=30), "1h30m"),
        (timedelta(milliseconds=250), "250ms"),
        (timedelta(days=1, seconds=1), "1d1s"),
        (timedelta(seconds=-30), "-30s"),
    ],
)
def test_describe_writes_the_short_form(delta: timedelta, text: str) -> None:
    assert describe(delta) == text


@given(st.integers(1, 10**10))
def test_describe_reads_back_as_the_same_duration(milliseconds: int) -> None:
    delta = timedelta(milliseconds=milliseconds)
    assert as_timedelta(describe(delta)) == delta
