"""Full kind (``"v1"`` / ``"all"``): every tensor is trained; member noise is ε from the v1
counter noise (``replay.noise``), and its fused update runs here (numba on CPU, Triton on
CUDA, else the torch reference, all giving the same bits: ``replay.update``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seedledger.ledger.errors import SeedLedgerError

from .. import _reference as ref
from ..noise import _use_fast, _use_triton, noise_xkey, perturb_, tensor_key
from ..table import TABLE_NP
from .base import Item, PerturbationKind, short

SPEC = "v1"
ALL = "all"


@dataclass(frozen=True)
class Full(PerturbationKind):
    """Every tensor trained with v1 noise; each member has weights of its own."""

    name = "full"
    label = "full"
    known_specs = (SPEC,)

    @classmethod
    def claims(cls, noise_spec: str, param_selection: str) -> bool:
        return noise_spec == SPEC

    @classmethod
    def parse(cls, noise_spec: str, param_selection: str) -> Full:
        if param_selection != ALL:
            raise SeedLedgerError(f"noise spec 'v1' trains every tensor: parameter selection must be 'all', "
                                  f"not {short(param_selection)}")
        return cls()

    @property
    def noise_spec(self) -> str:
        return SPEC

    @property
    def param_selection(self) -> str:
        return ALL

    @property
    def inv_sqrt_rank(self) -> float:
        raise ValueError("a full perturbation has no rank")

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        return True

    def noise_(self, out: torch.Tensor, src: torch.Tensor, name: str, key: int, scale: float) -> torch.Tensor:
        """v1 noise's direct form: cast(src + scale·ε) in one pass (the SGD step's bits)."""
        return perturb_(out, src, tensor_key(key, name), scale)

    def apply(self, items: Sequence[Item], keys: Sequence[int], coefs: Sequence[float], rule: int,
              scal: Sequence[float]) -> None:
        groups: dict[tuple[Any, torch.device], list] = {}  # one call per kernel and device
        for tname, theta, bufs in items:
            tkeys = [tensor_key(k, tname) for k in keys]
            groups.setdefault((kernel(theta.device), theta.device), []).append((theta, tkeys, bufs))
        for (fn, _), group in groups.items():
            fn(group, coefs, rule, scal)


# --- the fused v1 update: (θ, tensor keys, buffers) items, one kernel call per device --------


def kernel(device: torch.device, reference: bool = False):
    """The fused update for tensors on `device`: numba (CPU), Triton (CUDA) or the reference."""
    if not reference and _use_fast(device):
        return apply_fast
    if not reference and _use_triton(device):
        return apply_triton
    return apply_reference


def apply_triton(items: list, coefs: Sequence[float], rule: int, scal: Sequence[float]) -> None:
    """All tensors of one device through the Triton kernel (one launch per tensor)."""
    from .. import _triton_kernels as tk

    kxs = [[noise_xkey(x) for x in tk_] for _, tk_, _ in items]
    tk.apply_many([(theta, bufs) for theta, _, bufs in items], [tk_ for _, tk_, _ in items], kxs,
                  list(coefs), rule, list(scal))


def apply_fast(items: list, coefs: Sequence[float], rule: int, scal: Sequence[float]) -> None:
    """All CPU tensors of one generation in a single parallel numba call."""
    from .. import _cpu_kernels as k
    from .._cpu_args import typed_list, work_items

    thetas = [theta.detach().view(-1).numpy() for theta, _, _ in items]
    bufs = [[b.detach().view(-1).numpy() for b in bs] for _, _, bs in items]
    buf1s = [b[0] if b else t for b, t in zip(bufs, thetas, strict=True)]  # unused when rule has none
    buf2s = [b[1] if len(b) > 1 else t for b, t in zip(bufs, thetas, strict=True)]
    keys = np.array([tk for _, tk, _ in items], dtype=np.uint64).reshape(len(items), len(coefs))
    kxs = np.array([[noise_xkey(x) for x in tk] for _, tk, _ in items], dtype=np.uint64).reshape(keys.shape)
    work_t, work_s = work_items([t.shape[0] for t in thetas])
    if work_t.shape[0] == 0:
        return
    k.apply_many(
        typed_list(thetas), keys, kxs, np.array(coefs, dtype=np.float32), TABLE_NP, rule,
        np.array(scal or [0.0], dtype=np.float32), typed_list(buf1s), typed_list(buf2s), work_t, work_s,
    )


def apply_reference(items: list, coefs: Sequence[float], rule: int, scal: Sequence[float]) -> None:
    """The torch reference (the oracle), one tensor at a time."""
    for theta, tkeys, bufs in items:
        g = ref.delta_ref(list(tkeys), list(coefs), theta.numel(), theta.device).view(theta.shape)
        ref.apply_rule_ref(theta, g, rule, list(scal), *(list(bufs) + [None, None])[:2])
