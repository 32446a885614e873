"""`make demo`'s pipeline on the `tiny` model: train, rebuild, verify, export, report."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from seedledger.engine.cli.demo import run_demo
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.seedfile import read_seedfile
from seedledger.replay.noise import member_key

TINY = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "tests.support.rewards:vowel_share"}]},
    "population": 4,
    "sigma": 0.05,
    "lr": 0.05,
    "generations": 2,
    "batch_size": 2,
    "max_new_tokens": 6,
    "seed": 1,
    "evaluation": {"rows": 4},
}


def test_demo_reports_what_it_measured(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump(TINY))
    workdir = tmp_path / "out"
    workdir.mkdir()
    (workdir / "seedledger.db").write_text("a stale ledger from an earlier demo")

    figures = run_demo(workdir, config=config)

    assert figures["generations"] == 2 and figures["verified"] is True
    with Ledger.open(str(workdir / "seedledger.db")) as led:
        assert figures["fingerprint"] == led.generation("demo", 2).fingerprint
        assert led.generation("demo", 1).fingerprint != figures["fingerprint"], "the weights moved"
    seeds = workdir / "demo.seeds"
    assert figures["seed_file_bytes"] == seeds.stat().st_size
    assert read_seedfile(seeds, key_fn=member_key).generation == 2
    assert figures["safetensors_bytes"] > 100 * figures["seed_file_bytes"]
    assert Path(figures["reward_curve"]).stat().st_size > 0
    assert 0.0 <= figures["base_held_out_reward"] <= 1.0 and 0.0 <= figures["final_held_out_reward"] <= 1.0
    assert figures["question"] and isinstance(figures["final_answer"], str)
    assert figures["held_out_rows"] == 4 and figures["held_out_change"]["better"] <= 4


def test_demo_refuses_a_workdir_holding_files_it_did_not_write(tmp_path: Path) -> None:
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "thesis.tex").write_text("precious")
    with pytest.raises(SeedLedgerError, match="thesis.tex"):
        run_demo(workdir, config=tmp_path / "unused.yaml")
    assert (workdir / "thesis.tex").read_text() == "precious"


def test_paired_change_is_the_mean_row_difference_with_its_standard_error() -> None:
    from seedledger.engine.runtime.scoring.heldout import paired_change

    change = paired_change([0.0, 0.5, 1.0, None], [1.0, 0.5, 0.0, 1.0])  # a None row is left out
    assert change == {"mean": 0.0, "stderr": pytest.approx(1 / 3**0.5), "better": 1, "worse": 1}
    change = paired_change([0.25, 0.25], [0.75, 1.25])
    assert change == {"mean": 0.75, "stderr": pytest.approx(0.25), "better": 2, "worse": 0}


def test_held_out_evaluation_is_greedy_under_a_sampling_config(tiny_model_dir: Path) -> None:
    """With `sampling.temperature > 0` the held-out evaluation and the demo's example answer
    used to raise ("sampling … needs a seed"); they decode greedily, whatever `sampling`."""
    from seedledger.engine.config import validate
    from seedledger.engine.runtime.scoring.evaluator import Evaluator

    greedy_cfg = validate(TINY)
    sampling_cfg = validate({**TINY, "sampling": {"temperature": 0.9, "top_p": 0.9}})
    greedy, sampled = Evaluator(greedy_cfg, tiny_model_dir), Evaluator(sampling_cfg, tiny_model_dir)
    assert sampled.held_out_rewards(4) == greedy.held_out_rewards(4)
    assert sampled.held_out_reward(4) == greedy.held_out_reward(4)
    assert sampled.held_out_scores(4) == greedy.held_out_scores(4)  # what the demo prints
    rows = sampled.task.test_rows()[:4]
    prompts = [sampled.task.prompt(r) for r in rows]
    assert sampled.backend.generate(prompts, 6, temperature=0.0) == greedy.backend.generate(prompts, 6)
