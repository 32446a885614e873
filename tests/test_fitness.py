"""trainers.fitness: one member's per-sample rewards to its fitness (mean, pass@k, success,
KL, row scores), in one module the engine calls; no reward semantics left in the engine."""

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from seedledger.trainers.fitness import Fitness, mean
from seedledger.trainers.member import Member
from seedledger.trainers.rewards.kl import sequence_kl
from seedledger.trainers.rewards.passk import pass_at_k

ROOT = Path(__file__).resolve().parents[1]
MEMBER = Member(2, 77, -1)


def test_the_reward_is_the_mean_of_the_rewards_that_apply():
    scored = Fitness(threshold=0.5).score(MEMBER, [1.0, None, 0.25], {"a": [1.0, None, 0.0], "b": [None] * 3},
                                          seconds={"decode": 1.5})
    assert (scored.index, scored.key, scored.sign) == (2, 77, -1)
    assert scored.reward == 0.625 and scored.components == {"a": 0.5, "b": None}
    assert scored.sample_rewards == [1.0, 0.0, 0.25] and scored.success == 1 / 3
    assert scored.row_scores[0::2] == [1.0, 0.25] and math.isnan(scored.row_scores[1])
    assert scored.seconds == {"decode": 1.5} and scored.kl is None and scored.samples is None
    nothing = Fitness(row_scores=False).score(MEMBER, [None, None], {})
    assert nothing.reward == 0.0 and nothing.row_scores is None and nothing.success == 0.0


def test_pass_at_k_scores_each_prompt_by_its_samples():
    fitness = Fitness(passk=SimpleNamespace(n=4, k=2, threshold=None), threshold=0.5)
    assert fitness.samples == 4 and fitness.per_sample(["p", "q"]) == ["p"] * 4 + ["q"] * 4
    rewards = [1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 1.0]  # prompt 0: 1 success of 4, prompt 1: 3 of 4
    scored = fitness.score(MEMBER, rewards, {"a": rewards})
    assert scored.row_scores == [pass_at_k(4, 1, 2), pass_at_k(4, 3, 2)]
    assert scored.reward == sum(scored.row_scores) / 2 == scored.components["pass@2"]
    assert scored.components["sample_reward"] == sum(rewards) / 8 == scored.components["a"]
    assert scored.success == 4 / 8
    strict = Fitness(passk=SimpleNamespace(n=4, k=2, threshold=1.0), threshold=0.5).score(MEMBER, rewards, {})
    assert strict.row_scores == [pass_at_k(4, 1, 2), pass_at_k(4, 1, 2)] and strict.success == 4 / 8


def test_kl_is_the_mean_over_completions_with_a_penalty_only():
    logprobs = [([-1.0, -2.0], [-1.5, -2.0]), ([-0.5], [-0.25])]
    scored = Fitness(kl="k3").score(MEMBER, [1.0, 1.0], {}, logprobs=logprobs)
    assert scored.kl == pytest.approx(sum(sequence_kl(m, b, "k3") for m, b in logprobs) / 2)
    assert Fitness().score(MEMBER, [1.0, 1.0], {}, logprobs=logprobs).kl is None


def test_mean_leaves_out_what_does_not_apply():
    assert mean([1.0, None, 2.0]) == 1.5 and mean([None]) is None and mean([]) is None


def test_the_engine_implements_no_reward_semantics():
    """The training replica imports no reward function: it asks the task for per-sample
    rewards and `trainers.fitness` for what they mean."""
    tree = ast.parse((ROOT / "engine/runtime/scoring/evaluator.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "seedledger.trainers.fitness" in imported
    assert not {m for m in imported if m and m.startswith("seedledger.trainers.rewards")}
