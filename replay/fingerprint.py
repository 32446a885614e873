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
    size = t.element_size()
    if _use_fast(t.device) and size in _NP_BITS and t.numel() > 0:
        from . import _cpu_kernels as k

        flat = t.detach().contiguous().view(-1)
        bits = flat.numpy().view(_NP_BITS[size]) if t.dtype != torch.bfloat16 else (
            flat.view(torch.int16).numpy().view(np.uint16)
        )
        a, b = k.fingerprint_lanes(bits, np.uint64(ref.FP_SALTS[0]), np.uint64(ref.FP_SALTS[1]))
        return int(a), int(b)
    return ref.fingerprint_lanes_ref(t.contiguous())


def fingerprint(master: Mapping[str, torch.Tensor]) -> str:
    """32 hex chars naming the exact bits, names, dtypes and shapes of ``master``."""
    h = hashlib.blake2b(b"seedledger/fingerprint/v1", digest_size=16)
    for name in sorted(master):
        t = master[name]
        a, b = tensor_lanes(t)
        h.update(name.encode("utf-8") + b"\0")
        h.update(f"{str(t.dtype).removeprefix('torch.')}{tuple(t.shape)}".encode() + b"\0")
        h.update(a.to_bytes(8, "little") + b.to_bytes(8, "little"))
    return h.hexdigest()
