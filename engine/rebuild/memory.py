"""Refuse a rebuild whose replay cannot fit in memory, before anything is loaded.

A seed file or ledger names its update rule per step, and a `paths` step (LM-MA-ES's
memory, a GA's survivors) keeps one fp32 copy of the trained weights per path: a planted
file within every other bound can still ask for hundreds of copies. The estimate comes
from the records and the base's safetensors headers alone, so a refusal costs nothing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import paths
from seedledger.replay.adapter import LoraSpec

ENV = "SEEDLEDGER_REBUILD_MEMORY_MB"  # an explicit bound, in MiB, in place of the machine's available memory
FIXED = {"sgd": 0, "momentum": 1, "adam": 2}  # fp32 copies of the trained weights each rule keeps
MIB = 1 << 20


def step_buffers(optimizer: Mapping[str, Any] | None) -> int:
    """fp32 copies of the trained weights one step's rule keeps: SGD none, momentum one,
    Adam two (its moments), `paths` one per path (`len(move)`)."""
    opt = optimizer or {}
    name = opt.get("name", "sgd")
    if name == paths.NAME:
        move = opt.get("move")
        return len(move) if isinstance(move, list | tuple) else 0
    return FIXED.get(name, 0) if isinstance(name, str) else 0


def estimate_bytes(base_params: int, trained_params: int, buffers: int) -> int:
    """Memory a replay needs: 4·(base_params + buffers·trained_params) bytes, i.e. the fp32
    master (the base, as loaded) plus `buffers` fp32 copies of the trained tensors (the
    optimizer state, `step_buffers`' largest over the steps)."""
    return 4 * (base_params + buffers * trained_params)


def model_params(model_dir: Path, adapter: LoraSpec | None) -> tuple[int, int]:
    """(the base's elements, the trained elements) from the model directory's safetensors
    headers alone: a full run trains at most every weight; an adapter run r·(in + out) per
    targeted linear (A and B; ESSA trains fewer)."""
    from safetensors import safe_open

    total = trained = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # safe_open has no __iter__
                shape = f.get_slice(name).get_shape()
                total += math.prod(shape)
                if adapter is not None and len(shape) == 2 and name.endswith(".weight") \
                        and adapter.matches(name.removesuffix(".weight")):
                    trained += adapter.rank * (shape[0] + shape[1])
    return total, total if adapter is None else trained


def bound_bytes() -> tuple[int, str] | None:
    """(bound, what it is): `SEEDLEDGER_REBUILD_MEMORY_MB` when set, else the machine's
    available memory (psutil, else /proc/meminfo's MemAvailable); None when unknown."""
    cap = os.environ.get(ENV)
    if cap:
        try:
            mib = float(cap)
        except ValueError:
            mib = -1.0
        if not mib > 0:
            raise SeedLedgerError(f"{ENV}={cap[:40]!r} is not a positive number of MiB")
        return int(mib * MIB), ENV
    try:
        import psutil

        return int(psutil.virtual_memory().available), "available memory"
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available memory"
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_rebuild_memory(what: str, model_dir: Path, optimizers: Iterable[Mapping[str, Any] | None],
                         adapter: LoraSpec | None, carried: int = 0) -> None:
    """Refuse in one line when replaying `what` (its steps' optimizer dicts, from base
    `model_dir`, training `adapter` or every weight, with `carried` buffers of the kind's own
    beside the optimizer's: quant_codes' residual) needs more than `bound_bytes`."""
    if bound_bytes() is not None:
        check_replay_memory(what, *model_params(model_dir, adapter), optimizers, carried)


def check_replay_memory(what: str, base: int, trained: int, optimizers: Iterable[Mapping[str, Any] | None],
                        carried: int = 0) -> None:
    """`check_rebuild_memory` for a base of `base` elements training `trained` of them: a
    module run's, whose base is counted from its generation 0 as loaded (no safetensors
    headers to read beforehand)."""
    bound = bound_bytes()
    if bound is None:
        return
    buffers = max((step_buffers(o) for o in optimizers), default=0) + carried
    need = estimate_bytes(base, trained, buffers)
    if need > bound[0]:
        raise SeedLedgerError(
            f"{what}: replaying needs about {need / MIB:,.1f} MiB (an fp32 base of {base:,} parameters plus "
            f"{buffers} optimizer/path copies of {trained:,} trained ones), more than the bound of "
            f"{bound[0] / MIB:,.1f} MiB ({bound[1]}); set {ENV} to change the bound"
        )
