"""Issue 52, the newcomer's path: each bug as the user met it, through the user's own
commands (in process, tests/support/cli.py), in a fresh directory and ledger.

The own-data recipe of docs/data.md, its run names, refusals that name the `--set` or the
path the user gave, and the hint after an interrupted module run.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from test_cli_walkthrough import ROOT, Cli, _env

from tests.support.cli import script

pytestmark = pytest.mark.slow

DATA_MD = ROOT / "docs" / "data.md"
README = ROOT / "README.md"


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


# -- 2: the quick look's run name -------------------------------------------------------------


def _console_block(path: Path, heading: str) -> list[list[str]]:
    """The `$ ` commands of the first console block under `heading`, as argv (comments
    dropped; `> FILE` kept as two words)."""
    section = path.read_text(encoding="utf-8").split(heading, 1)[1]
    block = section.split("```console\n", 1)[1].split("\n```", 1)[0]
    return [shlex.split(line[2:], comments=True) for line in block.splitlines() if line.startswith("$ ")]


def _run_line(sh: Shell, argv: list[str]) -> None:
    assert argv[0] == "seedledger", argv
    if ">" in argv:
        at = argv.index(">")
        sh.write(argv[at + 1], *argv[1:at])
    else:
        sh.run(*argv[1:])


def test_the_quick_look_and_the_real_run_have_their_own_names(tmp_path):
    """The user's commands: the quick look took the name `jsonl`, so the real model's
    `train` must say the name belongs to another model, and not suggest resuming it."""
    sh = Shell(tmp_path)
    _opposites(sh)
    sh.run("train", "jsonl.yaml", "--set", "model=tiny", "--set", "generations=1")
    line = sh.bad("train", "jsonl.yaml")
    assert line == ("error: run 'jsonl' exists and trains tiny, not smollm2-135m-instruct: pick another "
                    "--run (e.g. --run jsonl-smollm2-135m-instruct)")
    assert "resume" not in line
    # the same model: `resume` is the way on
    assert "`seedledger resume jsonl` or pick another --run" in sh.bad("train", "jsonl.yaml", "--set", "model=tiny")


def test_the_own_data_recipe_runs_as_printed(tmp_path, smollm2_dir):
    """docs/data.md's console block in a fresh directory, each line as printed; only the
    SmolLM2 run is cut to one generation of two members (the test's time, not the user's)."""
    sh = Shell(tmp_path)
    lines = _console_block(DATA_MD, "## A 30-row file, start to finish")
    cut = ["--generations", "1", "--set", "population=2"]
    assert ["seedledger", "train", "jsonl.yaml"] in lines
    for argv in lines:
        _run_line(sh, argv + cut if argv == ["seedledger", "train", "jsonl.yaml"] else argv)
    runs = {r["name"]: r for r in sh.json("log")}
    assert {n: r["base_model"] for n, r in runs.items()} == {"jsonl-tiny": "tiny", "jsonl": "smollm2-135m-instruct"}
    events = [e for e in sh.json("log", "jsonl")["events"] if e["kind"] == "evaluation"]
    assert [e["payload"]["rows"] for e in events] == [6]


# -- 5: a directory given as the dataset ------------------------------------------------------


def test_a_directory_given_as_the_dataset_is_named_as_one(tmp_path):
    sh = Shell(tmp_path)
    _opposites(sh)
    (tmp_path / "data").mkdir()
    (tmp_path / "opposites.jsonl").rename(tmp_path / "data" / "opposites.jsonl")
    for given in (["--set", "task.path=data"], ["--set", "task=jsonl:data"]):
        line = sh.bad("train", "jsonl.yaml", "--set", "model=tiny", *given)
        assert line == (f"error: {tmp_path / 'data'}: a directory, not a dataset file: name one .jsonl or "
                        ".parquet file (it holds opposites.jsonl)"), line
    assert not (tmp_path / "seedledger.db").exists()


# -- 7: a rule between keys blames the --set that broke it ----------------------------------


def test_a_rule_between_keys_names_the_set_that_broke_it(tmp_path):
    sh = Shell(tmp_path)
    sh.write("q.yaml", "example", "quickstart")
    line = sh.bad("train", "q.yaml", "--set", "population=5")
    assert line == "error: --set population=5: population must be even when mirrored (got 5)"
    config = yaml.safe_load((tmp_path / "q.yaml").read_text())
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump({**config, "population": 5}))
    assert sh.bad("train", "odd.yaml").startswith("error: odd.yaml: population must be even when mirrored")


# -- 8: what `backend: auto` takes for the recipe's runs --------------------------------------


def test_auto_takes_hf_for_a_quick_look_and_vllm_for_the_recipes_run(tmp_path, smollm2_dir, monkeypatch):
    """By the run's shape (engine/runtime/backends/choice.py): vLLM's engine start is repaid
    from the fifth generation; the shipped example runs 30."""
    from seedledger.engine.config import load_config
    from seedledger.engine.runtime.backends import choice

    monkeypatch.delenv(choice.PIN, raising=False)  # the suite pins hf
    sh = Shell(tmp_path)
    _opposites(sh)
    longer = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"

    def chosen(*sets: str) -> str:
        return choice.resolve(load_config(tmp_path / "jsonl.yaml", list(sets)), smollm2_dir)

    assert chosen() == longer
    assert chosen("generations=1") == chosen("generations=4") == "hf"
    assert chosen("generations=5") == longer
    assert chosen("device=cuda") == "hf"  # vLLM CPU is the one auto takes


# -- 4: the hint after Ctrl-C on a module run ---------------------------------------------------

SLOW_TOY = """
import time

import torch


def line():
    return torch.nn.Linear(2, 1)


def fit(model):
    time.sleep(0.05)  # slow enough to be interrupted mid-run
    with torch.no_grad():
        return -float(model(torch.ones(1, 2)).square().sum())
"""


def _status(db: Path, run: str) -> str | None:
    """`run`'s status in `db`, read-only (None: no such ledger or run yet)."""
    if not db.exists():
        return None
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = con.execute("SELECT status FROM runs WHERE name = ?", (run,)).fetchone()
    except sqlite3.OperationalError:  # the ledger is still being created
        return None
    finally:
        con.close()
    return row[0] if row else None


def test_the_hint_after_ctrl_c_on_a_module_run_resumes_it(tmp_path):
    """Ctrl-C on `train cp.yaml --run cp --ledger cli.db` of a module run: the command the
    line names runs as printed (a module run's stored factory needs --trust-code)."""
    (tmp_path / "toy.py").write_text(SLOW_TOY)
    (tmp_path / "cp.yaml").write_text(yaml.safe_dump(
        {"model": "module:toy.py:line", "task": "fitness:toy.py:fit", "population": 4, "generations": 10_000}))
    sh = Shell(tmp_path)
    proc = subprocess.Popen([*script(), "train", "cp.yaml", "--run", "cp", "--ledger", "cli.db"], cwd=tmp_path,
                            env=sh.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while _status(tmp_path / "cli.db", "cp") != "training":
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    line = err.strip().splitlines()[-1]
    assert proc.returncode == 130, err
    assert line.endswith("; continue with `seedledger resume cp --trust-code --ledger cli.db`"), line
    hinted = shlex.split(line.split("`")[-2])
    assert sh.json(*hinted[1:], "--generations", "1")["run"] == "cp"


# -- 6: the README's figures are the real ones ----------------------------------------------

SEED_FILE_SLACK = 16  # bytes: the export time and the installed libraries' versions are in it


def test_the_readme_seed_file_size_is_the_real_one(tmp_path):
    """The walkthrough's `export` line, by the walkthrough's own commands (its excerpt
    check masks byte counts, so this one holds them)."""
    printed = re.search(r"wrote lower-lr\.seeds \(([\d,]+) bytes\) for lower-lr@4", README.read_text())
    sh = Shell(tmp_path)
    sh.write("quickstart.yaml", "example", "quickstart")
    sh.run("train", "quickstart.yaml", "--run", "first")
    sh.run("fork", "first@2", "--run", "lower-lr", "--set", "lr=0.0002", "--generations", "2")
    actual = sh.json("export", "lower-lr", "-o", "lower-lr.seeds")["bytes"]
    assert actual == (tmp_path / "lower-lr.seeds").stat().st_size
    assert abs(actual - int(printed.group(1).replace(",", ""))) <= SEED_FILE_SLACK, (actual, printed.group(0))
