"""Short ES runs on `tiny` through the console script, for a reasoning-gym task (with
Pareto shaping) and for HumanEval: they complete, resume after SIGKILL to the
uninterrupted fingerprints, and their samples show in `show --samples`."""

from __future__ import annotations

import json
import os
import signal

import pytest
import yaml

from tests.support.runs import cli as seedledger
from tests.support.runs import fingerprints
from tests.support.sandbox import need_bwrap

BASE = {"model": "tiny", "population": 4, "sigma": 0.05, "lr": 0.05, "generations": 2,
        "batch_size": 2, "max_new_tokens": 6, "seed": 11, "keep_samples": True}
CONFIGS = {
    "reasoning_gym": {**BASE, "shaping": "pareto",
                      "task": {"name": "reasoning_gym", "dataset": "chain_sum", "test_size": 4,
                               "rewards": ["task", {"fn": "length", "limit": 30}]}},
    "humaneval": {**BASE, "task": {"name": "code", "path": "humaneval",
                                   "rewards": ["task", {"fn": "length", "limit": 30}]}},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_run_completes_resumes_after_sigkill_and_keeps_samples(kind, tmp_path, tiny_model_dir):
    need_bwrap()
    config = tmp_path / f"{kind}.yaml"
    config.write_text(yaml.safe_dump(CONFIGS[kind]))
    ledger = str(tmp_path / "l.db")
    seedledger("train", str(config), "--run", "whole", "--ledger", ledger, "--json")
    whole = fingerprints(tmp_path / "l.db", "whole")
    assert len(whole) == 2

    env = os.environ | {"SEEDLEDGER_FAILPOINT": "member@2"}  # SIGKILL while generation 2 is scored
    proc = seedledger("train", str(config), "--run", "killed", "--ledger", ledger, "--json", env=env, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert fingerprints(tmp_path / "l.db", "killed") == whole[:1]
    seedledger("resume", "killed", "--ledger", ledger, "--json")
    assert fingerprints(tmp_path / "l.db", "killed") == whole

    shown = json.loads(seedledger("show", "killed@2", "--samples", "--ledger", ledger, "--json").stdout)
    samples = [s for m in shown["members"] for s in m["samples"]]
    assert len(samples) == 4 * 2 and all("completion" in s and "reward" in s for s in samples)
    assert any(m["coefficient"] != 0.0 for m in shown["members"])  # generation 2 moved the weights
    components = shown["members"][0]["components"]
    table = seedledger("show", "killed@2", "--samples", "--ledger", ledger).stdout
    assert "member 0 outputs" in table
    if kind == "reasoning_gym":
        assert {"chain_sum", "length", "pareto_front"} <= set(components)
        fronts = [m["components"]["pareto_front"] for m in shown["members"]]
        assert min(fronts) == 0.0 and "★" in table
    else:
        assert {"tests", "timeouts", "length"} <= set(components)
