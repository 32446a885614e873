"""Which backend `backend: auto` (the default) runs: decided once, when a run is created.

By measurement, on this project's 2-core reference machine with SmolLM2-135M (docs/
benchmarks.md, "Which backend `auto` takes"): vLLM evaluated a generation faster than
transformers in every shape measured, decoded or likelihood fitness, full-rank or
low-rank (1.6-2.7x; the likelihood shapes under load), but its engine start costs ~40 s
more than hf's model load (54 s against 15 s, quiet), so a short run is faster on hf.
`auto` therefore takes:

- hf when vLLM is not installed, the device is not the CPU (a vLLM build is for one
  platform, and its GPU memory reservation is not ours to take unasked), or vLLM's CPU
  attention cannot run the model's head size (`tiny`'s);
- hf when the run uses something only the in-process backend builds (`hf_only`): the
  KL-to-base penalty, a quantized frozen base, LM-MA-ES or GA survivors, a static KV
  cache, or an adapter (train: lora; its batched LoRA path is measured on hf, docs/lora.md);
- hf when the run is shorter than `MIN_GENERATIONS` (a quick look): the least saving
  measured, 8.4 s a generation (decoded full-rank, quiet), repays the start from the fifth;
- vLLM otherwise.

Like `members_per_forward` (engine.runtime.setup.batching), the choice is stored with the run: its
config says `hf` or `vllm`, so resume, fork, evaluate and verify never depend on what is
installed later. `SEEDLEDGER_AUTO_BACKEND=hf` makes `auto` take hf (the test suite does:
its runs last seconds, less than vLLM's start-up).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from seedledger.engine.config_backends import BACKEND_FORMS, BACKEND_KV_CACHES
from seedledger.engine.runtime.setup.preflight import VLLM_CPU_HEAD_SIZES, head_dim
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.kinds.forms import common

PIN = "SEEDLEDGER_AUTO_BACKEND"
MIN_GENERATIONS = 5  # a run's target below this takes hf: vLLM's engine start is not repaid


def hf_only(cfg) -> str | None:
    """The first setting of `cfg` that only the in-process hf backend serves, else None."""
    if cfg.kl is not None:
        return "kl"
    if cfg.base_quantization != "none":
        return "base_quantization"
    if cfg.algorithm == "lmmaes":
        return "algorithm lmmaes"
    if cfg.ga is not None and cfg.ga.survivors > 1:
        return "ga.survivors"
    if cfg.sampling.kv_cache not in BACKEND_KV_CACHES["vllm"]:
        return "sampling.kv_cache"
    if not cfg.on_weights():  # an adapter or int8 run
        return "train"
    if common(cfg.perturbation_type().forms, BACKEND_FORMS["vllm"]) is None:
        return "train"  # its members take no form vLLM builds (engine.config_backends)
    return None


def resolve(cfg, model_dir: Path) -> str:
    """The run's backend: `cfg.backend` unless it is `auto` (see the module docstring)."""
    if cfg.backend != "auto":
        return cfg.backend
    pinned = os.environ.get(PIN)
    if pinned not in (None, "", "hf"):
        raise SeedLedgerError(f"{PIN}={pinned!r}: the only pin is hf (set backend: vllm in the config instead)")
    if pinned == "hf" or importlib.util.find_spec("vllm") is None:
        return "hf"
    if not str(cfg.device).startswith("cpu") or hf_only(cfg) is not None or cfg.generations < MIN_GENERATIONS:
        return "hf"
    head = head_dim(model_dir)
    return "hf" if head is not None and head not in VLLM_CPU_HEAD_SIZES else "vllm"
