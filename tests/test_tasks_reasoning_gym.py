"""reasoning_gym:NAME: rows made in the sandbox, deterministic in any process, scored by the
library's own score_answer (also when that scorer evals the answer)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.tasks import load_task
from seedledger.trainers.tasks.reasoning_gym_task import extract_answer
from tests.support.sandbox import need_bwrap

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def knights():
    need_bwrap()
    return load_task({"name": "reasoning_gym", "dataset": "knights_knaves", "test_size": 8}, seed=3)


def tagged(answer: str) -> str:
    return f"<think>hmm</think>\n<answer>{answer}</answer>"


def test_answer_extraction_follows_the_library_multi_line_and_linear():
    assert extract_answer("a <answer> x\ny </answer> b") == "x\ny"
    assert extract_answer("<answer>1</answer> then <answer>2</answer>") == "2"
    assert extract_answer("<answer>unclosed") is None and extract_answer("no tags") is None
    assert extract_answer("<answer>" * 100_000 + "</answer>") == ""


def test_rows_splits_and_batches_are_deterministic(knights):
    again = load_task({"name": "reasoning_gym", "dataset": "knights_knaves", "test_size": 8}, seed=3)
    assert [r["question"] for r in knights.test_rows()[:8]] == [r["question"] for r in again.test_rows()[:8]]
    idx, rows = knights.train_batch(3, 2, 4)
    idx2, rows2 = again.train_batch(3, 2, 4)
    assert idx == idx2 and rows == rows2
    assert {r["split"] for r in rows} == {"train"}
    assert not {r["question"] for r in rows} & {r["question"] for r in knights.test_rows()[:8]}
    assert knights.describe()["train_seed"] != knights.describe()["test_seed"]


def test_scores_are_the_librarys_own(knights):
    import reasoning_gym

    info = knights.describe()
    ds = reasoning_gym.create_dataset("knights_knaves", seed=info["test_seed"], size=8)
    rows = knights.test_rows()[:4]
    completions = [tagged(rows[0]["answer"]), "no tag at all", tagged("\n" + rows[2]["answer"] + "\n"),
                   tagged(rows[3]["answer"].replace("knight", "knave").replace("hero", "villain"))]
    rewards, comps = knights.reward([knights.prompt(r) for r in rows], completions, rows)
    expected = [ds.score_answer(extract_answer(c), ds[i]) for i, c in enumerate(completions)]
    assert rewards == expected and rewards[:3] == [1.0, 0.0, 1.0]
    assert comps == {"knights_knaves": rewards}
    assert knights.prompt(rows[0])[0]["content"].startswith("Given a problem, your task is")


@pytest.mark.parametrize("spec", ["reasoning_gym:chain_sum", "reasoning_gym:gsm_symbolic",
                                  {"name": "reasoning_gym", "dataset": "zebra_puzzles", "test_size": 3,
                                   "options": {"num_people": 2, "num_characteristics": 2}}])
def test_math_and_logic_generators_score_their_own_answers(spec):
    need_bwrap()
    task = load_task(spec)
    rows = task.test_rows()[:3]
    rewards, _ = task.reward([None] * 3, [tagged(r["answer"]) for r in rows[:2]] + [tagged("wrong")], rows)
    assert rewards == [1.0, 1.0, 0.0]


@pytest.mark.slow
def test_a_scorer_that_evals_the_answer_runs_it_only_in_the_sandbox(tmp_path):
    """string_insertion's score_answer evals the answer: a hostile one reaches nothing."""
    need_bwrap()
    task = load_task({"name": "reasoning_gym", "dataset": "string_insertion", "test_size": 2})
    row = task.test_rows()[0]
    marker = tmp_path / "pwned"
    hostile = [f"__import__('os').system('touch {marker}')", "[__import__('time').sleep(0) or c for c in 'x' * 10**9]",
               row["answer"]]
    rewards, _ = task.reward([None] * 3, [tagged(h) for h in hostile], [row] * 3)
    assert rewards == [0.0, 0.0, 1.0] and not marker.exists()


@pytest.mark.slow
def test_rows_do_not_depend_on_the_hosts_hash_seed():
    """word_ladder's generator iterates sets of strings: made in the sandbox (fixed hash
    seed) its rows are the same whatever PYTHONHASHSEED the training process has."""
    need_bwrap()
    code = ("import json; from seedledger.trainers.tasks import load_task; "
            "t = load_task({'name': 'reasoning_gym', 'dataset': 'word_ladder', 'test_size': 6}); "
            "print(json.dumps([r['question'] for r in t.test_rows()[:6]]))")
    outs = []
    for seed in ("1", "2"):
        env = os.environ | {"PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        outs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("spec, message", [
    ("reasoning_gym:no_such_task",
     "task reasoning_gym:no_such_task: ValueError: Dataset 'no_such_task' not registered"),
    ({"name": "reasoning_gym", "dataset": "chain_sum", "options": {"bogus": 1}}, "unexpected keyword argument 'bogus'"),
    ({"name": "reasoning_gym", "dataset": "chain_sum", "options": {"seed": 1}}, "without seed and size"),
    ({"name": "reasoning_gym", "dataset": "chain_sum", "test_size": 0}, "test_size must be a positive integer"),
    ("reasoning_gym:", "expected a generator name"),
])
def test_bad_input_is_a_one_line_error(spec, message):
    need_bwrap()
    with pytest.raises(SeedLedgerError, match=None) as err:
        load_task(spec)
    assert message in str(err.value) and "\n" not in str(err.value)
