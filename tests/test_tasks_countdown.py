"""Countdown: the reward agrees with TinyZero's rules on hand-written cases; the generator
only makes solvable problems; TinyZero-layout files load (parquet and jsonl)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.verifier import safe_eval
from seedledger.trainers.tasks import load_task
from seedledger.trainers.tasks.countdown import countdown_reward, load_file, score

DATA = Path(__file__).parent / "data"

# (completion, target, nums, TinyZero's score, why). TinyZero: 0 without an answer tag;
# 0.1 (format score) when the numbers are not each used exactly once, the expression does
# not evaluate, or the value is off; 1.0 when |value - target| < 1e-5.
TINYZERO_CASES = [
    ("<answer>(1 + 2) * 3</answer>", 9, [1, 2, 3], 1.0, "correct"),
    ("<think>try</think> <answer> 3 * (1 + 2) </answer>", 9, [3, 2, 1], 1.0, "order of nums free"),
    ("<answer>(44 + 19 + 35)</answer>", 98, [44, 19, 35], 1.0, "TinyZero example shape"),
    ("<answer>(6 - 2) / 8 * 4</answer>", 2, [2, 4, 6, 8], 1.0, "four numbers, division"),
    ("<answer>10 / 4 * 2</answer>", 5, [10, 4, 2], 1.0, "fractional intermediate"),
    ("<answer>100 / 3 * 3</answer>", 100, [100, 3, 3], 1.0, "repeated number used twice"),
    ("<answer>1 + 2 + 3</answer>", 7, [1, 2, 3], 0.1, "wrong value"),
    ("<answer>1 + 2</answer>", 3, [1, 2, 3], 0.1, "a number unused"),
    ("<answer>1 + 2 + 3 + 3</answer>", 9, [1, 2, 3], 0.1, "a number used twice"),
    ("<answer>1 + 2 * 4</answer>", 9, [1, 2, 3], 0.1, "a number not available"),
    ("<answer>9</answer>", 9, [1, 2, 3], 0.1, "just the target"),
    ("<answer>(1 + 2) * 3 = 9</answer>", 9, [1, 2, 3], 0.1, "an equation with '=' (9 counted as a number)"),
    ("<answer>(1 + 2) * 3 =</answer>", 9, [1, 2, 3], 0.1, "malformed"),
    ("<answer>(1 + 2 * 3</answer>", 7, [1, 2, 3], 0.1, "unbalanced parenthesis"),
    ("<answer>3 / (2 - 2) + 1</answer>", 9, [3, 2, 2, 1], 0.1, "division by zero"),
    ("<answer>1.5 * 2</answer>", 3, [1, 5, 2], 1.0, "'1.5' reads as 1 and 5 (TinyZero's \\d+), value 3"),
    ("<answer>x + 1 + 2</answer>", 3, [1, 2], 0.1, "a name"),
    ("<answer></answer>", 3, [1, 2], 0.1, "empty answer"),
    ("<answer>1 + 2</answer><answer>1 * 2</answer>", 2, [1, 2], 1.0, "the last answer counts"),
    ("<answer>1 * 2</answer> then <answer>1 + 2</answer>", 2, [1, 2], 0.1, "the last answer counts (wrong)"),
    ("(1 + 2) * 3", 9, [1, 2, 3], 0.0, "no answer tag"),
    ("<answer>(1 + 2) * 3", 9, [1, 2, 3], 0.0, "unclosed tag"),
    ("<answer>\n(1 + 2) * 3\n</answer>", 9, [1, 2, 3], 0.0, "span across lines (TinyZero's regex has no DOTALL)"),
    ("<ANSWER>(1 + 2) * 3</ANSWER>", 9, [1, 2, 3], 0.0, "tags are case-sensitive"),
    ("", 9, [1, 2, 3], 0.0, "empty completion"),
    # Deliberate difference: TinyZero evals `**`; the whitelist refuses it (0.1).
    ("<answer>3 ** 2 * 1</answer>", 9, [3, 2, 1], 0.1, "exponentiation refused"),
]


@pytest.mark.parametrize(("completion", "target", "nums", "expected", "why"), TINYZERO_CASES,
                         ids=[c[4] for c in TINYZERO_CASES])
def test_agrees_with_tinyzero(completion: str, target: int, nums: list[int], expected: float, why: str) -> None:
    assert score(completion, target, nums) == expected
    chat = [{"role": "assistant", "content": completion}]
    assert countdown_reward([None], [chat], target=[target], nums=[nums]) == [expected]


def test_generated_problems_are_solvable_and_in_range() -> None:
    task = load_task("countdown")
    rows = task.test_rows()[:30] + task.train_batch(0, 1, 10)[1]
    from itertools import permutations, product

    def solvable(target: int, nums: list[int]) -> bool:
        for perm in permutations(nums):
            for ops in product("+-*/", repeat=len(nums) - 1):
                # left-deep and right-deep / paired trees cover 3–4 numbers' shapes
                a = [str(x) for x in perm]
                o = list(ops)
                shapes = [f"(({a[0]} {o[0]} {a[1]}) {o[1]} {a[2]})", f"({a[0]} {o[0]} ({a[1]} {o[1]} {a[2]}))"]
                if len(a) == 4:
                    shapes = [f"((({a[0]} {o[0]} {a[1]}) {o[1]} {a[2]}) {o[2]} {a[3]})",
                              f"(({a[0]} {o[0]} {a[1]}) {o[1]} ({a[2]} {o[2]} {a[3]}))",
                              f"({a[0]} {o[0]} (({a[1]} {o[1]} {a[2]}) {o[2]} {a[3]}))",
                              f"({a[0]} {o[0]} ({a[1]} {o[1]} ({a[2]} {o[2]} {a[3]})))",
                              f"(({a[0]} {o[0]} ({a[1]} {o[1]} {a[2]})) {o[2]} {a[3]})"]
                if any(safe_eval(s) == target for s in shapes):
                    return True
        return False

    for row in rows:
        assert 3 <= len(row["nums"]) <= 4 and 1 <= row["target"] <= 100
        assert solvable(row["target"], row["nums"]), row


def test_levels_set_the_number_count() -> None:
    for level, counts in [(0, {3}), (1, {3}), (2, {3, 4}), (3, {4})]:
        rows = load_task({"name": "countdown", "level": level, "test_size": 40}).test_rows()
        assert {len(r["nums"]) for r in rows} == counts
    assert load_task("countdown").level == 2


def test_tinyzero_files_load(tmp_path: Path) -> None:
    task = load_task({"name": "countdown", "path": str(DATA / "countdown.jsonl"), "test_size": 4})
    rows = task.test_rows()
    assert len(rows) == 4 and all(set(r) == {"target", "nums"} for r in rows)
    assert len(rows) + len(task.train_rows()) == 12

    from datasets import Dataset

    raw = [json.loads(line) for line in (DATA / "countdown.jsonl").read_text().splitlines()]
    pq = tmp_path / "train.parquet"
    Dataset.from_list(raw).to_parquet(str(pq))
    assert load_file(pq) == load_file(DATA / "countdown.jsonl")
    task = load_task({"name": "countdown", "path": str(pq), "test_path": str(DATA / "countdown.jsonl")})
    assert len(task.test_rows()) == 12


def test_file_rows_are_checked(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"target": 5, "nums": [1, 4]}\n{"target": 5, "nums": "1,4"}\n')
    with pytest.raises(SeedLedgerError, match=r"bad\.jsonl: row 1: column 'nums'"):
        load_file(bad)
