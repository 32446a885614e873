"""Seeded sampling, the same on every backend: each prompt's (and sample's) own stream.

The uniform draws for prompt i come from a CPU generator seeded by `prompt_stream_seed(seed,
i)` alone, one draw per new token, so a row's stream never depends on the batch's other
prompts; vLLM's per-request seeds come from the same function. `SeededSampler` picks the
token by inverse CDF (over the probability-sorted, top-p-truncated distribution when
top_p < 1, else in vocabulary order) inside HF's greedy decoder.
"""

from __future__ import annotations

import torch

from seedledger.replay.hashing import MASK64, splitmix64


def prompt_stream_seed(seed: int, index: int, sample: int = 0) -> int:
    """The CPU-generator seed for sample `sample` of prompt `index` under `seed` (63 bits,
    for manual_seed). Sample 0 keeps the seed that prompt had before samples existed."""
    x = splitmix64(seed & MASK64) ^ (index & MASK64)  # splitmix64 spreads (seed, index) apart
    if sample:
        x = splitmix64(x) ^ (sample & MASK64)
    return splitmix64(x) >> 1


class SeededSampler:
    """Logits processor that samples one token per row from its own pre-drawn uniforms: the
    scores it returns are -inf except at the chosen token, which the greedy decoder picks."""

    def __init__(self, uniforms: torch.Tensor, prompt_len: int, temperature: float, top_p: float):
        self.uniforms = uniforms  # [batch, max_new_tokens], float64 on CPU
        self.prompt_len = prompt_len
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_len
        probs = torch.softmax(scores.double() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            keep = (cum - sorted_p) < self.top_p  # smallest prefix whose mass reaches top_p
            keep[:, 0] = True
            sorted_p = sorted_p * keep
        else:  # no truncation: the vocabulary order serves as well and needs no sort
            sorted_p = probs
            order = torch.arange(probs.shape[1], device=probs.device).expand_as(probs)
        cum = torch.cumsum(sorted_p, dim=-1)
        u = self.uniforms[:, step].to(cum.device) * cum[:, -1]
        pick = torch.searchsorted(cum, u.unsqueeze(1)).clamp_(max=cum.shape[1] - 1)
        token = order.gather(1, pick)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, token, 0.0)
        return out
