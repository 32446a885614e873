"""Your own data: a small JSONL file trains with the defaults (a fifth held out), the string
form carries options (`jsonl:PATH?test_size=8`, `--set task.test_size=8`), files too small
to split are one line, and a generation without signal says what to change for the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from test_cli_walkthrough import Cli

import seedledger.engine.api as sl
from seedledger.engine.config import load_config
from seedledger.engine.runtime.scoring.no_signal import advice
from seedledger.ledger.errors import SeedLedgerError
from seedledger.trainers.tasks import load_task
from seedledger.trainers.tasks.jsonl_task import default_test_size
from seedledger.trainers.tasks.sampling import split_indices
from tests.support.configs import TINY


def write_qa(path: Path, rows: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n")
    return path


@pytest.fixture
def qa30(tmp_path: Path) -> Path:
    return write_qa(tmp_path / "qa.jsonl", 30)


def test_default_split_holds_out_a_fifth_of_small_files_and_100_as_before() -> None:
    sizes = (2, 4, 5, 30, 100, 101, 499, 10_000)
    assert [default_test_size(n) for n in sizes] == [1, 1, 1, 6, 20, 100, 100, 100]


def test_a_30_row_file_trains_with_the_defaults(tmp_path: Path, qa30: Path) -> None:
    task = load_task(f"jsonl:{qa30}")
    assert (task.describe()["train_size"], task.describe()["test_size"]) == (24, 6)
    config = {**TINY, "task": f"jsonl:{qa30}", "generations": 1}
    result = sl.train(config, run="mine", ledger=tmp_path / "l.db")
    assert [r.index for r in result.records] == [1]


def test_an_explicit_test_size_splits_as_before(tmp_path: Path) -> None:
    rows = write_qa(tmp_path / "big.jsonl", 600)
    explicit = load_task({"name": "jsonl", "path": str(rows), "test_size": 100})
    default = load_task(f"jsonl:{rows}")
    assert explicit.test_rows() == default.test_rows()  # 600 rows: the default is the old 100
    _, test = split_indices(600, 100, 0)
    assert [r["answer"] for r in explicit.test_rows()] == [str(i + 1) for i in test]


def test_string_form_options_and_set_on_a_string_form(tmp_path: Path, qa30: Path) -> None:
    task = load_task(f"jsonl:{qa30}?test_size=8&match=numeric&system=Answer briefly.")
    info = task.describe()
    assert (info["test_size"], info["match"], info["system"]) == (8, "numeric", "Answer briefly.")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**TINY, "task": "jsonl:qa.jsonl"}))
    cfg = load_config(tmp_path / "c.yaml", ["task.test_size=8"])
    assert cfg.task == {"name": "jsonl", "path": str(qa30), "test_size": 8}
    assert load_task(cfg.task).describe()["test_size"] == 8
    cfg = load_config(tmp_path / "c.yaml", ["task=jsonl:qa.jsonl?test_size=7", "task.match=numeric"])
    assert cfg.task["test_size"] == 7 and cfg.task["match"] == "numeric"
    assert load_config(tmp_path / "c.yaml").task == f"jsonl:{qa30}", "a plain string form stays a string"


@pytest.mark.parametrize(
    ("rows", "extra", "message"),
    [
        (1, [], "cannot split 1 row into train and test: a jsonl task needs at least 2 rows"),
        (30, ["--set", "task.test_size=30"], "test_size 30 leaves no training rows of 30 (set it below 30"),
        (30, ["--set", "task.test_size=100000"], "test_size must be a positive integer at most 10_000"),
        (30, ["--set", "task=jsonl:qa.jsonl?rewards=[task]"], "'rewards' cannot be given after '?'"),
        (30, ["--set", "task.tset_size=3"], "unknown options ['tset_size']"),
    ],
)
def test_bad_splits_and_options_are_one_line(tmp_path: Path, rows: int, extra: list[str], message: str) -> None:
    write_qa(tmp_path / "qa.jsonl", rows)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**TINY, "task": "jsonl:qa.jsonl", "generations": 1}))
    line = Cli(tmp_path).bad("train", "c.yaml", "--run", "r", *extra)
    assert message in line, line
    assert "unknown task" not in line


def test_advice_names_values_for_the_run_kind(tmp_path: Path, qa30: Path) -> None:
    lora = load_config(None, ["model=tiny", "train=lora", "sigma=0.001", "batch_size=16"])
    text = advice(lora, 0.001)
    assert "sigma: 0.01 (now 0.001, lora noise)" in text and "batch_size: 32 (now 16" in text
    assert "sampling: {temperature: 0.7} (now greedy)" in text and "`loglik`" in text
    sampled = load_config(None, ["model=tiny", "sigma=0.004", "sampling.temperature=0.8",
                                 f"task={{name: jsonl, path: {qa30}, rewards: [loglik]}}"])
    text = advice(sampled, 0.004)
    assert "sigma: 0.01 (now 0.004, full noise)" in text
    assert "sampling" not in text and "loglik" not in text


def test_a_generation_without_signal_says_what_to_change(tmp_path: Path) -> None:
    # σ so small on `tiny` that every member decodes what the master decodes: a real tie
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**TINY, "sigma": 1e-7, "generations": 1}))
    err = Cli(tmp_path).run("train", "c.yaml", "--run", "flat").stderr
    warning = " ".join(err.split())
    assert "generation 1: no signal" in warning, err
    assert "try sigma: 0.001 (now 1e-07, full noise); batch_size: 4 (now 2" in warning
    assert "sampling: {temperature: 0.7} (now greedy)" in warning and "`loglik`" in warning


def test_string_form_with_a_question_mark_in_the_path_is_a_path(tmp_path: Path) -> None:
    odd = write_qa(tmp_path / "what?.jsonl", 10)
    assert load_task(f"jsonl:{odd}").describe()["test_size"] == 2
    with pytest.raises(SeedLedgerError, match=r"must be a positive integer"):
        load_task(f"jsonl:{odd}?test_size=0")
