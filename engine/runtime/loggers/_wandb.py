"""Weights & Biases mirror, offline by default (no account, no network): the run lands in
`log_dir/wandb/offline-run-*` and `wandb sync` can upload it later. `$WANDB_MODE` and
`$WANDB_PROJECT` override mode and project."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import wandb


class WandbLogger:
    def __init__(self, run_name: str, log_dir: Path, config: dict[str, Any]) -> None:
        settings = wandb.Settings(
            silent=True,
            console="off",  # a mirror must not capture the trainer's stdout
            x_disable_stats=True,  # no system-metrics sampler competing for CPU
            save_code=False,
            disable_git=True,
        )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "seedledger"),
            name=run_name,
            dir=str(log_dir),
            mode=os.environ.get("WANDB_MODE", "offline"),
            config=config,
            reinit="create_new",
            settings=settings,
        )

    def log_generation(self, generation: int, metrics: dict[str, float]) -> None:
        self.run.log(dict(metrics), step=generation)

    def close(self) -> None:
        self.run.finish()
