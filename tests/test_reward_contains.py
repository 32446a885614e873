"""The `contains` reward: 1.0 for the reference alone (the jsonl task's exact-match verdict),
partial credit scaled by brevity for the reference stated as a whole word in more text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.rewards.contains import contains_reward, contains_score
from seedledger.trainers.tasks import load_task

WORDS = Path(__file__).parents[1] / "engine" / "configs" / "data" / "words.jsonl"


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("trees", 1.0),
        ("  trees \n", 1.0),
        ("<answer>trees</answer>", 1.0),  # the tagged span is the answer, as the task reads it
        ("Trees", 0.0),  # case matters unless casefold
        ("trees.", 0.5 * 5 / 6),
        ("'trees'", 0.5 * 5 / 7),
        ("The plural of 'tree' is 'trees'.", 0.5 * 5 / 32),
        ("The plural of 'tree' is 'treess'.", 0.0),  # not the word: a longer one
        ("subtrees", 0.0),
        ("trees_x", 0.0),
        ("tree", 0.0),
        ("<answer>tree</answer> trees", 0.0),  # the tagged span is judged, not the text around it
        ("", 0.0),
    ],
)
def test_contains_scores_the_answer_alone_and_brevity(text: str, score: float) -> None:
    assert contains_score(text, "trees") == pytest.approx(score)


def test_casefold_and_whitespace_follow_the_exact_match_rule() -> None:
    assert contains_score("Trees", "trees", casefold=True) == 1.0
    assert contains_score("New   York", "new york", casefold=True) == 1.0
    assert contains_score("It is  New\nYork.", "new york", casefold=True) == pytest.approx(0.5 * 8 / 15)
    assert contains_score("hot", "", casefold=True) == 0.0  # an empty reference matches nothing
    assert contains_score("x", "x", partial=0.0) == 1.0 and contains_score("x.", "x", partial=0.0) == 0.0


def test_full_credit_is_exactly_the_jsonl_tasks_verdict() -> None:
    """Every completion gets 1.0 from `contains` if and only if the task's exact match passes."""
    task = load_task({"name": "jsonl", "path": str(WORDS), "casefold": True,
                      "rewards": [{"fn": "contains", "casefold": True}, "task"]})
    rows = task.test_rows()[:6]
    completions = []
    for row in rows:
        word = row["answer"]
        completions += [word, word.upper(), f"<answer>{word}</answer>", f"{word}.", f"It is {word}", "zzz"]
    many = [r for r in rows for _ in range(6)]
    _, parts = task.reward([task.prompt(r) for r in many], completions, many)
    assert [c == 1.0 for c in parts["contains"]] == [e == 1.0 for e in parts["exact_match"]]
    assert sum(parts["exact_match"]) == 3 * len(rows)
    assert all(0.0 < c < 0.5 for c, e in zip(parts["contains"], parts["exact_match"], strict=True)
               if e == 0.0 and c)


def test_reward_function_reads_its_column_and_skips_missing_cells() -> None:
    fn = contains_reward(column="gold", partial=0.4)
    got = fn([None] * 3, [[{"role": "assistant", "content": "cats"}], "a cats", "x"], gold=["cats", "cats", None])
    assert got == [1.0, pytest.approx(0.4 * 4 / 6), None]
    with pytest.raises(SeedLedgerError, match="no column 'gold'"):
        fn([None], ["cats"], answer=["cats"])


def test_config_options_are_checked_when_the_config_loads() -> None:
    spec = {"name": "jsonl", "path": str(WORDS)}
    with pytest.raises(SeedLedgerError, match=r"rewards\[0\] \(contains\): unknown option 'partal'"):
        load_task({**spec, "rewards": [{"fn": "contains", "partal": 0.2}]})
    with pytest.raises(SeedLedgerError, match=r"rewards\[0\] \(contains\): partial"):
        load_task({**spec, "rewards": [{"fn": "contains", "partial": 2.0}]})


def test_a_hostile_completion_costs_little() -> None:
    text = "tree " * 20_000 + "x" * 100_000
    started = time.perf_counter()
    assert contains_score(text, "trees") == 0.0
    assert contains_score("a" * 100_000, "a" * 50) == 0.0  # overlapping near-misses
    assert time.perf_counter() - started < 2.0
