"""Likelihood fitness on the vLLM backend: prompt + reference answer as one prompt, scored by
`prompt_logprobs` (one token decoded, ignored). The reference ids and the end-of-turn token
are the HF backend's (`hf_scoring.reference_ids`), so both backends score the same tokens
(tests: within 3·10⁻⁵ of HF's teacher-forced scores, full-rank and multi-LoRA members).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from seedledger.engine.runtime.backends.base import LikelihoodOutput, Messages, Population
from seedledger.engine.runtime.backends.hf_scoring import end_of_turn, reference_ids
from seedledger.trainers.rewards.loglik import mean_logprob


def loglik(
    backend: Any, master: dict[str, torch.Tensor], population: Population, prompts: list[Messages],
    references: list[str],
) -> LikelihoodOutput:
    """Every member's mean log-probability of each row's reference completion (ended by
    the end-of-turn token): prompt + reference as one prompt, scored by vLLM's
    `prompt_logprobs` (no token decoded beyond one). Full-rank members load in turn;
    low-rank and LoRA members ride on their own adapters in one `generate`."""
    from vllm import SamplingParams

    if population.paths or population.shrink != 1.0:
        raise ValueError("members along the replay state's paths (LM-MA-ES, GA survivors) need the hf backend")
    started = time.perf_counter()
    contexts = [t["prompt_token_ids"] for t in backend._token_prompts(prompts)]
    targets = reference_ids(backend.tokenizer, model_end_of_turn(backend.model_dir, backend.tokenizer), references)
    rows = [{"prompt_token_ids": c + t} for c, t in zip(contexts, targets, strict=True)]
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
    outputs = []
    if not backend.keeps_master:
        for key, sign in zip(population.keys, population.signs, strict=True):
            backend.load_member(master, key, sign, population.sigma)
            outputs += backend.llm.generate(rows, params, use_tqdm=False)
    else:
        adapters = backend._slots.members(population)
        outputs = backend.llm.generate(rows * len(population), params, use_tqdm=False,
                                       lora_request=[a for a in adapters for _ in rows])
    per = len(rows)
    scores = []
    for j, out in enumerate(outputs):
        c, t = contexts[j % per], targets[j % per]
        picked = out.prompt_logprobs[len(c) : len(c) + len(t)]
        scores.append(mean_logprob([lp[tok].logprob for lp, tok in zip(picked, t, strict=True)]))
    return LikelihoodOutput([scores[m * per : (m + 1) * per] for m in range(len(population))],
                            {"score": time.perf_counter() - started})


def model_end_of_turn(model_dir: Path, tokenizer: Any) -> int:
    """`hf_scoring.end_of_turn` from the model directory's generation config, as HF loads it."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model_dir), local_files_only=True).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    return end_of_turn(eos, tokenizer)
