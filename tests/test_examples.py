"""`seedledger example jsonl|lora|code`: each shipped example loads as printed and trains one
generation of `tiny`; the jsonl example's data prints the same way and sits next to it."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

import seedledger.engine.api as sl
from seedledger.engine.cli.example import example_text
from seedledger.engine.config import load_config
from tests.support.sandbox import need_bwrap

FAST = ["model=tiny", "generations=1", "population=2", "batch_size=2", "max_new_tokens=4"]


def _train_one(config: Path, tmp_path: Path, *extra: str) -> None:
    load_config(config)  # as shipped
    result = sl.train(config, run="ex", overrides=[*FAST, *extra], ledger=tmp_path / "l.db")
    assert [r.index for r in result.records] == [1]


def test_jsonl_example_and_its_data_print_and_train(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    (tmp_path / "jsonl.yaml").write_text(cli.run("example", "jsonl").stdout)
    (tmp_path / "opposites.jsonl").write_text(cli.run("example", "opposites.jsonl").stdout)
    cfg = load_config(tmp_path / "jsonl.yaml")
    assert cfg.task["path"] == str(tmp_path / "opposites.jsonl") and "test_size" not in cfg.task
    listed = {e["name"]: e["summary"] for e in cli.json("example")["examples"]}
    assert {"jsonl", "lora", "code"} <= set(listed)
    assert listed["opposites.jsonl"] == "data: 30 rows (prompt, answer)"
    _train_one(tmp_path / "jsonl.yaml", tmp_path)


def test_jsonl_example_without_its_data_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "jsonl.yaml").write_text(example_text("jsonl"))
    line = Cli(tmp_path).bad("train", "jsonl.yaml", "--set", "model=tiny")
    assert "opposites.jsonl: no such dataset file" in line


def test_lora_example_trains_an_adapter(tmp_path: Path) -> None:
    (tmp_path / "lora.yaml").write_text(example_text("lora"))
    assert load_config(tmp_path / "lora.yaml").train.kind == "lora"
    _train_one(tmp_path / "lora.yaml", tmp_path)


def test_code_example_trains_in_the_sandbox(tmp_path: Path) -> None:
    need_bwrap()
    (tmp_path / "code.yaml").write_text(example_text("code"))
    _train_one(tmp_path / "code.yaml", tmp_path, "max_new_tokens=16")


@pytest.mark.parametrize("name", ["jsonl", "lora", "code"])
def test_examples_say_what_they_are_on_their_first_line(name: str) -> None:
    first = example_text(name).splitlines()[0]
    assert first.startswith("# ") and first.endswith(".")
