"""Config friction a new user met (issue 32 item 7), on the `tiny` model: a task option's
typo is one line naming the file or the `--set`, the key path and a suggestion; `--set
task.KEY` on a string-form task applies or names the key and the task; a `train` that
fails before any run exists leaves no new ledger file; the API's results read the run
after training; `history_frame` is indexed by generation."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_cli_walkthrough import Cli

import seedledger as sl
from seedledger.engine.config import load_config
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from tests.support.configs import TINY

USER_REWARD = Path(__file__).parent / "data" / "user_reward.py"
ALLOWED_JSONL = "['answer_column', 'casefold', 'data_seed', 'match', 'max_new_tokens', 'path', 'prompt_column', " \
                "'rewards', 'system', 'test_path', 'test_size']"


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A directory with 30 question/answer rows (qa.jsonl) and configs naming them as a
    mapping (map.yaml, with a typo) and as a string (str.yaml)."""
    rows = [{"prompt": f"{i} + 1 =", "answer": str(i + 1)} for i in range(30)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "map.yaml").write_text(yaml.safe_dump(
        {**TINY, "task": {"name": "jsonl", "path": "qa.jsonl", "test_sise": 8}}))
    (tmp_path / "str.yaml").write_text(yaml.safe_dump({**TINY, "task": "jsonl:qa.jsonl", "generations": 0}))
    return tmp_path


def _ledger_files(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith("ledger.db"))


def test_a_task_option_typo_names_the_file_the_key_and_the_fix(work):
    line = Cli(work).bad("train", "map.yaml", "--run", "r")
    assert line.startswith("error: map.yaml: task.test_sise: "), line
    assert "did you mean 'test_size'?" in line
    line = Cli(work).bad("train", "str.yaml", "--run", "r", "--set", "task.rewrds=x")
    assert line.startswith("error: --set task.rewrds=x: task.rewrds: "), line
    assert "did you mean 'rewards'?" in line and f"allowed: {ALLOWED_JSONL}" in line
    assert _ledger_files(work) == []


def test_a_task_option_of_the_wrong_type_is_refused_before_the_run_exists(work):
    """`--set task.system=a: b` reads as a mapping: refused naming the key, not a TypeError
    inside generation 1 of a run that then exists as `interrupted`."""
    line = Cli(work).bad("train", "str.yaml", "--run", "r", "--set", "task.system=a: b")
    assert line == "error: --set task.system=a: b: task.system: task jsonl: option system: " \
                   "input should be a valid string, not {'a': 'b'}", line
    line = Cli(work).bad("train", "str.yaml", "--run", "r", "--set", "task.test_size=[8]")
    assert "task.test_size: task jsonl: option test_size: input should be a valid integer" in line, line
    assert _ledger_files(work) == []


def test_a_typo_inside_a_mix_names_its_path(work):
    mix = {"mix": [{"task": "arithmetic", "weight": 1}, {"task": {"name": "jsonl", "path": "qa.jsonl",
                                                                  "tset_size": 3}, "weight": 1}]}
    (work / "mix.yaml").write_text(yaml.safe_dump({**TINY, "task": mix}))
    with pytest.raises(SeedLedgerError) as err:
        load_config(work / "mix.yaml")
    assert str(err.value).startswith(f"{work / 'mix.yaml'}: task.mix.1.task.tset_size: task jsonl: unknown options")
    assert "did you mean 'test_size'?" in str(err.value)


def test_set_on_a_string_form_task_applies_or_names_the_key_and_the_task(work):
    out = Cli(work).json("train", "str.yaml", "--run", "r", "--set", "task.test_size=8")
    assert out["generations_committed"] == []
    con = sqlite3.connect(work / "ledger.db")
    (stored,) = con.execute("SELECT config FROM runs WHERE name = 'r'").fetchone()
    con.close()
    assert yaml.safe_load(stored)["task"] == {"name": "jsonl", "path": str(work / "qa.jsonl"), "test_size": 8}
    line = Cli(work).bad("train", "str.yaml", "--run", "s", "--set", "task.level=2")
    assert line.startswith("error: --set task.level=2: task.level: task jsonl: unknown options ['level']"), line
    assert "unknown task" not in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["map.yaml"], "task.test_sise"),  # a bad config
        (["str.yaml", "--set", "task=jsonl:nothere.jsonl"], "nothere.jsonl: no such dataset file"),
        (["str.yaml", "--set", "model=nosuchmodel"], "unknown model 'nosuchmodel'"),
    ],
)
def test_a_failed_train_leaves_no_new_ledger_and_an_old_one_untouched(work, args, message):
    assert message in Cli(work).bad("train", *args, "--run", "r")
    assert _ledger_files(work) == []
    with Ledger.open(work / "ledger.db", create=True):
        pass
    before = hashlib.sha256((work / "ledger.db").read_bytes()).hexdigest()
    assert message in Cli(work).bad("train", *args, "--run", "r")
    assert hashlib.sha256((work / "ledger.db").read_bytes()).hexdigest() == before
    with pytest.raises(SeedLedgerError, match=message.replace("'", ".")):
        sl.train(work / args[0], run="r", overrides=args[2::2], ledger=work / "api.db")
    assert not list(work.glob("api.db*"))


def test_a_ledger_holding_a_run_that_failed_is_kept(work):
    """A run that exists (here its reward code raises in generation 1) is kept with its
    ledger: `resume` continues it."""
    config = {**TINY, "task": {"name": "arithmetic", "rewards": [f"{USER_REWARD}:broken"]}}
    with pytest.raises(Exception, match="bug in user code"):
        sl.train(config, run="r", ledger=work / "kept.db")
    with sl.open_ledger(work / "kept.db") as led:
        assert led.get_run("r").status == "interrupted"


@pytest.fixture(scope="module")
def api_runs(tmp_path_factory, tiny_model_dir) -> tuple[Path, dict[str, str]]:
    """Statuses of the results of train (1 of 2 generations), resume and fork."""
    where = tmp_path_factory.mktemp("status") / "ledger.db"
    statuses = {"train": sl.train(TINY, run="a", generations=1, ledger=where).run.status}
    statuses["resume"] = sl.resume("a", ledger=where).run.status
    statuses["fork"] = sl.fork("a@1", "b", generations=1, ledger=where).run.status
    statuses["stopped fork"] = sl.fork("a@1", "c", overrides=["generations=3"], generations=1,
                                       ledger=where).run.status
    return where, statuses


def test_results_read_the_run_after_training(api_runs):
    _, statuses = api_runs
    assert statuses == {"train": "stopped", "resume": "finished", "fork": "finished", "stopped fork": "stopped"}


def test_history_frame_is_indexed_by_generation(api_runs):
    where, _ = api_runs
    frame = sl.history_frame("a", ledger=where)
    assert frame.index.name == "generation" and "generation" not in frame.columns
    assert list(frame.index) == [1, 2]
    assert "indexed by `generation`" in sl.history_frame.__doc__
