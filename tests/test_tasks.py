"""Tasks: deterministic splits and batches, the Task surface, math / jsonl / mix, and
one-line errors for bad datasets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.tasks import MixtureTask, load_task
from seedledger.trainers.tasks.arithmetic import arithmetic_reward, number_reward
from seedledger.trainers.tasks.math_task import math_reward
from seedledger.trainers.tasks.sampling import mix64, split_indices, stream

DATA = Path(__file__).parent / "data"
GSM = str(DATA / "gsm8k.jsonl")
QA = str(DATA / "qa.jsonl")


def test_sampling_is_pinned() -> None:
    # Golden values: batches must not change between versions (replay, resume).
    assert mix64(0) == 0x6E789E6AA1B965F4
    assert stream(10, 7, 0, 12) == [5, 7, 9, 8, 6, 0, 4, 2, 1, 3, 9, 4]
    assert split_indices(10, 3, 0) == ([1, 2, 3, 6, 7, 8, 9], [0, 4, 5])


def test_stream_covers_each_epoch_once() -> None:
    first = stream(50, 3, 0, 50)
    assert sorted(first) == list(range(50))
    assert stream(50, 3, 20, 10) == first[20:30]
    assert sorted(stream(50, 3, 50, 50)) == list(range(50)) and stream(50, 3, 50, 50) != first


@pytest.mark.parametrize("spec", ["arithmetic", "countdown", f"math:{GSM}", f"jsonl:{QA}",
                                  {"mix": [{"task": "arithmetic", "weight": 3}, "countdown"]}])
def test_task_surface_is_deterministic(spec: object) -> None:
    small = {"test_size": 2} if isinstance(spec, str) and ":" in spec else {}
    if small:
        name, _, path = spec.partition(":")
        spec = {"name": name, "path": path, **small}
    a, b = load_task(spec, seed=1), load_task(spec, seed=1)
    assert a.test_rows() == b.test_rows() and a.test_rows()
    for g in (1, 2, 50):
        ia, ra = a.train_batch(11, g, 4)
        ib, rb = b.train_batch(11, g, 4)
        assert (ia, ra) == (ib, rb) and len(ia) == len(ra) == 4
    assert a.train_batch(11, 1, 4) != a.train_batch(11, 2, 4)
    assert a.train_batch(11, 1, 4) != a.train_batch(12, 1, 4)
    rows = a.test_rows()[:3]
    prompts = [a.prompt(r) for r in rows]
    assert all(isinstance(m["role"], str) and isinstance(m["content"], str) for p in prompts for m in p)
    rewards, comps = a.reward(prompts, ["<answer>1</answer>"] * len(rows), rows)
    assert len(rewards) == len(rows) and all(len(v) == len(rows) for v in comps.values())
    json.dumps(a.describe())
    assert a.name


def test_test_split_is_kept_out_of_training() -> None:
    for name in ("arithmetic", "countdown"):
        task = load_task(name)
        key = (lambda r: r["question"]) if name == "arithmetic" else (lambda r: (r["target"], tuple(sorted(r["nums"]))))
        test = {key(r) for r in task.test_rows()}
        assert not test & {key(r) for r in task.train_rows()}
    math = load_task({"name": "math", "path": GSM, "test_size": 2})
    assert len(math.test_rows()) == 2 and len(math.train_rows()) == 4
    assert not {r["question"] for r in math.test_rows()} & {r["question"] for r in math.train_rows()}


def test_the_test_split_does_not_depend_on_the_run_seed() -> None:
    assert load_task("countdown", seed=0).test_rows() == load_task("countdown", seed=9).test_rows()
    assert load_task({"name": "countdown", "data_seed": 1}).test_rows() != load_task("countdown").test_rows()


def test_arithmetic_reward_and_prompt() -> None:
    completions = ["<answer>16</answer>", "12 + 4 = 16", "16", "<answer>15</answer>",
                   "12 + 4 = 15", "To add 12 and 4 we get 16", "", "<answer>16</answer> = 3"]
    assert arithmetic_reward(None, completions, [16] * len(completions)) == [
        1.0, 0.5, 0.5, 0.1, 0.0, 0.0, 0.0, 1.0]
    task = load_task("arithmetic")
    msgs = task.prompt(task.test_rows()[0])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert task.max_new_tokens <= 32
    assert all(isinstance(r["answer"], int) for r in task.test_rows())


def test_the_number_check_credits_the_right_number_in_any_form_and_nothing_else() -> None:
    completions = ["<answer>16</answer>", "12 + 4 = 16", "16", "16</answer>", "<answer>15</answer>",
                   "12 + 4 = 15", "To add 12 and 4 we get 16", "", "<answer>15</answer> 16", "16\n12 + 4 = 15"]
    assert number_reward(None, completions, [16] * len(completions)) == [
        1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    tags, number = load_task("arithmetic"), load_task({"name": "arithmetic", "check": "number"})
    assert [r.name for r in number.own_rewards] == ["right_number"] and number.rewards == number.own_rewards
    assert [r.name for r in tags.own_rewards] == ["arithmetic"], "the default check is unchanged"
    assert number.test_rows() == tags.test_rows() and number.train_rows() == tags.train_rows()
    with pytest.raises(SeedLedgerError, match="check 'numbers' is not one of tags, number"):
        load_task({"name": "arithmetic", "check": "numbers"})


def test_math_answers_are_normalized() -> None:
    golds = ["#### 7", "#### 1,000", "#### 4.5", "#### -2", "#### 7", "#### 7"]
    completions = ["so <answer>7</answer>", "The price is $1,000.", "#### 4.50", "-2",
                   "<answer>8</answer> 7", "#### seven"]
    assert math_reward(None, completions, golds) == [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]


def test_jsonl_exact_regex_numeric(tmp_path: Path) -> None:
    task = load_task({"name": "jsonl", "path": QA, "test_size": 2, "casefold": True})
    rows = [{"prompt": "p", "answer": "Paris"}] * 3
    rewards, comps = task.reward(["p"] * 3, ["<answer> paris </answer>", "PARIS", "Rome"], rows)
    assert rewards == [1.0, 1.0, 0.0] and list(comps) == ["exact_match"]
    chat_row = next(r for r in task.train_rows() + task.test_rows() if isinstance(r["prompt"], list))
    assert task.prompt(chat_row) == [{"role": "user", "content": "Say hello"}]

    rx = tmp_path / "rx.jsonl"
    rx.write_text("\n".join(json.dumps({"q": f"q{i}", "a": r"\d+ apples?"}) for i in range(4)))
    task = load_task({"name": "jsonl", "path": str(rx), "prompt_column": "q", "answer_column": "a",
                      "match": "regex", "test_size": 1, "system": "Be brief."})
    rows = task.test_rows() * 3
    assert task.reward(["p"] * 3, ["3 apples", "apples", "<answer>1 apple</answer>"], rows)[0] == [1.0, 0.0, 1.0]
    assert task.prompt(rows[0])[0] == {"role": "system", "content": "Be brief."}


def test_mix_follows_weights_and_routes_rewards() -> None:
    task = load_task({"mix": [{"task": "arithmetic", "weight": 3}, {"task": "countdown", "weight": 1}]})
    assert isinstance(task, MixtureTask)
    picked = [r["_task"] for g in range(1, 101) for r in task.train_batch(0, g, 8)[1]]
    share = picked.count(0) / len(picked)
    assert 0.7 < share < 0.8
    indices, rows = task.train_batch(0, 3, 8)
    n_arith = len(task.tasks[0].train_rows())
    assert all((i < n_arith) == (r["_task"] == 0) for i, r in zip(indices, rows, strict=True))
    arith = next(r for r in rows if r["_task"] == 0)
    cd = next(r for r in task.test_rows() if r["_task"] == 1)
    rewards, comps = task.reward([task.prompt(arith), task.prompt(cd)],
                                 [f"<answer>{arith['answer']}</answer>", "<answer>1</answer>"], [arith, cd])
    assert rewards == [1.0, 0.1]
    assert comps == {"arithmetic": [1.0, None], "countdown": [None, 0.1]}
    assert "Countdown" not in task.prompt(cd)[0]["content"] and "numbers" in task.prompt(cd)[1]["content"]


BAD_DATASETS = [
    ("missing.jsonl", None, r"missing\.jsonl: no such dataset file"),
    ("empty.jsonl", "", r"empty\.jsonl: dataset is empty"),
    ("wrongcol.jsonl", '{"question": "q", "answer": "#### 1"}\n{"quest": "q", "answer": "#### 2"}\n',
     r"wrongcol\.jsonl: row 1: missing column 'question' \(columns: answer, quest\)"),
    ("malformed.jsonl", '{"question": "q", "answer": "#### 1"}\n{"question": "q", "answer": \n',
     r"malformed\.jsonl: row 1 \(line 2\): malformed JSON"),
    ("notobj.jsonl", '[1, 2]\n', r"notobj\.jsonl: row 0 \(line 1\): expected a JSON object"),
    ("noanswer.jsonl", '{"question": "q", "answer": "no hashes"}\n',
     r"noanswer\.jsonl: row 0: column 'answer': no number after '####'"),
    ("badtype.jsonl", '{"question": 5, "answer": "#### 1"}\n',
     r"badtype\.jsonl: row 0: column 'question': expected non-empty text, got 5"),
    ("small.jsonl", '{"question": "q", "answer": "#### 1"}\n',
     r"small\.jsonl: cannot split 1 rows into train and test"),
    ("data.csv", "a,b\n", r"data\.csv: unknown dataset format"),
]


@pytest.mark.parametrize(("name", "content", "message"), BAD_DATASETS, ids=[b[0] for b in BAD_DATASETS])
def test_bad_datasets_are_one_line_errors(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(SeedLedgerError, match=message) as err:
        load_task({"name": "math", "path": str(path), "test_size": 1})
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_bad_parquet_and_empty_test_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(SeedLedgerError, match=r"bad\.parquet: cannot read parquet"):
        load_task({"name": "countdown", "path": str(bad)})
    empty = tmp_path / "test.jsonl"
    empty.write_text("\n")
    with pytest.raises(SeedLedgerError, match=r"test\.jsonl: dataset is empty"):
        load_task({"name": "countdown", "path": str(DATA / "countdown.jsonl"), "test_path": str(empty)})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nosuch", "unknown task 'nosuch'"),
        ({"name": "arithmetic", "levle": 2}, r"unknown options \['levle'\]"),
        ({"name": "arithmetic", "level": 9}, "level 9 outside"),
        ("math", "needs a file"),
        ({"mix": []}, "non-empty list"),
        ({"mix": [{"task": "arithmetic", "weight": "x"}]}, "is not a number"),
        ({"mix": [{"task": "arithmetic", "weight": 0}]}, "positive sum"),
        (42, "expected a name"),
        ({"name": "jsonl", "path": QA, "match": "fuzzy", "test_size": 1}, "match must be one of"),
    ],
)
def test_bad_specs(spec: object, message: str) -> None:
    with pytest.raises(SeedLedgerError, match=message):
        load_task(spec)


def test_math_answer_zero_is_an_answer() -> None:
    """``Fraction(0)`` is falsy: ``parse_number(tail) or last_number(tail)`` threw a right 0
    away and read the last number of the tail instead (3 in ``0/3``)."""
    from seedledger.trainers.tasks.math_task import model_answer

    assert model_answer("#### 0/3") == 0
    assert math_reward(None, ["#### 0/3", "#### 0", "<answer>0</answer>", "#### 0.0", "#### 3"],
                       ["#### 0"] * 5) == [1.0, 1.0, 1.0, 1.0, 0.0]


def _regex_task(tmp_path: Path, patterns: list[str], **opts: object):
    rx = tmp_path / "rx.jsonl"
    rx.write_text("\n".join(json.dumps({"q": f"q{i}", "a": p}) for i, p in enumerate(patterns)) + "\n")
    return load_task({"name": "jsonl", "path": str(rx), "prompt_column": "q", "answer_column": "a",
                      "match": "regex", "test_size": 1, **opts})


def test_jsonl_regex_patterns_compile_once_and_cap_the_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from seedledger.trainers.tasks import jsonl_task

    task = _regex_task(tmp_path, [r"a*", r"\d+ apples?", r"a*"], casefold=True)

    def no_compiling(*args: object, **kwargs: object) -> None:
        raise AssertionError("a dataset pattern was compiled or matched by text after load")

    monkeypatch.setattr(jsonl_task, "compile_pattern", no_compiling)
    monkeypatch.setattr(re, "fullmatch", no_compiling)
    rows = [{"q": "q", "a": r"a*"}] * 3 + [{"q": "q", "a": r"\d+ apples?"}]
    cap = jsonl_task.MAX_REGEX_TEXT
    completions = ["A" * cap, "a" * (cap + 1), "<answer>aaa</answer>", "3 APPLES"]
    rewards, _ = task.reward(["p"] * 4, completions, rows)
    assert rewards == [1.0, 0.0, 1.0, 1.0]  # the answer over the cap is not matched at all


@pytest.mark.parametrize("bad", ["(unclosed", "a{2,1}", "*x", "(?P<n>a)(?P<n>b)"])
def test_jsonl_invalid_regex_is_a_one_line_error_naming_file_row_column(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SeedLedgerError, match=r"rx\.jsonl: row 2: column 'a': bad regex: ") as err:
        _regex_task(tmp_path, [r"\d+", r"ok", bad, r"x"])
    assert "\n" not in str(err.value) and err.value.exit_code == 2


def test_mix_test_rows_interleave_by_weight() -> None:
    """Held-out evaluation scores ``test_rows()[:rows]``: every prefix must hold the tasks
    by weight (before, the first task's rows all came first)."""
    spec = {"mix": [{"task": {"name": "arithmetic", "test_size": 30}, "weight": 3},
                    {"task": {"name": "countdown", "test_size": 30}, "weight": 1}]}
    task = load_task(spec)
    rows = task.test_rows()
    assert rows == load_task(spec).test_rows()  # deterministic
    assert len(rows) == 60
    assert [r["_task"] for r in rows[:8]] == [0, 0, 0, 1, 0, 0, 0, 1]
    for n in (4, 20, 40):
        assert sum(r["_task"] == 1 for r in rows[:n]) == n // 4
    # every row of each task once, in the task's own order; the rest of task 0 after 1 ran out
    for i, sub in enumerate(task.tasks):
        assert [{k: v for k, v in r.items() if k != "_task"} for r in rows if r["_task"] == i] == sub.test_rows()
    zero = load_task({"mix": [{"task": {"name": "arithmetic", "test_size": 3}, "weight": 0},
                              {"task": {"name": "countdown", "test_size": 3}, "weight": 1}]})
    assert [r["_task"] for r in zero.test_rows()] == [1, 1, 1, 0, 0, 0]
