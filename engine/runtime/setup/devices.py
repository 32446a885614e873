"""Devices named by users (`--device`, the config's `device`): checked before any work.

A device torch cannot use (`cuda` on a CPU-only build, `cuda:3` on a one-GPU machine, a
typo) is bad input: one line and exit 2 before a run is created or a model is loaded,
instead of an AssertionError deep inside torch after the run exists. This is the one
device check: every command calls it, and `preflight.check` through it.
"""

from __future__ import annotations

from seedledger.ledger.errors import SeedLedgerError


def check_device(name: str) -> str:
    """`name` when torch can place tensors there, else SeedLedgerError saying why."""
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise SeedLedgerError(f"device {name!r} is not a device torch knows (cpu, cuda, cuda:N)") from None
    if dev.type == "cpu":
        return name
    backend = getattr(torch, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        why = f"has no usable {dev.type} device"
        if dev.type == "cuda":  # a CPU-only build, or a CUDA build on a machine without a GPU
            why = "has no CUDA support" if torch.version.cuda is None else "sees no CUDA device"
        raise SeedLedgerError(f"device {name!r} is not available: this torch ({torch.__version__}) {why}; use cpu")
    count = getattr(backend, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        raise SeedLedgerError(f"device {name!r} does not exist: this machine has {count} {dev.type} device(s)")
    return name
