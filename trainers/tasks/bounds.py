"""Bounds on a task's size and sandbox settings, in one place: a stored config (a seed file's,
a ledger's) is data, and `train_size: 10**9` built a 2 GB dataset on `resume` before any
limit applied. The bounds are what the tasks need with room to spare (the largest shipped
config uses train_size 10000); checked by the config (engine.config), by `import` and
`rebuild FILE.seeds` (engine.rebuild.seedcheck, on a seed file's stored config), and by the
loaders (trainers.tasks). Task settings are the tasks' own, so the bounds live with them
(they were replay/task_settings.py)."""

from __future__ import annotations

from typing import Any

from seedledger.ledger.errors import SeedLedgerError

BOUNDS = {"train_size": 100_000, "test_size": 10_000, "cpu_seconds": 600, "memory_mb": 16_384}


def check_setting(task: str, label: str, value: Any) -> int:
    """`value` as `label` of `task`: a positive integer up to its bound, else one line."""
    top = BOUNDS[label]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
        raise SeedLedgerError(f"task {task}: {label} must be a positive integer at most {top:_}, not {str(value)[:40]}")
    return value


def check_task_settings(spec: Any) -> None:
    """Every bounded setting of a task spec (a name, a mapping, a mix), without loading it."""
    if isinstance(spec, list):
        for item in spec:
            check_task_settings(item)
    elif isinstance(spec, dict) and "mix" in spec:
        check_task_settings(spec["mix"])
    elif isinstance(spec, dict):
        name = spec.get("dataset") or spec.get("name")
        for label in BOUNDS:  # in BOUNDS' order: the same line every time
            if label in spec:
                check_setting(str(name)[:40], label, spec[label])
