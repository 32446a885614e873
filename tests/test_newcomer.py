"""Issue 52, the newcomer's path: each bug as the user met it, through the user's own
commands (in process, tests/support/cli.py), in a fresh directory and ledger.

The own-data recipe of docs/data.md, its run names, refusals that name the `--set` or the
path the user gave, and the hint after an interrupted module run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli_walkthrough import ROOT, Cli, _env

pytestmark = pytest.mark.slow

DATA_MD = ROOT / "docs" / "data.md"


class Shell(Cli):
    """The user's shell: `seedledger ARGS` in `workdir` with no $SEEDLEDGER_DB (the default
    ./seedledger.db), and `> FILE` as `write`."""

    def __init__(self, workdir: Path, **env: str):
        super().__init__(workdir)
        self.env = _env(**env)

    def write(self, name: str, *args: str) -> None:
        """`seedledger ARGS > name`."""
        (self.workdir / name).write_text(self.run(*args).stdout)


def _opposites(sh: Shell, rows: int | None = None) -> None:
    """`seedledger example jsonl > jsonl.yaml; seedledger example opposites.jsonl >
    opposites.jsonl` (the file cut or repeated to `rows` rows)."""
    sh.write("jsonl.yaml", "example", "jsonl")
    sh.write("opposites.jsonl", "example", "opposites.jsonl")
    if rows is not None:
        lines = (sh.workdir / "opposites.jsonl").read_text().splitlines()
        more = [json.dumps({**json.loads(ln), "prompt": f"{json.loads(ln)['prompt']} ({i})"})
                for i, ln in enumerate(lines * (rows // len(lines) + 1))]
        (sh.workdir / "opposites.jsonl").write_text("\n".join(more[:rows]) + "\n")


# -- 1: the own-data recipe's `evaluate` -----------------------------------------------------


@pytest.mark.parametrize(("rows", "test_rows"), [(None, 6), (60, 12)])
def test_evaluate_of_the_recipe_scores_every_test_row_of_a_small_file(tmp_path, rows, test_rows):
    sh = Shell(tmp_path)
    _opposites(sh, rows)
    sh.run("train", "jsonl.yaml", "--set", "model=tiny", "--set", "generations=1")
    out = sh.json("evaluate", "jsonl")
    assert (out["rows"], out["skip"]) == (test_rows, 0)
    assert len(out["rewards"]) == len(out["against_rewards"]) == test_rows
    human = sh.run("evaluate", "jsonl").stdout
    assert f"held-out rows 0..{test_rows - 1} ({test_rows}, greedy decoding)" in human


def test_rows_beyond_the_test_split_are_refused_before_any_model_loads(tmp_path):
    sh = Shell(tmp_path)
    _opposites(sh)
    sh.run("train", "jsonl.yaml", "--set", "model=tiny", "--set", "generations=1")
    empty_home = tmp_path / "home"
    sh.env["SEEDLEDGER_HOME"] = str(empty_home)  # a model load would provision `tiny` here
    line = sh.bad("evaluate", "jsonl", "--rows", "7")
    assert line == ("error: evaluate: rows 0..6 are beyond the task's 6 test rows "
                    "(raise the task's test_size or lower rows/skip)")
    assert "beyond the task's 6 test rows" in sh.bad("evaluate", "jsonl", "--skip", "6")
    assert not empty_home.exists()
    # evaluation during training: refused before the run exists (preflight: once the model
    # is provisioned, before it loads)
    sh.env = _env()
    line = sh.bad("train", "jsonl.yaml", "--run", "every", "--set", "model=tiny",
                  "--set", "evaluation.every=1", "--set", "evaluation.rows=64")
    assert line.startswith("error: evaluation.rows: rows 0..63 are beyond the task's 6 test rows"), line
    assert [r["name"] for r in sh.json("log")] == ["jsonl"]
