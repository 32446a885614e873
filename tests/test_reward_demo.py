"""The reward-only demo (`seedledger demo reward`, engine/configs/reward.yaml): its fitness is
one verifier on decoded text (the arithmetic task's `number` check), never a likelihood of a
reference; its run survives a SIGKILL, verifies and rebuilds from its seed file; the demo
judges it by that check. The words experiment (words_contains.yaml) stays a shipped example."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from seedledger.engine.config import load_config
from seedledger.ledger import Ledger
from seedledger.trainers.rewards.combine import WeightedReward
from seedledger.trainers.rewards.spec import parse_rewards
from seedledger.trainers.tasks import load_task
from seedledger.trainers.tasks.registry import reward_lists, uses_loglik
from tests.support.runs import (
    cli,
    fingerprints,
    kill_train_and_resume,
    rebuilt_from_ledger_and_seed_file,
)

CONFIGS = Path(__file__).resolve().parents[1] / "engine" / "configs"
SHIPPED = CONFIGS / "reward.yaml"


def fitness_terms(config: Path) -> tuple[list[str], list]:
    """(every reward reference the config's task names, the loaded task's rewards)."""
    cfg = load_config(config)
    refs = [e.ref for rewards in reward_lists(cfg.task) for e in parse_rewards(rewards)]
    return refs, load_task(cfg.task, seed=cfg.seed, base_dir=config.parent).rewards


def test_the_shipped_reward_config_has_no_likelihood_term_in_its_fitness() -> None:
    refs, rewards = fitness_terms(SHIPPED)
    assert refs == [], "the task's own check is the fitness"
    assert uses_loglik(load_config(SHIPPED).task) == (False, False)
    assert all(isinstance(r, WeightedReward) for r in rewards), "decoded rewards only: none scored by the backend"
    assert {r.name: r.weight for r in rewards} == {"right_number": 1.0}
    words_refs, _ = fitness_terms(CONFIGS / "words_contains.yaml")
    assert words_refs == ["contains", "task"]
    # the check tells the two demos apart: the likelihood demo's fitness is exactly the term refused here
    demo_refs, demo_rewards = fitness_terms(CONFIGS / "demo.yaml")
    assert demo_refs == ["loglik"] and not any(isinstance(r, WeightedReward) for r in demo_rewards)


def test_the_reward_demo_is_a_shipped_example_and_a_demo(tmp_path: Path) -> None:
    from seedledger.engine.cli.demo import DEMOS

    assert DEMOS["reward"][0].read_text() == SHIPPED.read_text()
    listed = json.loads(cli("example", "--json").stdout)["examples"]
    assert any(e["name"] == "reward" and "verifier alone" in e["summary"] for e in listed)
    assert any(e["name"] == "words_contains" and "decoded reward" in e["summary"] for e in listed)
    assert cli("example", "reward").stdout == SHIPPED.read_text()
    bad = cli("demo", "rewards", "--workdir", tmp_path / "d", check=False)
    assert bad.returncode == 2 and "no demo 'rewards'" in bad.stderr and "reward" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()


def tiny_reward_config(tmp_path: Path, **overrides) -> Path:
    """The shipped reward config on `tiny`, a few short generations. A random model never
    writes a right sum, so every `right_number` is 0: a length penalty (decoded as well) gives
    its members different rewards, so the weights move and resuming has bits to match."""
    cfg = yaml.safe_load(SHIPPED.read_text())
    cfg["task"]["rewards"] = ["task", {"fn": "length", "limit": 12}]
    cfg.update({"model": "tiny", "population": 4, "generations": 3, "batch_size": 2, "max_new_tokens": 4,
                "sigma": 0.05, "lr": 0.05, "anchor_every": 0, "evaluation": {"rows": 4}, **overrides})
    path = tmp_path / "reward.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.mark.slow
def test_the_reward_run_resumes_after_sigkill_verifies_and_rebuilds_from_its_seed_file(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    config = tiny_reward_config(tmp_path)
    ledger = tmp_path / "r.db"
    cli("train", config, "--run", "r", "--ledger", ledger)
    reference = fingerprints(ledger, "r")
    assert len(reference) == 3 and len(set(reference)) == 3, "every generation moved the weights"
    with Ledger.open(str(ledger)) as led:
        members = led.generation("r", 1).members
        assert {name for m in members for name in m.components} == {"right_number", "length"}
    kill_train_and_resume(config, tmp_path / "crash.db", reference)
    verified = json.loads(cli("verify", "r", "--json", "--ledger", ledger).stdout)
    assert verified["ok"] and verified["fingerprint"] == reference[-1]
    from_ledger, from_seeds = rebuilt_from_ledger_and_seed_file("r", ledger, tmp_path)
    assert from_ledger["fingerprint"] == from_seeds["fingerprint"] == reference[-1]


def test_the_demo_judges_the_reward_run_by_its_verifier(tmp_path: Path, tiny_model_dir: Path) -> None:
    from seedledger.engine.cli.demo import run_demo

    figures = run_demo(tmp_path / "out", config=tiny_reward_config(tmp_path, generations=1))
    assert figures["held_out_check"] == "right_number" and figures["verified"] is True
    assert figures["base_held_out_reward"] == pytest.approx(0.0), "a random model never writes a right sum"
    assert figures["held_out_rows"] == 4 and (tmp_path / "out" / "demo.seeds").exists()
