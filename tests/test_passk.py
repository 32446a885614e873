"""pass@k training through the evaluator on the `tiny` model: n seeded samples per prompt
per member, scored by the task, the member's reward the mean unbiased pass@k estimate.

`tests.support.rewards:vowel_share` gives the random model's completions rewards spread
over [0, 1], so a success threshold of 0.4 splits them into successes and failures.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from seedledger.engine.config import load_config
from seedledger.engine.runtime.backends.base import PopulationOutput
from seedledger.engine.runtime.scoring.evaluator import Evaluator
from seedledger.replay.noise import member_key, run_key
from seedledger.trainers.es import Member
from seedledger.trainers.rewards.passk import pass_at_k

BASE = [
    "model=tiny", "batch_size=3", "max_new_tokens=6", "seed=5", "keep_samples=true",
    "sampling.temperature=1.0",
    "task={name: arithmetic, rewards: [{fn: 'tests.support.rewards:vowel_share'}]}",
]
GENERATION = 2
MEMBER = Member(index=1, key=member_key(run_key(5), GENERATION, 1), sign=-1)
SIGMA = 0.01


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _evaluator(tiny_model_dir: Path, *overrides: str) -> Evaluator:
    return Evaluator(load_config(None, [*BASE, *overrides]), tiny_model_dir)


def _score(evaluator: Evaluator):
    (result,) = evaluator.score_population([MEMBER], SIGMA, GENERATION, run_key(5))
    return result


def _completions(result, sample: int | None = None) -> list[str]:
    return [s["completion"] for s in result.samples if sample is None or s.get("sample", 0) == sample]


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return _score(_evaluator(tiny_model_dir))


@pytest.fixture(scope="module")
def passk4(tiny_model_dir):
    ev = _evaluator(tiny_model_dir, "passk={n: 4, k: 2, threshold: 0.4}")
    return ev, _score(ev)


def test_n_samples_per_prompt_are_scored_and_estimated(passk4):
    _, result = passk4
    samples = result.samples
    assert len(samples) == 3 * 4
    assert [s["sample"] for s in samples] == [0, 1, 2, 3] * 3
    assert [s["row"] for s in samples[::4]] == [s["row"] for s in samples[1::4]]  # prompt-major
    assert len(set(_completions(result))) > 4  # the samples of a prompt differ
    expected = []
    for p in range(3):
        group = samples[4 * p : 4 * p + 4]
        c = sum(s["reward"] >= 0.4 for s in group)
        expected.append(1 - math.comb(4 - c, 2) / math.comb(4, 2))
    assert result.reward == pytest.approx(sum(expected) / 3, abs=1e-12)
    assert 0 < result.reward < 1, "the threshold should split this batch; pick another seed"
    comps = result.components
    assert comps["pass@2"] == result.reward
    assert comps["sample_reward"] == pytest.approx(sum(s["reward"] for s in samples) / 12)
    assert comps["tests.support.rewards:vowel_share"] == pytest.approx(comps["sample_reward"])


def test_same_seeds_same_rewards(tiny_model_dir, passk4):
    ev, first = passk4
    again = _score(ev)
    fresh = _score(_evaluator(tiny_model_dir, "passk={n: 4, k: 2, threshold: 0.4}"))
    for other in (again, fresh):
        assert other.reward == first.reward and other.components == first.components
        assert other.samples == first.samples
    (other_member,) = ev.score_population(
        [Member(2, member_key(run_key(5), GENERATION, 2), 1)], SIGMA, GENERATION, run_key(5)
    )
    assert _completions(other_member) != _completions(first)


def test_sample_zero_is_plain_sampling_and_n1_k1_is_plain_sampling(tiny_model_dir, plain, passk4):
    """Adding samples leaves each prompt's first sample as it was; with n = k = 1 the
    completions are plain sampling's and the reward is its success rate."""
    _, result = passk4
    assert _completions(result, sample=0) == _completions(plain)
    one = _score(_evaluator(tiny_model_dir, "passk={n: 1, k: 1, threshold: 0.4}"))
    assert _completions(one) == _completions(plain)
    assert one.reward == pytest.approx(sum(s["reward"] >= 0.4 for s in plain.samples) / 3)
    assert one.components["sample_reward"] == plain.reward
    assert one.success == plain.success  # the curriculum's threshold (1.0) is its own


def test_estimator_on_a_hand_checked_batch(tiny_model_dir, monkeypatch):
    """Scripted completions: prompt 0 right in 1 of 4 samples, prompt 1 in none, prompt 2 in
    3 of 4. pass@2 = 1 − C(3,2)/C(4,2) = 1/2, 0, and 1 (fewer than 2 failures): mean 1/2."""
    ev = Evaluator(load_config(None, [
        "model=tiny", "batch_size=3", "seed=5", "sampling.temperature=0.5", "passk={n: 4, k: 2}",
    ]), tiny_model_dir)
    _, rows = ev.task.train_batch(5, GENERATION, 3)
    right = [[True, False, False, False], [False] * 4, [False, True, True, True]]
    calls = []

    def scripted(master, population, prompts, max_new_tokens, *, samples=1, **kwargs):
        calls.append((len(prompts), samples, population.seeds[0]))
        texts = [f"<answer>{row['answer']}</answer>" if ok else "no idea"
                 for row, oks in zip(rows, right, strict=True) for ok in oks]
        return PopulationOutput(completions=[texts])

    monkeypatch.setattr(ev.backend, "evaluate", scripted)
    result = _score(ev)
    assert calls == [(3, 4, member_key(run_key(5), GENERATION, 1_000_000 + MEMBER.index))]
    assert pass_at_k(4, 1, 2) == 0.5 and pass_at_k(4, 3, 2) == 1.0
    assert result.reward == pytest.approx(0.5)
    assert result.components == {"arithmetic": pytest.approx(4 / 12), "sample_reward": pytest.approx(4 / 12),
                                 "pass@2": pytest.approx(0.5)}
    assert result.success == pytest.approx(4 / 12)


def test_the_ledger_records_pass_at_k_per_member(tmp_path, tiny_model_dir):
    import yaml

    from seedledger.engine.runtime import session
    from seedledger.ledger import Ledger

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "model": "tiny", "population": 2, "generations": 1, "batch_size": 2, "max_new_tokens": 4,
        "seed": 5, "sampling": {"temperature": 1.0}, "passk": {"n": 3, "k": 2, "threshold": 0.3},
        "task": {"name": "arithmetic", "rewards": [{"fn": "tests.support.rewards:vowel_share"}]},
    }))
    with Ledger.open(str(tmp_path / "l.db")) as led:
        session.start(led, str(config), "pk", [], None)
        record = led.generation("pk", 1)
        assert led.get_run("pk").config["passk"] == {"n": 3, "k": 2, "threshold": 0.3}
    for m in record.members:
        assert set(m.components) == {"tests.support.rewards:vowel_share", "sample_reward", "pass@2"}
        assert m.reward == m.components["pass@2"]
