"""Progress in logs: when stdout is not a terminal, training prints one line per generation
on stdout (none under --json) and, at most once per $SEEDLEDGER_PROGRESS_SECONDS, how many
members of the generation are done; provisioning a model prints one line per step."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from test_cli_walkthrough import Cli

from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


def test_training_prints_one_line_per_generation_to_a_log(tmp_path):
    cli = Cli(tmp_path)
    (tmp_path / "c.yaml").write_text(tiny_config(generations=2))
    out = cli.run("train", "c.yaml", "--run", "r").stdout.splitlines()  # a pipe, not a terminal
    gens = [ln for ln in out if ln.startswith("generation ")]
    assert [g.split(":")[0] for g in gens] == ["generation 1", "generation 2"], out
    assert all("reward mean" in g and "fingerprint" in g for g in gens)
    assert out[-1].startswith("run r: fingerprint ")
    resumed = cli.json("resume", "r", "--generations", "1")  # --json: stdout is the document alone
    assert resumed["generations_committed"] == [3]


def test_provisioning_prints_one_line_per_step(tmp_path):
    env = {**os.environ, "SEEDLEDGER_HOME": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c",
         "from seedledger.engine.runtime.models.resolve import resolve_model; resolve_model('tiny')"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("provisioning model 'tiny' into ")
    steps = [ln.removeprefix("provisioning 'tiny': ") for ln in lines[1:]]
    assert steps == ["saving the tokenizer", "making seeded random weights", "saving fp32 safetensors",
                     "writing the manifest and syncing to disk"], lines


def test_a_log_shows_progress_within_a_generation(tmp_path):
    cli = Cli(tmp_path)
    (tmp_path / "c.yaml").write_text(tiny_config(generations=1))
    cli.env["SEEDLEDGER_PROGRESS_SECONDS"] = "0"  # a line after every member group
    out = cli.run("train", "c.yaml", "--run", "r").stdout.splitlines()  # stdout and stderr are pipes
    end = next(i for i, ln in enumerate(out) if ln.startswith("generation 1: reward mean"))
    partial = [ln for ln in out[:end] if re.fullmatch(r"generation 1: [1-3]/4 members, \d+\.\ds", ln)]
    assert partial and partial == [ln for ln in out if " members, " in ln], out
    done = [int(ln.split(": ")[1].split("/")[0]) for ln in partial]
    assert done == sorted(set(done)), "counts only grow"
    # the default (30 s) adds nothing to a generation that takes a second
    del cli.env["SEEDLEDGER_PROGRESS_SECONDS"]
    out = cli.run("resume", "r", "--generations", "1").stdout
    assert " members, " not in out and "generation 2: reward mean" in out
    cli.env["SEEDLEDGER_PROGRESS_SECONDS"] = "soon"
    assert "SEEDLEDGER_PROGRESS_SECONDS: expected seconds >= 0, got 'soon'" in cli.bad("resume", "r")
