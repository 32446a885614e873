"""math:PATH with math-verify: the MATH layout (problem, boxed solution), LaTeX and
expression equivalence, in the sandbox: bounded by CPU seconds, the same in any thread."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.mathverify import last_boxed
from seedledger.trainers.tasks import load_task
from tests.support.sandbox import need_bwrap

DATA = Path(__file__).parent / "data"
MATH = str(DATA / "math_competition.jsonl")
GSM = str(DATA / "gsm8k.jsonl")


@pytest.fixture(scope="module")
def math_task():
    need_bwrap()
    return load_task({"name": "math", "path": MATH, "test_size": 4})


def test_last_boxed_balances_braces_in_linear_time():
    assert last_boxed(r"so \boxed{\frac{1}{2}} and") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \fbox{2}") == "2"
    assert last_boxed(r"\boxed {x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{unclosed") is None and last_boxed("none") is None
    started = time.perf_counter()
    assert last_boxed("\\boxed{" + "{" * 200_000) is None
    assert time.perf_counter() - started < 1.0


def test_the_math_layout_takes_the_solutions_boxed_answer(math_task):
    rows = math_task.train_rows() + math_task.test_rows()
    assert {"problem", "answer"} <= set(rows[0]) and len(rows) == 16
    assert r"\frac{5}{6}" in [r["answer"] for r in rows]
    assert math_task.describe()["verifier"] == "math_verify"
    assert "boxed" in math_task.prompt(rows[0])[0]["content"]


def by_answer(task, answer: str) -> dict:
    return next(r for r in task.train_rows() + task.test_rows() if r["answer"] == answer)


@pytest.mark.slow
def test_equivalent_forms_score_and_wrong_or_hostile_ones_do_not(math_task):
    cases = [
        (r"\frac{5}{6}", r"The sum is \boxed{\dfrac{5}{6}}.", 1.0),
        (r"\frac{3}{4}", r"\boxed{0.75}", 1.0),
        (r"5\sqrt{2}", r"\boxed{\sqrt{50}}", 1.0),
        (r"x^2 + 2x + 1", r"\boxed{(x+1)^2}", 1.0),
        ("9\\pi", "<answer>9\\pi</answer>", 1.0),
        ("4", "so x = 4", 1.0),  # math-verify finds it in free text
        ("4", r"\boxed{5}", 0.0),
        ("12", r"\boxed{9^{9^{9^{9}}}}", 0.0),  # stopped by the CPU limit
        ("12", "\\boxed{__import__('os').system('touch /tmp/x')}", 0.0),
        ("12", "\\boxed{" + "(" * 5000 + "}", 0.0),
    ]
    rows = [by_answer(math_task, a) for a, _, _ in cases]
    started = time.perf_counter()
    rewards, _ = math_task.reward([None] * len(cases), [c for _, c, _ in cases], rows)
    assert rewards == [r for _, _, r in cases]
    assert time.perf_counter() - started < 60


def test_verdicts_are_the_same_in_a_thread(math_task):
    """math-verify's own timeouts need the main thread; here they are off and the sandbox
    bounds the work, so a worker thread gets the same verdicts."""
    rows = [by_answer(math_task, r"\frac{4}{9}")] * 2
    completions = [r"\boxed{\frac{8}{18}}", r"\boxed{0.45}"]
    out: list = []
    thread = threading.Thread(target=lambda: out.append(math_task.reward([None] * 2, completions, rows)[0]))
    thread.start()
    thread.join()
    assert out == [[1.0, 0.0]] == [math_task.reward([None] * 2, completions, rows)[0]]


def test_gsm8k_stays_numeric_unless_asked():
    plain = load_task({"name": "math", "path": GSM, "test_size": 2})
    assert "verifier" not in plain.describe()  # the description of older runs is unchanged
    need_bwrap()
    verified = load_task({"name": "math", "path": GSM, "test_size": 2, "verifier": "math_verify"})
    row = next(r for r in verified.train_rows() + verified.test_rows() if r["answer"].endswith("1,000"))
    completions = [r"\boxed{1000}", r"<answer>\frac{2000}{2}</answer>", "<answer>1,000</answer>", r"\boxed{999}"]
    assert verified.reward([None] * 4, completions, [row] * 4)[0] == [1.0, 1.0, 1.0, 0.0]
    assert plain.reward([None] * 4, completions, [row] * 4)[0] == [1.0, 0.0, 1.0, 0.0]  # last number


@pytest.mark.parametrize("rows, options, message", [
    ([{"problem": "p", "solution": "no box"}], {}, "row 0: column 'solution': no \\boxed{} answer"),
    ([{"problem": "p", "solution": r"\boxed{1}"}, {"problem": "q"}], {}, "row 1: missing column 'solution'"),
    ([{"text": "p"}], {}, "row 0: missing column 'question'"),
    ([{"problem": "p", "answer": "1"}, {"problem": "q", "answer": "2"}], {"verifier": "numeric"},
     "need verifier: math_verify"),
    ([{"problem": "p", "answer": "1"}, {"problem": "q", "answer": "2"}], {"verifier": "sympy"},
     "verifier must be one of"),
])
def test_bad_input_is_a_one_line_error(tmp_path, rows, options, message):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SeedLedgerError) as err:
        load_task({"name": "math", "path": str(path), "test_size": 1, **options})
    assert message in str(err.value) and "\n" not in str(err.value)
