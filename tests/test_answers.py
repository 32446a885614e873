"""Reading answers out of hostile completions: bounded numbers, the right-to-left tag search
agrees with TinyZero's left-to-right scan, and the last number."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedledger.trainers.rewards.answers import (
    MAX_EXPONENT,
    _extract_tag_scan,
    extract_tag,
    last_number,
    parse_number,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [("2.5e3", 2500), ("1E2", 100), ("-4e-2", Fraction(-1, 25)), (f"1e{MAX_EXPONENT}", 10**MAX_EXPONENT),
     ("3/4", Fraction(3, 4)), (".5", Fraction(1, 2)), ("+7", 7), ("$1,234.50", Fraction(2469, 2))],
)
def test_parse_number_reads_plain_and_scientific_numbers(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "text",
    ["1e99999999", "1e-99999999", f"1e{MAX_EXPONENT + 1}", "9" * 65, "1_000", "1/0", "nan", "inf",
     "1e", "e5", "1.2.3", "--1", "1/2/3", "1.5/2", "٣", "１２", "0x10"],
)
def test_parse_number_refuses_what_it_cannot_bound(text: str) -> None:
    assert parse_number(text) is None


def test_last_number_reads_the_number_at_the_last_digit() -> None:
    assert last_number("it is 1,000 or -3.5 apples") == Fraction(-7, 2)
    assert last_number("The price is $1,000.") == 1000
    assert last_number("from 5-3") == -3
    assert last_number("x = 3.14, done") == Fraction(314, 100)
    assert last_number("no digits") is None
    assert last_number("1" * 100 + " then 7") == 7
    assert last_number("7 then " + "1" * 100) is None  # too long to be an answer


TAG_PARTS = st.sampled_from(["<answer>", "</answer>", "\n", "a", " 1 ", "<", "answer>", "</", "\x0b", "\x0c", "\x01"])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TAG_PARTS, max_size=40).map("".join))
def test_extract_tag_agrees_with_the_left_to_right_scan(text: str) -> None:
    assert extract_tag(text) == _extract_tag_scan(text, "<answer>", "</answer>")
    tinyzero = [m.group(1) for m in re.finditer(r"<answer>(.*?)</answer>", text)]
    assert extract_tag(text) == (tinyzero[-1].strip() if tinyzero else None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["[A]", "[/A]", "##", "\n", "x", "["]), max_size=30).map("".join),
       st.sampled_from([("[A]", "[/A]"), ("##", "##"), ("[", "]")]))
def test_other_markers_agree_too(text: str, markers: tuple[str, str]) -> None:
    start, end = markers
    assert extract_tag(text, start, end) == _extract_tag_scan(text, start, end)
