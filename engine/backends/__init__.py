"""Evaluation backends: one model, member weights from the master, batched generation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.backends.base import Backend
from ledger.errors import SeedLedgerError

__all__ = ["Backend", "HFBackend", "make_backend"]


def make_backend(cfg: Any, model_dir: Path) -> Backend:
    """The backend a training config asks for (`backend`, `device`, `dtype`, `sampling`)."""
    import torch

    if cfg.backend == "hf":
        from engine.backends.hf import HFBackend

        return HFBackend(
            model_dir,
            device=cfg.device,
            dtype=getattr(torch, cfg.dtype),
            batch_size=cfg.batch_size,
            temperature=cfg.sampling.temperature,
            top_p=cfg.sampling.top_p,
        )
    raise SeedLedgerError(f"backend {cfg.backend!r} is not built yet: use backend=hf")


def __getattr__(name: str) -> Any:
    if name == "HFBackend":  # lazy: importing the package must not import transformers
        from engine.backends.hf import HFBackend

        return HFBackend
    raise AttributeError(name)
