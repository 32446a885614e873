"""Worker pools: `local` (in process) and `ray` (one actor per worker)."""

from __future__ import annotations

from pathlib import Path

from engine.config import TrainConfig


def make_pool(cfg: TrainConfig, model_dir: Path):
    if cfg.workers.pool == "ray":
        from engine.pools.ray import RayPool

        return RayPool(cfg, model_dir)
    from engine.pools.local import LocalPool

    return LocalPool(cfg, model_dir)
