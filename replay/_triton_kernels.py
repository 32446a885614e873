"""Triton kernels: the CUDA path, bit-identical to ``_reference`` and the numba kernels.

Kernels, each a pure function of (key, element index) per element, so the launch grid
and block size never change a bit:

- ``generate``: eps(key, offset + p) into a fresh or given fp32 tensor;
- ``perturb``: out = cast(master + scale·eps(key)) (fp32, bf16 or fp16 ``out``);
- ``apply``: the fused update of one tensor. A program owns a block of elements, loops
  over the N members in order (keys, whitening constants and fp32 coefficients are
  device tensors), regenerates each member's noise in registers and accumulates
  Δ = ((−0 + c0·ε0) + c1·ε1) + ... (members with c == 0 skipped), then applies the rule
  (SGD / momentum with dampening / Adam) with the op sequence of
  ``_reference.apply_rule_ref``. Master and optimizer state are read and written once;
- ``lowrank``: the same for a low-rank generation (``replay.lowrank``): a program owns a
  [rows, cols] tile, hashes the factor elements it needs in registers and accumulates
  g = g + (s·A[o, r])·B[i, r] over members and r in order (an elementwise outer product,
  never ``tl.dot``, which would reorder the sum), then the same rule;
- ``generate_many``: every member's noise stream at once (the stacked factors).

Hash: uint64 arithmetic. Keys travel as int64 bit patterns and are bitcast to uint64 in
the kernel; the splitmix64 constants are > 2**63, so Triton types them uint64; uint64
``*`` is ``mul.lo.u64`` (wrapping) and ``>>`` on uint64 is a logical shift. Element
indices are int64 from the program id on (a 0.5B tensor overflows int32 indexing).

Why the floats are exact on a GPU (the interpreter, which runs these kernels in numpy
for the CPU tests, cannot show any of this; checked against Triton 3.9's NVIDIA
lowering):

- Fusion: every launch passes ``enable_fp_fusion=False``, so LLVM emits ``add.rn`` /
  ``mul.rn`` (which ptxas never contracts) and ptxas also gets ``--fmad=false``. The
  accumulation products c·ε are exact anyway (12-bit × 12-bit significands), but the
  momentum/Adam rules (v·β + g·(1−d), √v·s + eps, ...) and the low-rank products
  (s·A)·B are not, and there an FMA would round once instead of twice.
- Division: Triton lowers fp32 ``/`` to ``div.full.f32`` (≈2 ulp, not IEEE), so Adam
  uses ``tl.div_rn`` → ``llvm.nvvm.div.rn.f`` → ``div.rn.f32`` (IEEE, no ftz).
- Square root: ``tl.sqrt`` is the approximate one; Adam uses ``tl.sqrt_rn`` →
  ``llvm.nvvm.sqrt.rn.f`` → ``sqrt.rn.f32`` (correctly rounded, no ftz). The reference
  takes sqrt in fp64 and rounds once to fp32; for sqrt that double rounding is
  innocuous (53 ≥ 2·24 + 2), so both give the correctly rounded fp32 root, as numba's
  ``sqrtss`` does.
- Denormals: Triton's NVIDIA backend sets no ``denormal-fp-math`` attribute, so
  add/mul/div/sqrt are IEEE with subnormals (``enable_reflect_ftz`` only affects
  libdevice calls, and none is made here). No fast-math flags, so no reassociation;
  folding ``x + (−0.0)`` to ``x`` is exact.
- Casts: fp16 ``out`` uses ``.to(tl.float16)`` (``fptrunc`` → ``cvt.rn.f16.f32``, round
  to nearest even, like torch). bf16 is rounded with integer ops (the same
  round-to-nearest-even as torch's CPU conversion, NaN → 0x7FC0), because the
  interpreter's fp32 → bf16 conversion truncates and could not test a float cast.
- Table: eps values are ``tl.load``s from the 2**16-entry fp32 table on the device
  (``table.table_on``); no transcendental function runs on the device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .hashing import to_i64
from .table import table_on

# Launch shapes, from benchmarks/triton_tune.py on an H100 (they change speed, never a bit):
# generate at 4096 groups × 8 warps ran 302 G values/s against 141 at 512 × 4; the low-rank
# sgd update (r = 4, N = 30, SmolLM2 shapes) 20.9 ms at 128×128 against 42.7 at 32×64 (sgd
# only: momentum and Adam, which hold more per element, were not swept).
GEN_GROUPS = 4096  # hash groups (4 elements each) per program: generate / perturb
APPLY_GROUPS = 256  # per program of the fused update (Δ lives in registers)
MANY_GROUPS = 512  # per program of generate_many (short factor vectors, one row per member)
_GEN_LAUNCH = dict(num_warps=8, enable_fp_fusion=False)
_LAUNCH = dict(num_warps=4, enable_fp_fusion=False)


@triton.jit
def _fmix(z):
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    return z ^ (z >> 31)


@triton.jit
def _noise(key, kx, j, table_ptr):
    """[len(j), 4] fp32 noise of hash groups j (int64): lane l is element 4j + l."""
    h = _fmix((key + j.to(tl.uint64) * 0x9E3779B97F4A7C15) ^ kx)
    shift = (tl.arange(0, 4) * 16).to(tl.uint64)
    idx = ((h[:, None] >> shift[None, :]) & 0xFFFF).to(tl.int32)
    return tl.load(table_ptr + idx)


@triton.jit
def _u64(x):
    """A scalar int64 bit pattern (typed i32 or i64 by value) as uint64."""
    return tl.cast(x, tl.int64).to(tl.uint64, bitcast=True)


@triton.jit
def _minus_zeros(R: tl.constexpr, C: tl.constexpr):
    """[R, C] fp32 −0.0, built from its bits: ``tl.full(shape, -0.0)`` compiles to +0.0
    (Triton takes any value == 0 for the null constant; seen with Triton 3.6 on an H100),
    and +0 would turn a −0 weight into +0 in an update with no non-zero coefficient."""
    return tl.full((R, C), -(2**31), tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _bf16_rne(x):
    """fp32 → bf16, round to nearest even in integer ops (torch's CPU rule; NaN → 0x7FC0)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + (((b >> 16) & 1) + 0x7FFF)) >> 16
    r = tl.where(x != x, 0x7FC0, r)
    return r.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit(do_not_specialize=["key", "kx", "offset", "n"])
def _generate_kernel(out_ptr, table_ptr, key, kx, offset, n, GROUPS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    off = tl.cast(offset, tl.int64)
    j = (off >> 2) + pid * GROUPS + tl.arange(0, GROUPS).to(tl.int64)
    eps = _noise(_u64(key), _u64(kx), j, table_ptr)
    pos = j[:, None] * 4 + tl.arange(0, 4).to(tl.int64)[None, :] - off
    mask = (pos >= 0) & (pos < tl.cast(n, tl.int64))
    tl.store(out_ptr + pos, eps, mask=mask)


@triton.jit(do_not_specialize=["key", "kx", "n"])
def _perturb_kernel(out_ptr, master_ptr, table_ptr, key, kx, scale, n, GROUPS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    j = pid * GROUPS + tl.arange(0, GROUPS).to(tl.int64)
    eps = _noise(_u64(key), _u64(kx), j, table_ptr)
    pos = j[:, None] * 4 + tl.arange(0, 4).to(tl.int64)[None, :]
    mask = pos < tl.cast(n, tl.int64)
    x = tl.load(master_ptr + pos, mask=mask, other=0.0)
    y = x + eps * scale
    if out_ptr.dtype.element_ty == tl.bfloat16:
        tl.store(out_ptr + pos, _bf16_rne(y), mask=mask)
    elif out_ptr.dtype.element_ty == tl.float16:
        tl.store(out_ptr + pos, y.to(tl.float16), mask=mask)
    else:
        tl.store(out_ptr + pos, y, mask=mask)


@triton.jit
def _rule(theta, g, buf1_ptr, buf2_ptr, pos, mask, s0, s1, s2, s3, s4, s5, s6, RULE: tl.constexpr):
    """The new θ from g; updates the state buffers (op sequence of ``_reference.apply_rule_ref``)."""
    if RULE == 0:
        theta = theta + g
    elif RULE == 1:
        v = tl.load(buf1_ptr + pos, mask=mask, other=0.0)
        v = v * s0
        t = g * s1
        v = v + t
        tl.store(buf1_ptr + pos, v, mask=mask)
        u = v * s2
        theta = theta + u
    else:
        m1 = tl.load(buf1_ptr + pos, mask=mask, other=0.0)
        m1 = m1 * s0
        t = g * s1
        m1 = m1 + t
        tl.store(buf1_ptr + pos, m1, mask=mask)
        v2 = tl.load(buf2_ptr + pos, mask=mask, other=0.0)
        v2 = v2 * s2
        t = g * g
        t = t * s3
        v2 = v2 + t
        tl.store(buf2_ptr + pos, v2, mask=mask)
        d = tl.sqrt_rn(v2)
        d = d * s4
        d = d + s5
        u = tl.div_rn(m1, d)
        u = u * s6
        theta = theta + u
    return theta


@triton.jit(do_not_specialize=["n", "members"])
def _apply_kernel(
    theta_ptr, buf1_ptr, buf2_ptr, keys_ptr, kxs_ptr, coefs_ptr, table_ptr, n, members,
    s0, s1, s2, s3, s4, s5, s6, RULE: tl.constexpr, GROUPS: tl.constexpr,
):
    """RULE 0 sgd; 1 momentum (s0..s2 = β, 1−d, lr); 2 adam (s0..s6 as in ``update._scalars``)."""
    pid = tl.program_id(0).to(tl.int64)
    j = pid * GROUPS + tl.arange(0, GROUPS).to(tl.int64)
    pos = j[:, None] * 4 + tl.arange(0, 4).to(tl.int64)[None, :]
    mask = pos < tl.cast(n, tl.int64)
    g = _minus_zeros(GROUPS, 4)  # x + (−0) == x for every x, −0 included
    for m in range(members):
        c = tl.load(coefs_ptr + m)
        if c != 0.0:
            key = tl.load(keys_ptr + m).to(tl.uint64, bitcast=True)
            kx = tl.load(kxs_ptr + m).to(tl.uint64, bitcast=True)
            g = g + _noise(key, kx, j, table_ptr) * c
    theta = tl.load(theta_ptr + pos, mask=mask, other=0.0)
    theta = _rule(theta, g, buf1_ptr, buf2_ptr, pos, mask, s0, s1, s2, s3, s4, s5, s6, RULE)
    tl.store(theta_ptr + pos, theta, mask=mask)


@triton.jit
def _noise_at(key, kx, idx, table_ptr):
    """fp32 noise of elements idx (int64, any shape and order) of one key."""
    h = _fmix((key + (idx >> 2).to(tl.uint64) * 0x9E3779B97F4A7C15) ^ kx)
    return tl.load(table_ptr + ((h >> ((idx & 3) * 16).to(tl.uint64)) & 0xFFFF).to(tl.int32))


@triton.jit(do_not_specialize=["n", "members"])
def _generate_many_kernel(out_ptr, keys_ptr, table_ptr, n, members, GROUPS: tl.constexpr):
    """out[m, p] = eps(key_m, p); keys_ptr holds [2, members] int64 (keys, then kxs)."""
    m = tl.program_id(1).to(tl.int64)
    key = tl.load(keys_ptr + m).to(tl.uint64, bitcast=True)
    kx = tl.load(keys_ptr + members + m).to(tl.uint64, bitcast=True)
    j = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS).to(tl.int64)
    pos = j[:, None] * 4 + tl.arange(0, 4).to(tl.int64)[None, :]
    nn = tl.cast(n, tl.int64)
    tl.store(out_ptr + m * nn + pos, _noise(key, kx, j, table_ptr), mask=pos < nn)


@triton.jit(do_not_specialize=["rows", "cols", "members", "rank"])
def _lowrank_kernel(
    theta_ptr, buf1_ptr, buf2_ptr, keys_ptr, s_ptr, table_ptr, rows, cols, members, rank,
    s0, s1, s2, s3, s4, s5, s6, RULE: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
):
    """A [BR, BC] tile of the low-rank update (``replay.lowrank``): the factors' elements
    are hashed in registers (A[o, r] = eps(key_A, o·R + r), B[i, r] = eps(key_B, i·R + r));
    keys_ptr holds [4, members] int64 (key_A, kx_A, key_B, kx_B), s_ptr the fp32 c_m/√R.
    Per element: g = −0.0, then members in order (s == 0 skipped), r = 0..R−1 in order,
    g = g + (s·A[o, r])·B[i, r] (s·A exact; one rounding for the product, one for the add)."""
    o = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR).to(tl.int64)
    i = tl.program_id(1).to(tl.int64) * BC + tl.arange(0, BC).to(tl.int64)
    rk = tl.cast(rank, tl.int64)
    g = _minus_zeros(BR, BC)
    for m in range(members):
        s = tl.load(s_ptr + m)
        if s != 0.0:
            ka = tl.load(keys_ptr + m).to(tl.uint64, bitcast=True)
            xa = tl.load(keys_ptr + members + m).to(tl.uint64, bitcast=True)
            kb = tl.load(keys_ptr + 2 * members + m).to(tl.uint64, bitcast=True)
            xb = tl.load(keys_ptr + 3 * members + m).to(tl.uint64, bitcast=True)
            for r in range(rank):
                a = _noise_at(ka, xa, o * rk + r, table_ptr) * s
                b = _noise_at(kb, xb, i * rk + r, table_ptr)
                g = g + a[:, None] * b[None, :]
    pos = o[:, None] * tl.cast(cols, tl.int64) + i[None, :]
    mask = (o < tl.cast(rows, tl.int64))[:, None] & (i < tl.cast(cols, tl.int64))[None, :]
    theta = tl.load(theta_ptr + pos, mask=mask, other=0.0)
    theta = _rule(theta, g, buf1_ptr, buf2_ptr, pos, mask, s0, s1, s2, s3, s4, s5, s6, RULE)
    tl.store(theta_ptr + pos, theta, mask=mask)


def generate(key: int, kx: int, numel: int, offset: int, device, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 noise elements offset .. offset+numel-1 of ``key`` (``kx`` = noise_xkey(key))."""
    if out is None:
        out = torch.empty(numel, dtype=torch.float32, device=device)
    if numel == 0:
        return out
    groups = ((offset + numel + 3) >> 2) - (offset >> 2)
    grid = (triton.cdiv(groups, GEN_GROUPS),)
    _generate_kernel[grid](out, table_on(str(out.device)), to_i64(key), to_i64(kx), offset, numel,
                           GROUPS=GEN_GROUPS, **_GEN_LAUNCH)
    return out


PERTURB_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def perturb(out: torch.Tensor, master: torch.Tensor, key: int, kx: int, scale: float) -> torch.Tensor:
    """out = cast(master + scale·eps(key)); out contiguous, dtype in PERTURB_DTYPES."""
    n = master.numel()
    if n == 0:
        return out
    grid = (triton.cdiv((n + 3) >> 2, GEN_GROUPS),)
    _perturb_kernel[grid](out.detach(), master.detach(), table_on(str(master.device)), to_i64(key), to_i64(kx),
                          float(scale), n, GROUPS=GEN_GROUPS, **_GEN_LAUNCH)
    return out


def apply_many(items: list, keys: list[list[int]], kxs: list[list[int]], coefs: list[float], rule: int,
               scal: list[float]) -> None:
    """Fused update of every (theta, bufs) in ``items`` (same device); keys/kxs: [tensor][member].

    Members with a zero coefficient should already be dropped by the caller (the kernel
    skips them too). Keys, constants and coefficients go to the device in one copy each.
    """
    if not items:
        return
    device = items[0][0].device
    members = len(coefs)
    width = max(members, 1)  # one unused slot when N == 0: no empty (null) device pointers
    k_dev = torch.zeros(len(items), width, dtype=torch.int64)
    x_dev = torch.zeros(len(items), width, dtype=torch.int64)
    c_dev = torch.zeros(width, dtype=torch.float32)
    if members:
        k_dev[:, :members] = torch.tensor([[to_i64(x) for x in row] for row in keys], dtype=torch.int64)
        x_dev[:, :members] = torch.tensor([[to_i64(x) for x in row] for row in kxs], dtype=torch.int64)
        c_dev[:members] = torch.tensor(coefs, dtype=torch.float32)
    k_dev, x_dev, c_dev = k_dev.to(device), x_dev.to(device), c_dev.to(device)
    s = [float(x) for x in scal] + [0.0] * (7 - len(scal))
    table = table_on(str(device))
    for t, (theta, bufs) in enumerate(items):
        n = theta.numel()
        if n == 0:
            continue
        b1 = bufs[0] if bufs else theta
        b2 = bufs[1] if len(bufs) > 1 else theta
        grid = (triton.cdiv((n + 3) >> 2, APPLY_GROUPS),)
        _apply_kernel[grid](theta.detach(), b1.detach(), b2.detach(), k_dev[t], x_dev[t], c_dev, table, n, members,
                            *s, RULE=rule, GROUPS=APPLY_GROUPS, **_LAUNCH)


LOWRANK_TILE = (128, 128)  # rows x columns per program of the low-rank update (2x (32, 64) on an H100)


def generate_many(keys: torch.Tensor, n: int) -> torch.Tensor:
    """[members, n] fp32 noise; keys: [2, members] int64 on the device (keys, then kxs)."""
    members = keys.shape[1]
    out = torch.empty(members, n, dtype=torch.float32, device=keys.device)
    if members and n:
        grid = (triton.cdiv((n + 3) >> 2, MANY_GROUPS), members)
        _generate_many_kernel[grid](out, keys, table_on(str(keys.device)), n, members, GROUPS=MANY_GROUPS,
                                    **_LAUNCH)
    return out


def lowrank_apply_many(items: list, keys: torch.Tensor, s: list[float], rank: int, rule: int,
                       scal: list[float]) -> None:
    """Low-rank update of every (theta [rows, cols], bufs) in ``items`` (same device).

    keys: [tensors, 4, members] int64 (``lowrank.key_table``); s: the fp32 c_m/√R.
    """
    if not items:
        return
    device = items[0][0].device
    members = len(s)
    k_dev = keys.to(device) if members else torch.zeros(len(items), 4, 1, dtype=torch.int64, device=device)
    s_dev = torch.tensor(list(s) or [0.0], dtype=torch.float32).to(device)
    sc = [float(x) for x in scal] + [0.0] * (7 - len(scal))
    table = table_on(str(device))
    br, bc = LOWRANK_TILE
    for t, (theta, bufs) in enumerate(items):
        rows, cols = theta.shape
        if theta.numel() == 0:
            continue
        b1 = bufs[0] if bufs else theta
        b2 = bufs[1] if len(bufs) > 1 else theta
        grid = (triton.cdiv(rows, br), triton.cdiv(cols, bc))
        _lowrank_kernel[grid](theta.detach(), b1.detach(), b2.detach(), k_dev[t], s_dev, table, rows, cols,
                              members, rank, *sc, RULE=rule, BR=br, BC=bc, **_LAUNCH)
