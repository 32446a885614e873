"""Population-batched evaluation: one request per group of members, one forward for all
of a low-rank group's rows, and the same answers as each member's materialised weights."""

from __future__ import annotations

import pytest
import torch

from seedledger.engine.runtime.backends.base import Population
from seedledger.engine.runtime.backends.hf import HFBackend
from seedledger.replay import noise
from seedledger.replay.perturbation import Perturbation, factors

SIGMA = noise.round_coefficient(0.05)  # large enough that members really differ on `tiny`
PROMPTS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "user", "content": "Name a colour, please, in one word."}],
    [{"role": "user", "content": "Hi"}],
]
KEYS = (11, 11, 29, 29)  # two mirrored pairs
SIGNS = (1, -1, 1, -1)


def _materialise(backend: HFBackend, master, perturbation: Perturbation, key: int, scale: float):
    """The member's weights written out: W + scale·A·Bᵀ/√r on every targeted matrix."""
    with torch.no_grad():
        for name, param in backend._params.items():
            w = master[name]
            if perturbation.trained(name, tuple(w.shape)):
                a, b = factors(key, name, tuple(w.shape), perturbation.rank)
                w = w + scale * perturbation.inv_sqrt_rank * (a @ b.T)
            param.copy_(w)


@pytest.fixture(scope="module", params=[1, 4], ids=["rank1", "rank4"])
def lowrank(request, tiny_model_dir):
    p = Perturbation.lowrank(request.param)
    return p, HFBackend(tiny_model_dir, perturbation=p), HFBackend(tiny_model_dir)


def test_batched_lowrank_logits_match_materialised_weights(lowrank):
    p, batched, plain = lowrank
    master = batched.master()
    batched.load_master(master)
    enc = batched._encode([q for _ in KEYS for q in PROMPTS])
    with torch.inference_mode(), batched.members(master, KEYS, SIGNS, SIGMA):
        together = batched.model(**enc).logits
    worst = 0.0
    for m, (key, sign) in enumerate(zip(KEYS, SIGNS, strict=True)):
        _materialise(plain, master, p, key, sign * SIGMA)
        with torch.inference_mode():
            alone = plain.model(**plain._encode(PROMPTS)).logits
        rows = together[m * len(PROMPTS) : (m + 1) * len(PROMPTS)]
        worst = max(worst, (rows - alone).abs().max().item())
    assert worst < 1e-4, worst
    # and the members really differ from the master and from each other
    with torch.inference_mode():
        base = batched.model(**enc).logits
    assert (together - base).abs().max().item() > 1e-3


def test_batched_lowrank_generation_equals_member_by_member(lowrank):
    p, batched, plain = lowrank
    master = batched.master()
    batched.load_master(master)
    pop = Population(KEYS, SIGNS, SIGMA, (None,) * len(KEYS))
    out = batched.evaluate(master, pop, PROMPTS, max_new_tokens=8)
    assert len(out.completions) == len(KEYS) and all(len(c) == len(PROMPTS) for c in out.completions)
    for m, (key, sign) in enumerate(zip(KEYS, SIGNS, strict=True)):
        _materialise(plain, master, p, key, sign * SIGMA)
        assert out.completions[m] == plain.generate(PROMPTS, max_new_tokens=8)
    assert out.completions[0] != out.completions[1]  # a pair's two signs decode differently
    # held-out generation afterwards sees the master alone (no member term left behind)
    plain.load_master(master)
    assert batched.generate(PROMPTS, max_new_tokens=8) == plain.generate(PROMPTS, max_new_tokens=8)


def test_batched_lowrank_sampling_uses_each_members_seed(lowrank):
    p, batched, plain = lowrank
    master = batched.master()
    batched.load_master(master)
    seeds = (101, 102, 103, 104)
    pop = Population(KEYS, SIGNS, SIGMA, seeds)
    batched.temperature = plain.temperature = 1.0
    try:
        out = batched.evaluate(master, pop, PROMPTS, max_new_tokens=6, samples=2)
        for m in (0, 3):
            _materialise(plain, master, p, KEYS[m], SIGNS[m] * SIGMA)
            assert out.completions[m] == plain.generate(PROMPTS, 6, seed=seeds[m], samples=2)
    finally:
        batched.temperature = plain.temperature = 0.0


def test_full_rank_population_is_each_member_alone(tiny_model_dir):
    backend = HFBackend(tiny_model_dir)
    master = backend.master()
    pop = Population((5, 5, 9), (1, -1, 1), SIGMA, (None, None, None))
    out = backend.evaluate(master, pop, PROMPTS, max_new_tokens=6)
    for m in range(3):
        backend.load_member(master, pop.keys[m], pop.signs[m], SIGMA)
        assert out.completions[m] == backend.generate(PROMPTS, max_new_tokens=6)
    assert set(out.seconds) == {"load_member", "generate"}


def test_lowrank_targets_must_exist(tiny_model_dir):
    with pytest.raises(ValueError, match="no linear layer"):
        HFBackend(tiny_model_dir, perturbation=Perturbation.lowrank(1, ["nonexistent_proj"]))
