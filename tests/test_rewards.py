"""Reward functions: TRL-style combination, loading user functions, format / length /
pass@k shaping, curriculum."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards import (
    Curriculum,
    WeightedReward,
    combine,
    format_reward,
    format_score,
    length_penalty,
    load_reward_fn,
    mean_components,
    pass_at_k,
    pass_at_k_rewards,
    success_rate,
)
from seedledger.trainers.rewards.answers import extract_tag, last_number, parse_number
from seedledger.trainers.tasks import build_rewards, load_task

DATA = Path(__file__).parent / "data"


def test_combine_weights_and_none_like_trl() -> None:
    a = WeightedReward("a", lambda prompts, completions, **kw: [1.0, None, 0.5], 2.0)
    b = WeightedReward("b", lambda prompts, completions, **kw: [None, None, 1.0], 0.5)
    total, comps = combine([a, b], ["p"] * 3, ["x", "y", "z"], {})
    assert total == [2.0, 0.0, 1.5]
    assert comps == {"a": [1.0, None, 0.5], "b": [None, None, 1.0]}
    assert mean_components(comps) == {"a": 0.75, "b": 1.0}


def test_reward_functions_receive_columns_as_keywords() -> None:
    seen = {}

    def fn(prompts, completions, answer, extra, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.update(prompts=prompts, completions=completions, answer=answer, extra=extra, kw=kwargs)
        return [0.0] * len(completions)

    task = load_task("arithmetic")
    task.rewards = [WeightedReward("fn", fn)]
    rows = [{"question": "q", "answer": 1, "extra": "e", "prompt": "ignored", "_private": 1}]
    task.reward([[{"role": "user", "content": "q"}]], ["out"], rows)
    assert seen["completions"] == [[{"role": "assistant", "content": "out"}]]
    assert seen["answer"] == [1] and seen["extra"] == ["e"] and seen["kw"] == {"question": ["q"]}


def test_user_functions_load_by_module_and_by_path(monkeypatch: pytest.MonkeyPatch) -> None:
    by_path = load_reward_fn("tests/data/user_reward.py:shout", base_dir=Path(__file__).parents[1])
    assert by_path(None, ["HI", "hi", ""]) == [1.0, 0.0, None]
    monkeypatch.syspath_prepend(str(DATA))
    by_module = load_reward_fn("user_reward:shout")
    assert by_module(None, ["OK"]) == [1.0]


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("nocolon", "expected 'module:function'"),
        ("no_such_module_xyz:f", "cannot import module"),
        ("tests/data/missing.py:f", "no such file"),
        ("tests/data/user_reward.py:nope", "has no function 'nope'"),
    ],
)
def test_bad_user_function_refs_are_one_line_errors(ref: str, message: str) -> None:
    with pytest.raises(SeedLedgerError, match=message) as err:
        load_reward_fn(ref, base_dir=Path(__file__).parents[1])
    assert "\n" not in str(err.value)


def test_misbehaving_user_functions_are_reported() -> None:
    base = Path(__file__).parents[1]
    for name, message in [("broken", "raised RuntimeError"), ("too_short", "returned 1 values for 2")]:
        fn = load_reward_fn(f"tests/data/user_reward.py:{name}", base_dir=base)
        with pytest.raises(SeedLedgerError, match=message):
            combine([WeightedReward(name, fn)], ["p", "p"], ["a", "b"], {})


def test_config_reward_lists() -> None:
    spec = {
        "name": "arithmetic",
        "rewards": [
            {"fn": "task", "weight": 2.0},
            {"fn": "format", "weight": 0.1, "think_start": None, "think_end": None},
            {"fn": "length", "limit": 10, "weight": 1.0},
            {"fn": "tests/data/user_reward.py:shout", "name": "shout", "weight": 0.5},
        ],
    }
    task = load_task(spec, base_dir=Path(__file__).parents[1])
    assert [(r.name, r.weight) for r in task.rewards] == [
        ("arithmetic", 2.0), ("format", 0.1), ("length", 1.0), ("shout", 0.5)]
    row = task.test_rows()[0]
    good = f"<answer>{row['answer']}</answer>"
    total, comps = task.reward([task.prompt(row)], [good], [row])
    length = -min(1.0, (len(good) - 10) / 10)
    assert comps == {"arithmetic": [1.0], "format": [1.0], "length": [length], "shout": [0.0]}
    assert total == [pytest.approx(2.0 + 0.1 + length)]
    json.dumps(task.describe())
    with pytest.raises(SeedLedgerError, match="component names repeat"):
        build_rewards(["task", "task"], task.rewards)
    with pytest.raises(SeedLedgerError, match="format"):
        build_rewards([{"fn": "format", "bogus": 1}], task.rewards)


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("<think>a</think> <answer>b</answer>", 1.0),
        ("  <think>\nx\n</think>\nmiddle text\n<answer>7</answer>\n", 1.0),
        ("<answer>b</answer>", 0.25),
        ("<think>a</think>", 0.25),
        ("prefix <think>a</think><answer>b</answer>", 0.5),
        ("<think>a</think><answer>b</answer> suffix", 0.5),
        ("<answer>b</answer><think>a</think>", 0.25),
        ("<think>a</think><think>a</think><answer>b</answer>", 0.25),
        ("", 0.0),
    ],
)
def test_format_layout(text: str, score: float) -> None:
    assert format_score(text, ["<think>", "</think>", "<answer>", "</answer>"]) == score


def test_format_parts_are_optional() -> None:
    answer_only = format_reward(think_start=None, think_end=None)
    assert answer_only(None, ["<answer>1</answer>", "<think>x</think><answer>1</answer>"]) == [1.0, 0.5]
    custom = format_reward("<reasoning>", "</reasoning>", "<final>", "</final>", partial=0.0)
    assert custom(None, ["<reasoning>r</reasoning><final>f</final>", "<final>f</final>"]) == [1.0, 0.0]
    assert format_reward(None, None, None, None)(None, ["anything"]) == [1.0]


def test_length_penalty() -> None:
    fn = length_penalty(10, scale=0.5)
    assert fn(None, ["x" * 5, "x" * 10, "x" * 15, "x" * 100]) == [0.0, 0.0, -0.25, -0.5]
    words = length_penalty(2, unit="words")
    assert words(None, [[{"role": "assistant", "content": "one two three"}]]) == [-0.5]
    with pytest.raises(ValueError):
        length_penalty(0)


def _pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_unbiased_estimator(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = 1 - math.comb(n - c, k) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
            assert pass_at_k(n, c, k) == pytest.approx(_pass_at_k_by_enumeration(n, c, k), abs=1e-12)


def test_pass_at_k_rewards_per_prompt_group() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0, 0.1, 0.0, 1.0, 1.0]
    assert pass_at_k_rewards(rewards, n=4, k=1) == [0.25] * 4 + [0.5] * 4
    assert pass_at_k_rewards(rewards, n=4, k=2) == pytest.approx([0.5] * 4 + [5 / 6] * 4)
    with pytest.raises(ValueError):
        pass_at_k_rewards(rewards, n=3, k=1)


def test_curriculum_moves_and_records() -> None:
    cur = Curriculum(levels=3, window=2, raise_above=0.7, lower_below=0.2)
    assert cur.observe(1, 0.9) is None
    change = cur.observe(2, 0.8)
    assert change == {"kind": "curriculum", "generation": 2, "from_level": 0, "to_level": 1,
                      "success_rate": pytest.approx(0.85), "window": 2}
    assert cur.observe(3, 0.5) is None and cur.observe(4, 0.5) is None
    assert cur.observe(5, 0.0) is None  # window [0.5, 0.0]: mean 0.25 stays
    assert cur.observe(6, 0.0)["to_level"] == 0
    json.dumps(cur.describe())
    assert success_rate([1.0, 0.1, 1.0, 0.0]) == 0.5


def test_curriculum_is_a_function_of_the_rates() -> None:
    rates = [0.9, 0.8, 0.95, 0.75, 0.9, 0.1, 0.0, 0.1, 0.9]
    runs = []
    for _ in range(2):
        cur = Curriculum(levels=4, window=2)
        runs.append([cur.observe(g, r) for g, r in enumerate(rates, 1)])
    assert runs[0] == runs[1]
    task = load_task("arithmetic")
    cur = Curriculum(levels=task.levels, level=task.level, window=1)
    change = cur.observe(1, 1.0)
    task.set_level(change["to_level"])
    assert task.level == 2 and task.train_batch(0, 1, 4)[1] != load_task("arithmetic").train_batch(0, 1, 4)[1]
    with pytest.raises(SeedLedgerError):
        task.set_level(99)


def test_answer_helpers() -> None:
    assert extract_tag("a <answer> 1 </answer> b <answer>2</answer>") == "2"
    assert extract_tag("<answer>x\n</answer>") is None
    assert extract_tag("<answer>" * 20_000) is None
    assert parse_number("$1,234.50") == parse_number("1234.5")
    assert parse_number("3/4") == parse_number("0.75")
    assert parse_number("50%") == 50 and parse_number("7.") == 7
    assert parse_number("abc") is None and parse_number("1" * 100) is None
    assert last_number("it is 1,000 or -3.5 apples") == parse_number("-3.5")


def test_user_reward_modules_have_a_stable_name(tmp_path: Path) -> None:
    """The module a reward file is imported as is named from its path alone, the same in
    every process (``hash()`` of a str is salted per process)."""
    import os
    import subprocess
    import sys

    root = str(Path(__file__).parents[1])
    code = (
        "from seedledger.trainers.rewards import load_reward_fn;"
        f"print(load_reward_fn('tests/data/user_reward.py:shout', base_dir={root!r}).__module__)"
    )
    names = set()
    for salt in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": salt}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             cwd=Path(__file__).parents[1], check=True)
        names.add(out.stdout.strip())
    here = load_reward_fn("tests/data/user_reward.py:shout", base_dir=Path(__file__).parents[1]).__module__
    assert names == {here} and here.startswith("_seedledger_user_reward_")


def test_curriculum_refuses_bounds_and_single_levels() -> None:
    with pytest.raises(ValueError, match="at least 2 levels"):
        Curriculum(levels=1)
    with pytest.raises(ValueError, match="lower_below < raise_above"):
        Curriculum(levels=3, raise_above=0.3, lower_below=0.3)
    with pytest.raises(ValueError, match="lower_below < raise_above"):
        Curriculum(levels=3, raise_above=1.5)
