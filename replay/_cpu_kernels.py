"""numba kernels: the fast CPU path, bit-identical to ``_reference``.

Cached on disk (``cache=True``); no fastmath, so LLVM neither contracts a*b+c into an FMA
nor reorders sums. One thread computes each element from (key, index) alone, so thread
count and block size never change a bit; fingerprint lanes are order-free uint64 sums.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

BLOCK = 4096  # elements per parallel work item (multiple of 4); 16 KiB fp32 scratch
PARALLEL_MIN = 1 << 16  # below this a tensor is done on the calling thread
LOWRANK_BLOCK = 1 << 16  # elements per low-rank work item (whole rows; B is regenerated per item)
LOWRANK_SCRATCH = 1 << 18  # floats of transposed B factors held per work item (a group of members)

_G = uint64(0x9E3779B97F4A7C15)
_M1 = uint64(0xBF58476D1CE4E5B9)
_M2 = uint64(0x94D049BB133111EB)
_S30 = uint64(30)
_S27 = uint64(27)
_S31 = uint64(31)
_S16 = uint64(16)
_S32 = uint64(32)
_S48 = uint64(48)
_F = uint64(0xFFFF)
_ONE = uint64(1)

SGD, MOMENTUM, ADAM = 0, 1, 2
_OPTS = dict(cache=True, nogil=True, error_model="numpy")


@njit(inline="always", **_OPTS)
def _fmix(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(inline="always", **_OPTS)
def _group_hash(key, kx, j):
    return _fmix((key + uint64(j) * _G) ^ kx)


@njit(inline="always", **_OPTS)
def _generate_block(key, kx, offset, out, table, b):
    """Groups [g0 + b·BLOCK/4, ...) of the output (a group = 4 elements of one hash)."""
    n = out.shape[0]
    gpb = BLOCK >> 2
    g1 = (offset + n + 3) >> 2
    ja = (offset >> 2) + b * gpb
    jb = min(ja + gpb, g1)
    for j in range(ja, jb):
        h = _group_hash(key, kx, j)
        p = 4 * j - offset
        if p >= 0 and p + 4 <= n:
            out[p] = table[h & _F]
            out[p + 1] = table[(h >> _S16) & _F]
            out[p + 2] = table[(h >> _S32) & _F]
            out[p + 3] = table[h >> _S48]
        else:
            for lane in range(4):
                q = p + lane
                if q >= 0 and q < n:
                    out[q] = table[(h >> uint64(16 * lane)) & _F]


@njit(inline="always", **_OPTS)
def _n_generate_blocks(offset, n):
    gpb = BLOCK >> 2
    return (((offset + n + 3) >> 2) - (offset >> 2) + gpb - 1) // gpb if n > 0 else 0


@njit(parallel=True, **_OPTS)
def generate(key, kx, offset, out, table):
    """out[p] = eps(key, offset + p), blocks spread over threads."""
    for b in prange(_n_generate_blocks(offset, out.shape[0])):
        _generate_block(key, kx, offset, out, table, b)


@njit(**_OPTS)
def generate_serial(key, kx, offset, out, table):
    """Same as ``generate`` on the calling thread (small tensors: no fork/join cost)."""
    for b in range(_n_generate_blocks(offset, out.shape[0])):
        _generate_block(key, kx, offset, out, table, b)


@njit(inline="always", **_OPTS)
def _noise_block(eps, start, n, key, kx, table):
    """eps[0:n] = eps(key, start..start+n); start is a multiple of 4."""
    full = n & ~3
    j0 = start >> 2
    for q in range(0, full, 4):
        h = _group_hash(key, kx, j0 + (q >> 2))
        eps[q] = table[h & _F]
        eps[q + 1] = table[(h >> _S16) & _F]
        eps[q + 2] = table[(h >> _S32) & _F]
        eps[q + 3] = table[h >> _S48]
    if full < n:
        h = _group_hash(key, kx, j0 + (full >> 2))
        for lane in range(n - full):
            eps[full + lane] = table[(h >> uint64(16 * lane)) & _F]


@njit(inline="always", **_OPTS)
def _accumulate_block(delta, eps, start, stop, keys, kxs, coefs, table):
    """delta[0:stop-start] = Σ_m coefs[m]·eps(keys[m], start..stop) in member order. The sum
    starts at −0.0 and members with coefs[m] == 0 are skipped (x + (−0) == x for every x, so
    an all-zero generation leaves θ bit-identical). A member whose key repeats the previous
    applied member's (mirrored pairs) reuses its noise block; only the hashing is skipped."""
    n = stop - start
    members = keys.shape[0]
    for p in range(n):
        delta[p] = np.float32(-0.0)
    for m in range(members):
        c = coefs[m]
        if c == 0:
            continue
        repeated = m > 0 and keys[m] == keys[m - 1] and coefs[m - 1] != 0  # eps holds its noise
        if not repeated and (m + 1 == members or keys[m + 1] != keys[m]):
            _accumulate_noise(delta, start, n, keys[m], kxs[m], c, table)  # used once: no buffer
            continue
        if not repeated:
            _noise_block(eps, start, n, keys[m], kxs[m], table)
        for p in range(n):
            delta[p] = delta[p] + c * eps[p]


@njit(inline="always", **_OPTS)
def _accumulate_noise(delta, start, n, key, kx, c, table):
    """delta[0:n] += c·eps(key, start..start+n), straight from the hash (no noise buffer)."""
    full = n & ~3
    j0 = start >> 2
    for q in range(0, full, 4):
        h = _group_hash(key, kx, j0 + (q >> 2))
        delta[q] = delta[q] + c * table[h & _F]
        delta[q + 1] = delta[q + 1] + c * table[(h >> _S16) & _F]
        delta[q + 2] = delta[q + 2] + c * table[(h >> _S32) & _F]
        delta[q + 3] = delta[q + 3] + c * table[h >> _S48]
    if full < n:
        h = _group_hash(key, kx, j0 + (full >> 2))
        for lane in range(n - full):
            delta[full + lane] = delta[full + lane] + c * table[(h >> uint64(16 * lane)) & _F]


@njit(inline="always", **_OPTS)
def _rule(theta, i, g, rule, scal, buf1, buf2):
    """θ[i] ← rule(θ[i], g), one IEEE op per line (the sequence of ``_reference.apply_rule_ref``).

    SGD: θ += g. MOMENTUM (scal = β, 1−d, lr; buf1 = v): v = v·β; t = g·(1−d); v = v + t;
    θ = θ + v·lr. ADAM (scal = β1, 1−β1, β2, 1−β2, 1/√bc2, eps, lr/bc1; buf1 = m, buf2 = v).
    """
    if rule == SGD:
        theta[i] = theta[i] + g
    elif rule == MOMENTUM:
        v = buf1[i] * scal[0]
        t = g * scal[1]
        v = v + t
        buf1[i] = v
        u = v * scal[2]
        theta[i] = theta[i] + u
    else:
        m1 = buf1[i] * scal[0]
        t = g * scal[1]
        m1 = m1 + t
        buf1[i] = m1
        v2 = buf2[i] * scal[2]
        t = g * g
        t = t * scal[3]
        v2 = v2 + t
        buf2[i] = v2
        d = np.sqrt(v2)
        d = d * scal[4]
        d = d + scal[5]
        u = m1 / d
        u = u * scal[6]
        theta[i] = theta[i] + u


@njit(inline="always", **_OPTS)
def _apply_block(theta, start, keys, kxs, coefs, table, rule, scal, buf1, buf2):
    """One block of the fused update: Δ for all members, then the rule, in one pass."""
    stop = min(start + BLOCK, theta.shape[0])
    delta = np.empty(BLOCK, dtype=np.float32)
    eps = np.empty(BLOCK, dtype=np.float32)
    _accumulate_block(delta, eps, start, stop, keys, kxs, coefs, table)
    for p in range(stop - start):
        _rule(theta, start + p, delta[p], rule, scal, buf1, buf2)


@njit(parallel=True, **_OPTS)
def apply_many(thetas, keys, kxs, coefs, table, rule, scal, buf1s, buf2s, work_t, work_s):
    """Every tensor of a master in one parallel region; work item w = (tensor, block start).
    keys/kxs are [tensors, members]; buf1s/buf2s are lists parallel to thetas (unused by SGD)."""
    for w in prange(work_t.shape[0]):
        t = work_t[w]
        _apply_block(thetas[t], work_s[w], keys[t], kxs[t], coefs, table, rule, scal, buf1s[t], buf2s[t])


@njit(inline="always", **_OPTS)
def _noise_range(out, start, n, key, kx, table):
    """out[0:n] = eps(key, start..start+n) for any start (factor rows need not align to 4)."""
    for j in range(start >> 2, (start + n + 3) >> 2):
        h = _group_hash(key, kx, j)
        for lane in range(4):
            q = 4 * j + lane - start
            if q >= 0 and q < n:
                out[q] = table[(h >> uint64(16 * lane)) & _F]


@njit(**_OPTS)
def _lowrank_block(theta, rows, cols, o0, keys, s, rank, table, rule, scal, buf1, buf2, block, scratch):
    """Rows o0 .. o0 + block // cols of one [rows, cols] tensor (see ``lowrank``).

    Members are taken in groups whose factors fit ``scratch`` floats: for each applied
    member (s[m] ≠ 0) its A rows are regenerated and scaled, a = s_m·A (exact), and B is
    stored transposed; then every group of 4 rows (kept in L1) gets, for j = (member, r)
    in order, g[o, i] = g[o, i] + a[o, r]·Bᵀ[r, i]. Per element that is members then r in
    order, as the reference: the blocking changes which elements share a loop, not the
    order of any element's operations.
    """
    o1 = min(o0 + max(1, block // cols), rows)
    nr = o1 - o0
    g = np.empty(nr * cols, dtype=np.float32)
    for p in range(nr * cols):
        g[p] = np.float32(-0.0)
    group = max(1, min(scratch // (rank * cols), s.shape[0]))
    a = np.empty(group * nr * rank, dtype=np.float32)  # [k, o, r]
    bt = np.empty(group * rank * cols, dtype=np.float32)  # [k, r, i]
    b = np.empty(cols * rank, dtype=np.float32)
    for m0 in range(0, s.shape[0], group):
        k = 0
        for m in range(m0, min(m0 + group, s.shape[0])):
            sm = s[m]
            if sm == 0:
                continue  # −0.0 + (+0.0) would be +0.0: a zero member must not be added
            ak = a[k * nr * rank:(k + 1) * nr * rank]
            _noise_range(ak, o0 * rank, nr * rank, keys[0, m], keys[1, m], table)
            for q in range(nr * rank):
                ak[q] = sm * ak[q]
            _noise_range(b, 0, cols * rank, keys[2, m], keys[3, m], table)
            for r in range(rank):
                for i in range(cols):
                    bt[(k * rank + r) * cols + i] = b[i * rank + r]
            k += 1
        for o in range(0, nr, 4):
            if o + 4 <= nr:
                _accumulate_rows4(g, o, cols, a, bt, k, nr, rank)
            else:
                for oo in range(o, nr):
                    _accumulate_row(g, oo, cols, a, bt, k, nr, rank)
    for p in range(nr * cols):
        _rule(theta, o0 * cols + p, g[p], rule, scal, buf1, buf2)


@njit(inline="always", **_OPTS)
def _accumulate_rows4(g, o, cols, a, bt, k, nr, rank):
    """Rows o..o+3 of g: for j = (member, r) in order, g[row, i] += a[member, row, r]·bt[j, i]."""
    g0 = g[o * cols:(o + 1) * cols]
    g1 = g[(o + 1) * cols:(o + 2) * cols]
    g2 = g[(o + 2) * cols:(o + 3) * cols]
    g3 = g[(o + 3) * cols:(o + 4) * cols]
    for j in range(k * rank):
        kk = j // rank
        base = (kk * nr + o) * rank + j - kk * rank
        a0 = a[base]
        a1 = a[base + rank]
        a2 = a[base + 2 * rank]
        a3 = a[base + 3 * rank]
        bj = bt[j * cols:(j + 1) * cols]
        for i in range(cols):
            bv = bj[i]
            g0[i] = g0[i] + a0 * bv
            g1[i] = g1[i] + a1 * bv
            g2[i] = g2[i] + a2 * bv
            g3[i] = g3[i] + a3 * bv


@njit(inline="always", **_OPTS)
def _accumulate_row(g, o, cols, a, bt, k, nr, rank):
    """Row o of g (the last rows of a block), same order as ``_accumulate_rows4``."""
    go = g[o * cols:(o + 1) * cols]
    for j in range(k * rank):
        kk = j // rank
        av = a[(kk * nr + o) * rank + j - kk * rank]
        bj = bt[j * cols:(j + 1) * cols]
        for i in range(cols):
            go[i] = go[i] + av * bj[i]


@njit(parallel=True, **_OPTS)
def lowrank_apply_many(thetas, rows, cols, keys, s, rank, table, rule, scal, buf1s, buf2s, work_t, work_o,
                       block, scratch):
    """The low-rank update of every tensor in one parallel region; work item = (tensor, first row).

    keys: [tensors, 4, members] uint64; s: [members] fp32 (c_m/√R); rows/cols per tensor;
    block/scratch: LOWRANK_BLOCK/LOWRANK_SCRATCH (arguments so that tests can shrink them).
    """
    for w in prange(work_t.shape[0]):
        t = work_t[w]
        _lowrank_block(thetas[t], rows[t], cols[t], work_o[w], keys[t], s, rank, table, rule, scal,
                       buf1s[t], buf2s[t], block, scratch)


@njit(parallel=True, **_OPTS)
def generate_many(keys, kxs, out, table):
    """out[m, p] = eps(keys[m], p) for every member m (the stacked low-rank factors)."""
    n = out.shape[1]
    nb = _n_generate_blocks(0, n)
    for w in prange(keys.shape[0] * nb):
        m = w // nb
        _generate_block(keys[m], kxs[m], 0, out[m], table, w - m * nb)


@njit(inline="always", **_OPTS)
def _perturb_block(out, master, key, kx, scale, table, b):
    start = b * BLOCK
    stop = min(start + BLOCK, out.shape[0])
    for q in range(start, stop, 4):
        h = _group_hash(key, kx, q >> 2)
        if q + 4 <= stop:
            out[q] = master[q] + scale * table[h & _F]
            out[q + 1] = master[q + 1] + scale * table[(h >> _S16) & _F]
            out[q + 2] = master[q + 2] + scale * table[(h >> _S32) & _F]
            out[q + 3] = master[q + 3] + scale * table[h >> _S48]
        else:
            for lane in range(stop - q):
                e = table[(h >> uint64(16 * lane)) & _F]
                out[q + lane] = master[q + lane] + scale * e


@njit(parallel=True, **_OPTS)
def perturb(out, master, key, kx, scale, table):
    """out = master + scale·eps (product exact; one fp32 rounding)."""
    for b in prange((out.shape[0] + BLOCK - 1) // BLOCK):
        _perturb_block(out, master, key, kx, scale, table, b)


@njit(**_OPTS)
def perturb_serial(out, master, key, kx, scale, table):
    """``perturb`` on the calling thread (small tensors)."""
    for b in range((out.shape[0] + BLOCK - 1) // BLOCK):
        _perturb_block(out, master, key, kx, scale, table, b)


@njit(parallel=True, **_OPTS)
def fingerprint_many(bits, salt0, salt1, work_t, work_s):
    """Per tensor (Σ bits_i·(fmix(salt0 + i·G)|1), same with salt1) mod 2**64: [tensors, 2]."""
    nw = work_t.shape[0]
    acc = np.zeros((nw, 2), dtype=np.uint64)
    for w in prange(nw):
        x_all = bits[work_t[w]]
        start = work_s[w]
        stop = min(start + BLOCK, x_all.shape[0])
        a0 = uint64(0)
        a1 = uint64(0)
        for i in range(start, stop):
            x = uint64(x_all[i])
            s = uint64(i) * _G
            a0 += x * (_fmix(salt0 + s) | _ONE)
            a1 += x * (_fmix(salt1 + s) | _ONE)
        acc[w, 0] = a0
        acc[w, 1] = a1
    out = np.zeros((len(bits), 2), dtype=np.uint64)
    for w in range(nw):
        out[work_t[w], 0] += acc[w, 0]
        out[work_t[w], 1] += acc[w, 1]
    return out
