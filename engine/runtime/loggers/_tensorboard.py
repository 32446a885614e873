"""TensorBoard mirror: event files under `log_dir/tensorboard/RUN` (ledger.names.run_path:
never outside it, whatever the name), written with torch's SummaryWriter (torch is
already a dependency; only the `tensorboard` package is added)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from seedledger.ledger.names import run_path

from ._flatten import flatten


class TensorBoardLogger:
    def __init__(self, run_name: str, log_dir: Path, config: dict[str, Any]) -> None:
        self.path = run_path(log_dir / "tensorboard", run_name)  # contained, whatever the name
        self.writer = SummaryWriter(log_dir=str(self.path))
        # hparams go into this run's own event file (add_hparams would open a sub-run).
        for summary in hparams(flatten(config), {}):
            self.writer.file_writer.add_summary(summary)
        text = json.dumps(config, indent=2, sort_keys=True, default=str)
        self.writer.add_text("config", f"```json\n{text}\n```", 0)

    def log_generation(self, generation: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, generation)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
