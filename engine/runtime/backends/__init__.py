"""Evaluation backends: one model, member weights from the master, batched generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seedledger.engine.runtime.backends import choice
from seedledger.engine.runtime.backends.base import Backend
from seedledger.ledger.errors import SeedLedgerError

__all__ = ["Backend", "HFBackend", "make_backend"]  # VLLMBackend: engine.runtime.backends.vllm


def make_backend(cfg: Any, model_dir: Path) -> Backend:
    """The backend a training config asks for (`backend`, `device`, `dtype`, `sampling`)."""
    import torch

    if cfg.backend == "module":  # any torch.nn.Module (engine.runtime.models.module)
        from seedledger.engine.runtime.backends.module import ModuleBackend

        return ModuleBackend(cfg.model, device=cfg.device, perturbation=cfg.perturbation_spec())
    kwargs = {
        "device": cfg.device,
        "dtype": getattr(torch, cfg.dtype),
        "batch_size": cfg.batch_size,
        "temperature": cfg.sampling.temperature,
        "top_p": cfg.sampling.top_p,
        "perturbation": cfg.perturbation_spec(),
    }
    backend = choice.resolve(cfg, model_dir)  # a run's config names one; a bare config may say auto
    if backend == "hf":
        from seedledger.engine.runtime.backends.hf import HFBackend

        init = getattr(cfg.train, "init", None)  # a LoRA run's PEFT directory, else None
        return HFBackend(model_dir, base_quantization=cfg.base_quantization, adapter_init=init,
                         kl_reference=cfg.kl is not None, kv_cache=cfg.sampling.kv_cache, **kwargs)
    if backend == "vllm":
        from seedledger.engine.runtime.backends.vllm import VLLMBackend

        if cfg.members_per_forward is not None:  # the run's stored group: its LoRA slots
            kwargs["members_per_forward"] = cfg.members_per_forward
        init = getattr(cfg.train, "init", None)  # a LoRA run's PEFT directory, else None
        return VLLMBackend(model_dir, base_quantization=cfg.base_quantization, adapter_init=init, **kwargs)
    raise SeedLedgerError(f"unknown backend {backend!r}: use auto, hf, vllm or module")


def __getattr__(name: str) -> Any:
    if name == "HFBackend":  # lazy: importing the package must not import transformers
        from seedledger.engine.runtime.backends.hf import HFBackend

        return HFBackend
    raise AttributeError(name)
