"""The safe expression verifier and every built-in reward on hostile model output:
whitelist semantics and a hypothesis fuzz (never raises, never hangs: every call under
10 ms). Covers safe_eval, the Countdown score, parse_number, the arithmetic and math
rewards, the jsonl exact / numeric / regex rewards, the format reward and the length
penalty, on random text, 100 KB inputs, deep nesting, huge literals and exponents, and
unicode digits."""

from __future__ import annotations

import gc
import math
import time
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seedledger.trainers.rewards.answers import parse_number
from seedledger.trainers.rewards.format import format_reward
from seedledger.trainers.rewards.length import length_penalty
from seedledger.trainers.rewards.verifier import MAX_MAGNITUDE, numbers_used, safe_eval
from seedledger.trainers.tasks.arithmetic import arithmetic_reward
from seedledger.trainers.tasks.countdown import score
from seedledger.trainers.tasks.jsonl_task import compile_pattern, match_reward
from seedledger.trainers.tasks.math_task import math_reward

LIMIT_S = 0.010
"""Per call, in CPU time of this thread: wall time on a shared 2-core box measures the
neighbours, not the verifier."""


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("1 + 2", 3),
        ("(1 + 2) / 3", 1),
        ("7 / 2", Fraction(7, 2)),
        ("-(3 - 5) * 4", 8),
        ("+4", 4),
        ("2.5 * 2", 5),
        ("((((1))))", 1),
        ("100 - 99 * 1", 1),
    ],
)
def test_accepts_whitelisted_arithmetic(expr: str, value: Fraction) -> None:
    assert safe_eval(expr) == value


@pytest.mark.parametrize(
    "expr",
    [
        "2 ** 3", "2 ^ 3", "7 // 2", "7 % 2", "1 / 0", "1 / (2 - 2)", "abs(-1)", "x + 1",
        "__import__('os')", "1 if 1 else 2", "[1]", "'1'", "1j", "True + 1", "1 < 2",
        "", "   ", "1 +", "1e400", f"{MAX_MAGNITUDE * 10}", "999999 * 999999 * 999999",
        "(" * 40 + "1" + ")" * 40, "1; 2", "lambda: 1", "٣ + 1", "１ + 1", "a.b", "1 = 1",
        "x" * 300, None, 12, b"1+1",
    ],
)
def test_refuses_everything_else(expr: object) -> None:
    assert safe_eval(expr) is None


def test_numbers_used_reads_ascii_digit_runs() -> None:
    assert numbers_used("(12 + 3) / 45") == [12, 3, 45]
    assert numbers_used("1.5") == [1, 5]
    assert numbers_used("no digits") == []


def _timed(fn, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
    """`fn(*args)` within LIMIT_S of thread CPU time, the best of up to three calls: noise
    (a neighbour's cache traffic, frequency scaling on a loaded box) only ever adds time,
    so the minimum is the call's own cost, and a slow algorithm is slow every time."""
    best = math.inf
    for _ in range(3):
        gc.disable()  # a collection of hypothesis's garbage is not the verifier's time
        try:
            started = time.thread_time()
            out = fn(*args, **kwargs)
            best = min(best, time.thread_time() - started)
        finally:
            gc.enable()
        if best < LIMIT_S:
            break
    assert best < LIMIT_S, f"{best * 1e3:.1f} ms in {getattr(fn, '__name__', fn)} on {repr(args)[:80]}"
    return out


PATTERNS = [r"\d+ apples?", r"[a-z ]*x", r"(?:\d+,)*\d+"]
JSONL = [
    (match_reward("exact", casefold=True), ["Paris"]),
    (match_reward("numeric"), ["#### 7"]),
    (match_reward("regex", patterns={p: compile_pattern(p, False) for p in PATTERNS}), PATTERNS),
]
SHAPING = [format_reward(), length_penalty(100), length_penalty(10, unit="words")]


def _check_rewards(text: str) -> None:
    """Every built-in reward on ``text`` as a completion, bare and in the shapes each
    reward reads (tags, ``####``, ``a + b = c``), with the exponent as an answer too."""
    value = _timed(parse_number, text)
    assert value is None or isinstance(value, Fraction)
    _timed(parse_number, f"1e{text[:70]}")
    shapes = [text, f"<answer>{text}</answer>", f"3 + 4 = {text}", f"#### {text}", f"<answer>1e{text}</answer>"]
    for completion in shapes:
        (r,) = _timed(arithmetic_reward, None, [completion], [7])
        assert r in (0.0, 0.1, 0.5, 1.0)
        (r,) = _timed(math_reward, None, [completion], ["#### 7"])
        assert r in (0.0, 1.0)
        for fn, golds in JSONL:
            out = _timed(fn, None, [completion] * len(golds), answer=golds)
            assert all(v in (0.0, 1.0) for v in out)
    chat = [[{"role": "assistant", "content": text}]]
    for fn in SHAPING:
        (r,) = _timed(fn, None, chat)
        assert isinstance(r, float)


def _check(text: str) -> None:
    value = _timed(safe_eval, text)
    assert value is None or isinstance(value, Fraction)
    reward = _timed(score, f"<answer>{text}</answer>", 10, [1, 2, 3])
    assert reward in (0.0, 0.1, 1.0)
    _check_rewards(text)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ARITH = st.sampled_from(list("0123456789+-*/() .e_^%*") + ["**", "//", "١", "٣", "１", "𝟗"])


@FUZZ
@given(st.text(max_size=400))
def test_fuzz_random_text(text: str) -> None:
    _check(text)


@FUZZ
@given(st.lists(ARITH, max_size=300).map("".join))
def test_fuzz_arithmetic_alphabet(text: str) -> None:
    _check(text)


HOSTILE_UNITS = st.sampled_from(
    ["\n", "1 ", "1,", "1.1 ", "-1", "1e9", "<answer>", "</answer>", "<answer>\n</answer>\n",
     "</answer>\n<answer>\n", "<answer></answer>", "#### ", "٣ ", "= ", "a" * 40 + " ", "(", "9"]
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=1, max_size=64) | st.lists(ARITH, min_size=1, max_size=64).map("".join)
       | HOSTILE_UNITS)
def test_fuzz_100kb_inputs(unit: str) -> None:
    """100 KB built by repeating a random unit (cheap to generate, same size to refuse)."""
    text = (unit * (100_000 // len(unit) + 1))[:100_000]
    _check(text)
    _check(text.replace("\n", " "))


@FUZZ
@given(st.integers(min_value=1, max_value=100_000), st.sampled_from(["(", "-", "+", "(-"]))
def test_fuzz_deep_nesting(depth: int, opener: str) -> None:
    _check(opener * depth + "1" + ")" * depth * opener.count("("))


@FUZZ
@given(st.integers(min_value=10**11, max_value=10**4000), st.sampled_from(["+", "*", "/", "-"]))
def test_fuzz_huge_literals(n: int, op: str) -> None:
    text = str(n)[:250]
    _check(f"{text} {op} 1")
    _check(f"1 {op} {text}")


@FUZZ
@given(st.text(alphabet=st.characters(categories=["Nd", "No", "Nl"]), min_size=1, max_size=50))
def test_fuzz_unicode_digits(digits: str) -> None:
    _check(digits)
    _check(f"{digits} + 1")


def test_huge_products_stop_at_the_magnitude_bound() -> None:
    assert _timed(safe_eval, " * ".join(["999999"] * 40)) is None
    assert _timed(safe_eval, " / ".join(["1"] + ["99"] * 40)) == Fraction(1, 99**40)


@FUZZ
@given(st.integers(min_value=-(10**12), max_value=10**12), st.sampled_from(["1", "9.5", "-3", "0", "1,000"]),
       st.sampled_from(["e", "E", "e+", "e-"]))
def test_fuzz_huge_exponents(exponent: int, mantissa: str, marker: str) -> None:
    """``Fraction("1e99999999")`` alone takes over a minute: exponents must be bounded."""
    text = f"{mantissa}{marker}{abs(exponent) if marker[-1] in '+-' else exponent}"
    _check_rewards(text)
    assert _timed(parse_number, text) is None or abs(exponent) <= 100


def test_known_slow_exponents_are_refused_fast() -> None:
    for text in ("1e99999999", "1e-99999999", "1E999999", "7e+1000000"):
        assert _timed(parse_number, text) is None
        _check_rewards(text)


@pytest.mark.parametrize(
    "unit",
    ["\n", "1 ", "١ ", "1.1 ", "<answer>\n</answer>\n", "</answer>\n<answer>\n", "<answer></answer>", "</answer>"],
)
def test_known_slow_100kb_texts_are_fast(unit: str) -> None:
    """Found slow before: 100 K newlines (23 ms in the per-line tag scan), 50 K numbers
    (40 ms reading the last one), thousands of tags."""
    _check((unit * (100_000 // len(unit) + 1))[:100_000])
    _check("<answer>" + (unit * (100_000 // len(unit) + 1))[:100_000] + "</answer>")
