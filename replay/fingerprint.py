"""128-bit fingerprint of master weights, identical on CPU and CUDA and in any process.

Per tensor, two lanes: Σ_i bits_i · (fmix64(salt + i·G) | 1) mod 2**64 over the raw
element bit patterns. Integer sums are order independent (so any parallel reduction
gives the same value), a flipped bit changes a lane by ±2**b·(odd) ≠ 0, and the
position-dependent multipliers catch permutations. Tensors are combined by sorted name
with blake2b together with dtype and shape, so renames and reshapes are caught too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import torch

from . import _reference as ref
from .noise import _use_fast

_NP_BITS = {4: np.uint32, 2: np.uint16, 1: np.uint8}


def tensor_lanes(t: torch.Tensor) -> tuple[int, int]:
    """The two 64-bit lanes of one tensor (numba on CPU, torch reference elsewhere)."""
    return all_lanes({"t": t})["t"]


def _bits_np(t: torch.Tensor) -> np.ndarray:
    flat = t.detach().contiguous().view(-1)
    if not flat.dtype.is_floating_point or flat.dtype == torch.bfloat16:
        flat = flat.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[flat.element_size()])
    return flat.numpy().view(_NP_BITS[flat.element_size()])


def all_lanes(master: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, int]]:
    """Lanes of every tensor; CPU tensors of one element width share one parallel call."""
    from . import _cpu_kernels as k
    from ._cpu_args import typed_list, work_items

    out: dict[str, tuple[int, int]] = {}
    groups: dict[int, list[str]] = {}
    for name, t in master.items():
        if _use_fast(t.device) and t.element_size() in _NP_BITS:
            groups.setdefault(t.element_size(), []).append(name)
        else:
            out[name] = ref.fingerprint_lanes_ref(t.contiguous())
    for names in groups.values():
        bits = [_bits_np(master[n]) for n in names]
        work_t, work_s = work_items([b.shape[0] for b in bits])
        salt_a, salt_b = np.uint64(ref.FP_SALTS[0]), np.uint64(ref.FP_SALTS[1])
        lanes = k.fingerprint_many(typed_list(bits), salt_a, salt_b, work_t, work_s)
        out |= {n: (int(lanes[i, 0]), int(lanes[i, 1])) for i, n in enumerate(names)}
    return out


def fingerprint(master: Mapping[str, torch.Tensor]) -> str:
    """32 hex chars naming the exact bits, names, dtypes and shapes of ``master``."""
    lanes = all_lanes(master)
    h = hashlib.blake2b(b"seedledger/fingerprint/v1", digest_size=16)
    for name in sorted(master):
        t = master[name]
        a, b = lanes[name]
        h.update(name.encode("utf-8") + b"\0")
        h.update(f"{str(t.dtype).removeprefix('torch.')}{tuple(t.shape)}".encode() + b"\0")
        h.update(a.to_bytes(8, "little") + b.to_bytes(8, "little"))
    return h.hexdigest()
