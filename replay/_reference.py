"""Plain-torch reference of noise v1, the fused update and the fingerprint lanes.

This is the oracle: the numba and Triton kernels must match it bit for bit; it is the
path used where neither runs (``SEEDLEDGER_REPLAY_IMPL=reference``, or no Triton on
CUDA). Integer work is int64 with wrapping multiply (the low 64 bits equal uint64
arithmetic); float work is one IEEE op per torch call, never fused.
"""

from __future__ import annotations

import torch

from .hashing import GOLDEN, fmix64, fmix64_t, to_i64
from .table import table_on

NOISE_SALT = 0xD6E8FEB86659FD93
FP_SALTS = (0x8A5CD789635D2DFF, 0x3C6EF372FE94F82B)  # fingerprint lanes
CHUNK = 1 << 22  # elements per reference chunk: bounds int64 temporaries to ~32 MiB


def noise_ref(key: int, numel: int, offset: int = 0, device: str | torch.device = "cpu") -> torch.Tensor:
    """eps[i] = TABLE[16-bit field (i mod 4) of fmix64((key + (i//4)·G) ^ fmix64(key ^ SALT))]."""
    out = torch.empty(numel, dtype=torch.float32, device=device)
    table = table_on(str(out.device))
    k = to_i64(key)
    kx = to_i64(fmix64(key ^ NOISE_SALT))
    for start in range(0, numel, CHUNK):
        stop = min(start + CHUNK, numel)
        a = torch.arange(offset + start, offset + stop, dtype=torch.int64, device=out.device)
        s = ((a >> 2) * to_i64(GOLDEN) + k) ^ kx
        idx = (fmix64_t(s) >> ((a & 3) * 16)) & 0xFFFF
        out[start:stop] = table[idx]
    return out


def delta_ref(keys: list[int], coefs32: list[float], numel: int, device) -> torch.Tensor:
    """Δ = ((−0 + c0·ε0) + c1·ε1) + ...: exact products, fp32 sums in member order.

    Members with c == 0 are skipped and the sum starts at −0.0, so an all-zero generation
    gives Δ = −0.0 and θ + Δ == θ bit for bit (−0.0 included); see ``update``.
    """
    delta = torch.full((numel,), -0.0, dtype=torch.float32, device=device)
    for key, c in zip(keys, coefs32, strict=True):
        if c == 0.0:
            continue
        prod = torch.mul(noise_ref(key, numel, 0, device), c)
        delta = torch.add(delta, prod)
    return delta


def lowrank_delta_ref(factors: list[tuple[torch.Tensor, torch.Tensor]], scales: list[float],
                      shape: tuple[int, int], device) -> torch.Tensor:
    """g = −0 + Σ_m Σ_r (s_m·A_m[:, r]) ⊗ B_m[:, r], members then r in order (A_m [out, R],
    B_m [in, R], s_m = c_m/√R). Each outer product is one broadcast multiply (one rounding
    per element), each add one more; s_m·A is exact. Members with s == 0 are skipped, as
    in ``delta_ref``."""
    g = torch.full(shape, -0.0, dtype=torch.float32, device=device)
    for (a, b), s in zip(factors, scales, strict=True):
        if s == 0.0:
            continue
        sa = torch.mul(a, s)
        for r in range(a.shape[1]):
            g = torch.add(g, torch.mul(sa[:, r : r + 1], b[:, r].reshape(1, -1)))
    return g


def fingerprint_lanes_ref(t: torch.Tensor) -> tuple[int, int]:
    """Σ_i bits_i · (fmix64(salt + i·G) | 1) mod 2**64 for each lane salt (order free)."""
    flat = t.detach().reshape(-1)
    bits_all = _bits_i64(flat)
    lanes = []
    for salt in FP_SALTS:
        acc = 0
        for start in range(0, flat.numel(), CHUNK):
            stop = min(start + CHUNK, flat.numel())
            i = torch.arange(start, stop, dtype=torch.int64, device=flat.device)
            m = fmix64_t(i * to_i64(GOLDEN) + to_i64(salt)) | 1
            acc += int(torch.sum(bits_all[start:stop] * m).item())
        lanes.append(acc & ((1 << 64) - 1))
    return lanes[0], lanes[1]


def _bits_i64(flat: torch.Tensor) -> torch.Tensor:
    """Element bit patterns, zero-extended to int64."""
    size = flat.element_size()
    if size == 4:
        return flat.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    if size == 2:
        return flat.view(torch.int16).to(torch.int64) & 0xFFFF
    if size == 1:
        return flat.view(torch.uint8).to(torch.int64)
    if size == 8:
        return flat.view(torch.int64)
    raise TypeError(f"cannot fingerprint dtype {flat.dtype}")


def apply_rule_ref(
    theta: torch.Tensor, g: torch.Tensor, rule: int, scal: list[float], buf1, buf2
) -> None:
    """The update rules as one IEEE op per torch call (same sequence as the numba kernel)."""
    if rule == 0:
        theta.add_(g)
    elif rule == 1:
        beta, omd, lr = scal
        buf1.mul_(beta)
        buf1.add_(torch.mul(g, omd))
        theta.add_(torch.mul(buf1, lr))
    else:
        b1, omb1, b2, omb2, isb2, eps, step_size = scal
        buf1.mul_(b1)
        buf1.add_(torch.mul(g, omb1))
        buf2.mul_(b2)
        buf2.add_(torch.mul(torch.mul(g, g), omb2))
        # torch's CPU fp32 sqrt is not correctly rounded (vectorized approximation);
        # the fp64 sqrt rounded once to fp32 is, on every device.
        root = torch.sqrt(buf2.double()).float()
        d = torch.add(torch.mul(root, isb2), eps)
        theta.add_(torch.mul(torch.div(buf1, d), step_size))
