"""How many members share one batched forward: decided once, when a run is created.

Which rows decode together changes a forward's padding and batch shape, which may move
logits in their last bits and, rarely, flip a greedy near-tie; so the group size is part
of a run's stored config, never a decision taken at run time from free memory or load.
`resolve` fills it in when a run is created (an explicit `members_per_forward` wins):

- kinds whose members have weights of their own (full-rank runs): 1 (its prompts decode alone);
- kinds whose members may ride on the loaded master or frozen base (a member form that
  `rides_master`: low-rank, adapter and int8-scales runs), on CPU: as many members as fit
  `CPU_ROWS` rows (prompts × samples each). On this project's 2-core reference machine, HF
  throughput grows from 53 tok/s at 16 rows to 81 at 64 and 88 at 128, so more rows buy
  little and cost memory;
- low-rank on CUDA: as many rows as half the free device memory holds as KV cache for the
  prompts plus `max_new_tokens` (capped at `CUDA_MAX_ROWS`), measured at creation.
"""

from __future__ import annotations

import json
from pathlib import Path

CPU_ROWS = 128
CUDA_MAX_ROWS = 4096
PROMPT_TOKENS = 512  # the KV-cache estimate's prompt length (chat template + question)


def rows_per_member(cfg) -> int:
    return cfg.batch_size * (cfg.passk.n if cfg.passk is not None else 1)


def resolve(cfg, model_dir: Path) -> int:
    """The run's `members_per_forward` (see the module docstring for the rule)."""
    if cfg.members_per_forward is not None:
        return cfg.members_per_forward
    if not any(form.rides_master for form in cfg.perturbation_type().forms):  # every member has weights of its own
        return 1
    rows = CPU_ROWS
    if str(cfg.device).startswith("cuda"):
        rows = _cuda_rows(cfg, model_dir)
    return max(1, min(cfg.population, rows // rows_per_member(cfg)))


def _cuda_rows(cfg, model_dir: Path) -> int:
    import torch

    free, _ = torch.cuda.mem_get_info(torch.device(cfg.device))
    mc = json.loads((Path(model_dir) / "config.json").read_text())
    heads = mc["num_attention_heads"]
    head_dim = mc.get("head_dim") or mc["hidden_size"] // heads
    kv_heads = mc.get("num_key_value_heads") or heads
    width = {"float32": 4}.get(cfg.dtype, 2)
    per_row = 2 * mc["num_hidden_layers"] * kv_heads * head_dim * width
    per_row *= PROMPT_TOKENS + cfg.max_new_tokens
    return max(1, min(CUDA_MAX_ROWS, int(free * 0.5) // per_row))
