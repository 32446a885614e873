"""Shared inputs and oracles for the replay tests (CPU, Triton interpreter, GPU)."""

from __future__ import annotations

import torch

from seedledger.replay import lowrank, noise, update
from seedledger.replay.perturbation import step_perturbation

SPECIALS = (-0.0, 0.0, 1e-45, -1e-45, 1e-40, -3e-39, 1.2e-38, 65519.0, -65520.0, 1e30, -3e38)


def special_values(n: int, seed: int) -> torch.Tensor:
    """Random normals with −0.0, +0.0, subnormals, tiny and huge values sprinkled in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g)
    specials = torch.tensor(SPECIALS)
    if n:
        idx = torch.randint(0, n, (min(n, 64),), generator=g)
        x[idx] = specials[torch.arange(idx.numel()) % specials.numel()]
    return x


def reference_apply(master, state, step) -> None:
    """`update.apply_step` with the torch reference forced (same bookkeeping, either kind)."""
    kind = step_perturbation(step)
    name = step.optimizer["name"]
    if state.name != name:
        state.reset(name)
    state.step += 1
    scal = update._scalars(name, step.optimizer, state.step)
    if kind.kind == "lowrank":
        items = [(n, t, [state.buffer(b, n, t) for b in update.BUFFERS[name]])
                 for n, t in master.items() if kind.trained(n, t.shape)]
        lowrank.apply(items, step.keys, step.coefficients, update.RULES[name], scal, kind.rank, reference=True)
        return
    for tname, theta in master.items():
        bufs = [state.buffer(kind, tname, theta) for kind in update.BUFFERS[name]]
        tkeys = [noise.tensor_key(k, tname) for k in step.keys]
        update.apply_tensor(theta, tkeys, step.coefficients, update.RULES[name], scal, bufs, fast=False)
