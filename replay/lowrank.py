"""The exact low-rank update (spec ``lowrank-v1``) and low-rank evaluation weights.

Factors A_m [out, R], B_m [in, R] of member m are defined in ``replay.perturbation``
(v1 table values: at most 12 significant bits, 2^-15.7 ≤ |v| ≤ 4.33). One generation
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

import numpy as np
import torch

from . import _reference as ref
from .noise import _use_fast, _use_triton, check_coefficient
from .perturbation import Perturbation, check_matrix, factor_keys, key_table
from .table import TABLE_NP

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
    inv = Perturbation("lowrank", rank).inv_sqrt_rank
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

    thetas = [theta.detach().view(-1).numpy() for _, theta, _ in items]
    bufs = [[b.detach().view(-1).numpy() for b in bs] for _, _, bs in items]
    rows = [theta.shape[0] for _, theta, _ in items]
    cols = [theta.shape[1] for _, theta, _ in items]
    work_t, work_o = k.lowrank_work_items(rows, cols, k.LOWRANK_BLOCK)
    if work_t.shape[0] == 0:
        return
    k.lowrank_apply_many(
        k.typed_list(thetas), np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64),
        key_table(member_keys, [n for n, _, _ in items]), np.array(s, dtype=np.float32), rank, TABLE_NP, rule,
        np.array(scal or [0.0], dtype=np.float32),
        k.typed_list([b[0] if b else t for b, t in zip(bufs, thetas, strict=True)]),
        k.typed_list([b[1] if len(b) > 1 else t for b, t in zip(bufs, thetas, strict=True)]), work_t, work_o,
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
