"""Worker pools: `local` (in process) and `ray` (one actor per worker)."""

from __future__ import annotations

from pathlib import Path

from seedledger.engine.config import TrainConfig
from seedledger.ledger.errors import SeedLedgerError


class PoolFailure(SeedLedgerError):
    """The pool could not produce a sound result (a worker kept dying, replicas disagree):
    a failure of the run, not bad input, so the CLI exits 1."""

    exit_code = 1


class ReplicaMismatch(PoolFailure):
    """Two replicas hold different weights after the same generation."""


def make_pool(cfg: TrainConfig, model_dir: Path):
    if cfg.workers.pool == "ray":
        from seedledger.engine.runtime.pools.ray import RayPool

        return RayPool(cfg, model_dir)
    from seedledger.engine.runtime.pools.local import LocalPool

    return LocalPool(cfg, model_dir)
