"""benchmarks/task_baseline.py: its summary of a task's rewards (None = not applicable)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "task_baseline.py"


def _load():
    spec = importlib.util.spec_from_file_location("task_baseline", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_summary_skips_rewards_that_do_not_apply() -> None:
    summarize = _load().summarize
    mean, dist = summarize([1.0, None, 0.0, 0.5])
    assert mean == 0.5
    assert dist == "0.0: 25%, 0.5: 25%, 1.0: 25%, None: 25%"
    mean, dist = summarize([None, None])
    assert math.isnan(mean) and dist == "None: 100%"
