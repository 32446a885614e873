"""Noise spec v1: keys, the element function, coefficient rounding, perturbed weights.

Element i of the noise for key k depends only on (k, i): a splitmix64-style counter
hash of (k, i // 4) gives 64 bits, whose 16-bit field i % 4 indexes a fixed table of
Gaussian quantiles (``replay.table``). No floating-point function is evaluated, so the
values are the same on every device, thread count, process and torch version.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import _reference as ref
from .hashing import MASK64, fmix64, mix, stable_hash
from .table import TABLE_NP

NOISE_SPEC = "v1"
SIG_BITS = 12
_RUN_DOMAIN = stable_hash("seedledger/noise/v1/run")
_MEMBER_DOMAIN = stable_hash("seedledger/noise/v1/member")
_MIN_COEF = 2.0**-100  # below this c·eps could underflow fp32: flushed to 0
_MAX_COEF = 2.0**100


def run_key(seed: int) -> int:
    """The run's root key from the config's seed (same seed → same noise, any run name)."""
    return mix(_RUN_DOMAIN, int(seed) & MASK64)


def member_key(run_key: int, generation: int, member: int) -> int:
    """Key of member ``member`` (0-based) of generation ``generation`` (1-based)."""
    return mix(mix(mix(run_key, _MEMBER_DOMAIN), int(generation)), int(member))


def tensor_key(member_key: int, tensor_name: str) -> int:
    """Key of one named tensor's noise for a member (name hashed with blake2b)."""
    return mix(member_key, stable_hash(tensor_name))


def noise_xkey(key: int) -> int:
    """Per-key whitening constant of the counter hash (spec v1)."""
    return fmix64((key & MASK64) ^ ref.NOISE_SALT)


def round_coefficient(x: float) -> float:
    """Round to at most 12 significant bits (ties to even) so c·eps is exact in fp32.

    Magnitudes below 2**-100 become 0.0 (their products could underflow); non-finite
    values or magnitudes above 2**100 raise ValueError.
    """
    x = float(x)
    if not math.isfinite(x) or abs(x) > _MAX_COEF:
        raise ValueError(f"coefficient {x!r} is not a finite value within ±2**100")
    if abs(x) < _MIN_COEF:
        return 0.0
    m, e = math.frexp(x)
    return math.ldexp(round(m * (1 << SIG_BITS)), e - SIG_BITS)


def check_coefficient(x: float) -> float:
    """Return ``x`` if it is already rounded (as the ledger stores it), else raise."""
    if round_coefficient(x) != x:
        raise ValueError(f"coefficient {x!r} has more than {SIG_BITS} significant bits")
    return x


def _use_fast(device: torch.device) -> bool:
    """The numba kernels (CPU tensors)."""
    return device.type == "cpu" and _fast_enabled()


def _fast_enabled() -> bool:
    from . import _backend

    return _backend.fast_cpu()


def _use_triton(device: torch.device) -> bool:
    """The Triton kernels (CUDA tensors; any tensor with SEEDLEDGER_REPLAY_IMPL=triton)."""
    from . import _backend

    return _backend.use_triton(device.type)


def generate(
    key: int, numel: int, *, offset: int = 0, device: str | torch.device = "cpu",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 noise elements offset .. offset+numel-1 of ``key`` (into ``out`` if given)."""
    if numel < 0 or offset < 0:
        raise ValueError("numel and offset must be >= 0")
    if out is not None and (out.dtype != torch.float32 or out.numel() != numel or not out.is_contiguous()):
        raise ValueError("out must be a contiguous fp32 tensor of numel elements")
    device = out.device if out is not None else torch.device(device)
    if not _use_fast(device):
        if _use_triton(device):
            from . import _triton_kernels as tk

            flat = None if out is None else out.detach().view(-1)
            res = tk.generate(key, noise_xkey(key), numel, offset, device, flat)
            return res if out is None else out
        res = ref.noise_ref(key, numel, offset, device)
        return res if out is None else out.copy_(res.view(out.shape))
    from . import _cpu_kernels as k

    if out is None:  # numpy asks the kernel for huge pages on large arrays: fewer page faults
        out = torch.from_numpy(np.empty(numel, dtype=np.float32))
    fn = k.generate if numel >= k.PARALLEL_MIN else k.generate_serial
    fn(np.uint64(key & MASK64), np.uint64(noise_xkey(key)), np.int64(offset), out.detach().view(-1).numpy(), TABLE_NP)
    return out


def perturb_(out: torch.Tensor, master: torch.Tensor, key: int, scale: float) -> torch.Tensor:
    """out = cast(master + scale·eps(key)) — evaluation weights built from the master.

    ``scale`` (sign·σ) must already be rounded (``round_coefficient``), so the product is
    exact and the only rounding is the fp32 add (then the cast to ``out.dtype``).
    """
    check_coefficient(scale)
    if master.dtype != torch.float32 or out.shape != master.shape:
        raise ValueError("perturb_ needs an fp32 master and an out of the same shape")
    if _use_fast(master.device) and master.is_contiguous() and out.device.type == "cpu":
        from . import _cpu_kernels as k

        src = master.detach().reshape(-1).numpy()
        key64, kx = np.uint64(key & MASK64), np.uint64(noise_xkey(key))
        fn = k.perturb if master.numel() >= k.PARALLEL_MIN else k.perturb_serial
        if out.dtype == torch.float32 and out.is_contiguous():
            fn(out.detach().view(-1).numpy(), src, key64, kx, np.float32(scale), TABLE_NP)
        else:
            tmp = torch.empty(master.numel(), dtype=torch.float32)
            fn(tmp.numpy(), src, key64, kx, np.float32(scale), TABLE_NP)
            with torch.no_grad():
                out.copy_(tmp.view(out.shape))
        return out
    if _use_triton(master.device) and master.is_contiguous() and out.device == master.device:
        from . import _triton_kernels as tk

        kx = noise_xkey(key)
        if out.dtype in tk.PERTURB_DTYPES and out.is_contiguous():
            return tk.perturb(out, master, key, kx, scale)
        tmp = torch.empty(master.shape, dtype=torch.float32, device=master.device)
        tk.perturb(tmp, master, key, kx, scale)
        with torch.no_grad():
            out.copy_(tmp)
        return out
    eps = ref.noise_ref(key, master.numel(), 0, master.device).view(master.shape)
    with torch.no_grad():
        out.copy_(torch.add(master.detach(), torch.mul(eps, scale)))
    return out
