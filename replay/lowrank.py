"""The exact low-rank update (spec ``lowrank-v1``) and low-rank evaluation weights.

Factors A_m [out, R], B_m [in, R] of member m for tensor ``name`` of shape (out, in) are v1
counter noise under keys of their own (``factors``; ``stacked_factors`` for K members):

  key_A = mix(tensor_key(k, name), stable_hash("seedledger/lowrank/v1/A")),  A[o, r] = ε(key_A, o·R + r)
  key_B = mix(tensor_key(k, name), stable_hash("seedledger/lowrank/v1/B")),  B[i, r] = ε(key_B, i·R + r)

so E_k = A·Bᵀ/√R (v1 table values: at most 12 significant bits, 2^-15.7 ≤ |v| ≤ 4.33;
R ∈ ``RANKS``, so 1/√R is a power of two and scaling by it is exact). One generation
(members m in order, those with c_m ≠ 0 only, s_m = c_m·(1/√R)):

  g[o, i] = −0.0 + Σ_m Σ_{r=0..R−1} ((s_m·A_m[o, r])·B_m[i, r])

one IEEE fp32 op at a time in exactly this order, then the rule of ``replay.update``
(the same ops as the full-rank update). Why every device gives the same bits:

- s_m is exact (c_m has ≤ 12 significant bits, 1/√R is a power of two, 2^-103 ≤ |s_m| ≤
  2^100) and so is s_m·A (12 × 12 significant bits; |s_m·A| ≥ 2^-119 is normal).
- (s_m·A)·B is not exact (up to 36 bits): it rounds once, each add rounds once. An FMA
  would round once for both, so none may form: numba runs without fastmath (LLVM
  contracts nothing; a test reads the assembly), Triton launches with
  ``enable_fp_fusion=False``, the torch reference makes one op per call, and nothing
  uses matmul/einsum/sum or ``tl.dot`` (they reorder sums).
- Subnormals: |(s·A)·B| ≥ 2^-135 is subnormal when |c_m| < 2^-91 and the factors are
  small. All three paths keep gradual underflow (numba: no fastmath, SSE with FTZ/DAZ
  off; Triton's NVIDIA path: ``mul.rn``/``add.rn`` without ``.ftz``, see
  ``_triton_kernels``; torch CPU: flush_denormal off), which the full-rank rules already
  need (subnormal weights, decaying momentum); tests pin a member with such a product.
- Parallelism is over elements only (row blocks, tiles); each element's sum is one loop.

Members with c_m = 0 are skipped (the second of a mirrored pair stores 0), so from −0.0 an
all-zero generation gives g = −0.0 and SGD leaves θ bit-identical. Evaluation weights of
one member are cast(master + g) for that member alone with c = σ·sign (``perturb_lowrank_``).
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import torch

from . import _reference as ref
from .hashing import GOLDEN, MASK64, MIX1, MIX2, fmix64, mix, stable_hash
from .noise import _use_fast, _use_triton, check_coefficient, generate, tensor_key
from .table import TABLE_NP

RANKS = (1, 4, 16, 64)
_A = stable_hash("seedledger/lowrank/v1/A")
_B = stable_hash("seedledger/lowrank/v1/B")

Item = tuple[str, torch.Tensor, list[torch.Tensor]]  # (name, theta [out, in], optimizer buffers)


def perturb_lowrank_(out: torch.Tensor, master: torch.Tensor, member_key: int, name: str, scale: float,
                     rank: int) -> torch.Tensor:
    """out = cast(master + scale·A·Bᵀ/√R), the update's op sequence for one member (c = scale).

    ``scale`` (sign·σ) must already be rounded (``round_coefficient``).
    """
    check_coefficient(scale)
    if master.dtype != torch.float32 or master.dim() != 2 or out.shape != master.shape:
        raise ValueError("perturb_lowrank_ needs a 2-D fp32 master and an out of the same shape")
    tmp = master.detach().clone(memory_format=torch.contiguous_format)
    apply([(name, tmp, [])], [member_key], [scale], 0, [], rank)
    with torch.no_grad():
        out.copy_(tmp)
    return out


def apply(items: Sequence[Item], member_keys: Sequence[int], coefs: Sequence[float], rule: int,
          scal: Sequence[float], rank: int, *, reference: bool = False) -> None:
    """θ ← rule(θ, g) for every (name, θ, buffers) in ``items``; θ contiguous fp32 [out, in].

    ``coefs`` are checked coefficients (``update._step_inputs``); ``reference`` forces the
    torch oracle. One kernel call per device (numba, Triton) or one tensor at a time.
    """
    check_matrix((1, 1), rank)
    inv = inv_sqrt_rank(rank)
    s = [float(c) * inv for c in coefs]  # exact: 12-bit c times a power of two
    groups: dict[tuple[object, torch.device], list[Item]] = {}
    for item in items:
        dev = item[1].device
        fn = _apply_reference if reference else _apply_fast if _use_fast(dev) else \
            _apply_triton if _use_triton(dev) else _apply_reference
        groups.setdefault((fn, dev), []).append(item)
    for (fn, _), group in groups.items():
        fn(group, list(member_keys), s, rule, list(scal), rank)


def _apply_fast(items: list[Item], member_keys: list[int], s: list[float], rule: int, scal: list[float],
                rank: int) -> None:
    """Every CPU tensor in one parallel numba call (work item = a block of whole rows)."""
    from . import _cpu_kernels as k
    from ._cpu_args import lowrank_work_items, typed_list

    thetas = [theta.detach().view(-1).numpy() for _, theta, _ in items]
    bufs = [[b.detach().view(-1).numpy() for b in bs] for _, _, bs in items]
    rows = [theta.shape[0] for _, theta, _ in items]
    cols = [theta.shape[1] for _, theta, _ in items]
    work_t, work_o = lowrank_work_items(rows, cols, k.LOWRANK_BLOCK)
    if work_t.shape[0] == 0:
        return
    k.lowrank_apply_many(
        typed_list(thetas), np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64),
        key_table(member_keys, [n for n, _, _ in items]), np.array(s, dtype=np.float32), rank, TABLE_NP, rule,
        np.array(scal or [0.0], dtype=np.float32),
        typed_list([b[0] if b else t for b, t in zip(bufs, thetas, strict=True)]),
        typed_list([b[1] if len(b) > 1 else t for b, t in zip(bufs, thetas, strict=True)]), work_t, work_o,
        k.LOWRANK_BLOCK, k.LOWRANK_SCRATCH,
    )


def _apply_triton(items: list[Item], member_keys: list[int], s: list[float], rule: int, scal: list[float],
                  rank: int) -> None:
    """Tensors of one device through the Triton kernel (one launch per tensor)."""
    from . import _triton_kernels as tk

    keys = torch.from_numpy(key_table(member_keys, [n for n, _, _ in items]).view(np.int64))
    tk.lowrank_apply_many([(theta, bufs) for _, theta, bufs in items], keys, s, rank, rule, scal)


def _apply_reference(items: list[Item], member_keys: list[int], s: list[float], rule: int, scal: list[float],
                     rank: int) -> None:
    """The torch reference (the oracle): Python-int keys, reference noise, one op per call."""
    for name, theta, bufs in items:
        rows, cols = theta.shape
        fs = [(ref.noise_ref(ka, rows * rank, 0, theta.device).view(rows, rank),
               ref.noise_ref(kb, cols * rank, 0, theta.device).view(cols, rank))
              for ka, kb in (factor_keys(k, name) for k in member_keys)]
        g = ref.lowrank_delta_ref(fs, s, (rows, cols), theta.device)
        ref.apply_rule_ref(theta, g, rule, scal, *(list(bufs) + [None, None])[:2])


# --- factors -------------------------------------------------------------------------


def inv_sqrt_rank(rank: int) -> float:
    """1/√rank, an exact power of two for a rank in ``RANKS`` (rank = 4**k has bit_length 2k + 1)."""
    return 2.0 ** -(rank.bit_length() // 2)


def factor_keys(member_key: int, name: str) -> tuple[int, int]:
    """(key_A, key_B) of one member's factors for tensor ``name``."""
    tk = tensor_key(member_key, name)
    return mix(tk, _A), mix(tk, _B)


def factors(member_key: int, name: str, shape: tuple[int, int], rank: int,
            device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A [out, R] and B [in, R] (fp32, row-major: A[o, r] is element o·R + r of key_A)."""
    rows, cols = check_matrix(shape, rank)
    ka, kb = factor_keys(member_key, name)
    return (generate(ka, rows * rank, device=device).view(rows, rank),
            generate(kb, cols * rank, device=device).view(cols, rank))


def stacked_factors(member_keys: Sequence[int], name: str, shape: tuple[int, int], rank: int,
                    device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """[K, out, R] and [K, in, R]: every member's ``factors`` at once (the batched forward's)."""
    rows, cols = check_matrix(shape, rank)
    keys = key_table(member_keys, [name])[0]
    dev = torch.device(device)
    return (_generate_many(keys[0], keys[1], rows * rank, dev).view(len(keys[0]), rows, rank),
            _generate_many(keys[2], keys[3], cols * rank, dev).view(len(keys[0]), cols, rank))


def key_table(member_keys: Sequence[int], names: Sequence[str]) -> np.ndarray:
    """[len(names), 4, K] uint64: key_A, kx_A, key_B, kx_B of every (tensor, member).

    ``factor_keys`` and ``noise_xkey`` vectorised: numpy uint64 arithmetic wraps like
    Python ints masked to 64 bits.
    """
    mk = np.array([int(k) & MASK64 for k in member_keys], dtype=np.uint64).reshape(1, -1)
    cn = np.array([_name_const(n) for n in names], dtype=np.uint64).reshape(-1, 1)
    tk = _fmix_np(mk ^ cn)
    ka, kb = _fmix_np(tk ^ np.uint64(fmix64(_A + GOLDEN))), _fmix_np(tk ^ np.uint64(fmix64(_B + GOLDEN)))
    salt = np.uint64(ref.NOISE_SALT)
    return np.stack([ka, _fmix_np(ka ^ salt), kb, _fmix_np(kb ^ salt)], axis=1)


@cache
def _name_const(name: str) -> int:
    return fmix64(stable_hash(name) + GOLDEN)  # tensor_key(k, name) = fmix64(k ^ this)


def _fmix_np(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(31))


def check_matrix(shape: Sequence[int], rank: int) -> tuple[int, int]:
    """(out, in) of a 2-D shape; ValueError for another shape or a rank not in RANKS."""
    if len(shape) != 2:
        raise ValueError(f"low-rank noise needs a 2-D tensor, not shape {tuple(shape)}")
    if rank not in RANKS:
        raise ValueError(f"rank must be one of {RANKS}, not {rank!r}")
    return int(shape[0]), int(shape[1])


def _generate_many(keys: np.ndarray, kxs: np.ndarray, n: int, device: torch.device) -> torch.Tensor:
    """[K, n] noise of keys (fast path by device, else the reference)."""
    if _use_fast(device):
        from . import _cpu_kernels as k

        out = np.empty((len(keys), n), dtype=np.float32)
        k.generate_many(keys, kxs, out, TABLE_NP)
        return torch.from_numpy(out)
    if _use_triton(device):
        from . import _triton_kernels as tk

        return tk.generate_many(torch.from_numpy(np.stack([keys, kxs]).view(np.int64)).to(device), n)
    return torch.stack([ref.noise_ref(int(k), n, 0, device) for k in keys]) if len(keys) else \
        torch.empty(0, n, device=device)
