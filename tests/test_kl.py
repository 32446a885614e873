"""The KL-to-base penalty: estimators, the adaptive β, token log-probabilities from the HF
backend (full-rank and batched low-rank), and a run whose β survives resume."""

from __future__ import annotations

import math

import pytest
import torch

from seedledger.engine.runtime.backends.base import Population
from seedledger.engine.runtime.backends.hf import HFBackend
from seedledger.ledger import Ledger
from seedledger.replay import noise
from seedledger.replay.perturbation import Perturbation
from seedledger.trainers.rewards.kl import next_beta, sequence_kl

SIGMA = noise.round_coefficient(0.05)
PROMPTS = [[{"role": "user", "content": "What is 2+3?"}], [{"role": "user", "content": "Hi"}]]


def test_estimators():
    member, base = [-1.0, -2.0], [-1.5, -1.0]
    assert sequence_kl(member, base, "k1") == pytest.approx(0.5 - 1.0)
    k3 = sum(math.expm1(b - m) - (b - m) for m, b in zip(member, base, strict=True))
    assert sequence_kl(member, base, "k3") == pytest.approx(k3) and k3 > 0
    assert sequence_kl([-0.3], [-0.3]) == 0.0 and sequence_kl([], []) == 0.0
    with pytest.raises(ValueError):
        sequence_kl([-1.0], [])


def test_adaptive_beta_moves_toward_the_target_and_is_clipped():
    assert next_beta(0.1, 5.0, None, 100, 1000) == 0.1  # fixed
    assert next_beta(0.1, 2.0, 1.0, 100, 1000) == pytest.approx(0.1 * (1 + 0.2 * 0.1))  # clipped +20 %
    assert next_beta(0.1, 0.9, 1.0, 100, 1000) == pytest.approx(0.1 * (1 - 0.1 * 0.1))
    assert next_beta(0.1, 0.0, 1.0, 100, 1000) == pytest.approx(0.1 * (1 - 0.2 * 0.1))


@pytest.fixture(scope="module")
def full(tiny_model_dir):
    return HFBackend(tiny_model_dir, kl_reference=True)


def test_the_base_itself_has_zero_kl_and_a_member_more(full):
    master = full.master()
    same = full.evaluate(master, Population((7,), (1,), 0.0, (None,)), PROMPTS, 6)
    for mine, base in same.logprobs[0]:
        assert len(mine) > 0 and mine == base  # σ = 0: the member is the base, bit for bit
    moved = full.evaluate(master, Population((7, 7), (1, -1), SIGMA, (None, None)), PROMPTS, 6)
    kls = [sequence_kl(m, b) for pairs in moved.logprobs for m, b in pairs]
    assert all(k >= 0 for k in kls) and max(kls) > 1e-4


def test_greedy_tokens_carry_their_maximal_log_probability(full):
    """Teacher-forced scoring sees what decoding saw: a greedy token is the argmax."""
    master = full.master()
    out = full.evaluate(master, Population((9,), (1,), SIGMA, (None,)), PROMPTS, 5)
    full.load_member(master, 9, 1, SIGMA)
    ids = full.generate_ids(PROMPTS, 5)
    enc = full._encode(PROMPTS)
    with torch.inference_mode():
        seq = full.model.generate(**enc, max_new_tokens=1, do_sample=False,
                                  output_logits=True, return_dict_in_generate=True,
                                  pad_token_id=full.tokenizer.pad_token_id)
    first = torch.log_softmax(seq.logits[0].float(), -1).max(-1).values
    for i, (mine, _) in enumerate(out.logprobs[0]):
        assert ids[i][0] == seq.sequences[i, -1].item()
        assert mine[0] == pytest.approx(first[i].item(), abs=1e-4)


def test_batched_lowrank_scoring_matches_each_member_alone(tiny_model_dir):
    p = Perturbation.lowrank(4)
    batched = HFBackend(tiny_model_dir, perturbation=p, kl_reference=True)
    master = batched.master()
    batched.load_master(master)
    pop = Population((11, 11, 29, 29), (1, -1, 1, -1), SIGMA, (None,) * 4)
    together = batched.evaluate(master, pop, PROMPTS, 6)
    for m in range(4):
        alone = batched.evaluate(master, Population((pop.keys[m],), (pop.signs[m],), SIGMA, (None,)), PROMPTS, 6)
        assert alone.completions[0] == together.completions[m]
        for (a, a0), (b, b0) in zip(alone.logprobs[0], together.logprobs[m], strict=True):
            assert a0 == b0
            assert max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0) < 1e-4


KL_RUN = [
    "model=tiny", "population=4", "batch_size=2", "max_new_tokens=5", "seed=5", "sigma=0.05",
    "lr=0.05", "task.rewards=[task, {fn: length, limit: 12}]", "task.name=arithmetic",
    "kl={beta: 0.5, target: 0.001, horizon: 20}",
]


def test_a_run_records_beta_and_kl_and_resume_continues_beta(tmp_path):
    from seedledger.engine.runtime import session

    with Ledger.open(str(tmp_path / "a.db")) as led:
        straight = session.start(led, None, "a", KL_RUN, 3)
        recs = straight.records
    betas = [r.extra["kl"]["beta"] for r in recs]
    assert betas[0] == 0.5 and betas[1] != betas[0] and betas[2] != betas[1]
    for r in recs:
        for m in r.members:
            c = m.components
            assert m.reward == c["task_reward"] - r.extra["kl"]["beta"] * c["kl"]
        assert r.extra["kl"]["mean"] == pytest.approx(sum(m.components["kl"] for m in r.members) / 4)
    with Ledger.open(str(tmp_path / "b.db")) as led:
        session.start(led, None, "b", KL_RUN, 2)
        resumed = session.resume(led, "b", 1)
        assert [r.extra["kl"]["beta"] for r in led.records("b")] == betas
    assert resumed.fingerprint == straight.fingerprint
