"""numba kernels: the fast CPU path, bit-identical to ``_reference``.

Compiled once and cached on disk (``cache=True``); no fastmath, so LLVM neither
contracts a*b+c into an FMA nor reorders sums. Each output element is computed by one
thread from (key, index) alone, so thread count and block size never change a bit; the
fingerprint lanes are wrapping uint64 sums, which are order independent.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

BLOCK = 4096  # elements per parallel work item (multiple of 4); 16 KiB fp32 scratch

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


@njit(parallel=True, **_OPTS)
def generate(key, kx, offset, out, table):
    """out[p] = eps(key, offset + p)."""
    n = out.shape[0]
    if n == 0:
        return
    g0 = offset >> 2
    g1 = (offset + n + 3) >> 2
    gpb = BLOCK >> 2
    nb = (g1 - g0 + gpb - 1) // gpb
    for b in prange(nb):
        ja = g0 + b * gpb
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
def _accumulate_block(delta, start, stop, keys, kxs, coefs, table):
    """delta[0:stop-start] = Σ_m coefs[m]·eps(keys[m], start..stop) in member order."""
    n = stop - start
    for p in range(n):
        delta[p] = np.float32(0.0)
    full = n & ~3
    for m in range(keys.shape[0]):
        key = keys[m]
        kx = kxs[m]
        c = coefs[m]
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


@njit(parallel=True, **_OPTS)
def apply(theta, keys, kxs, coefs, table, rule, scal, buf1, buf2):
    """theta (and optimizer buffers) updated in place, one pass over memory per block.

    rule SGD: θ += Δ. MOMENTUM (scal = β, 1−d, lr; buf1 = v): v = v·β; t = Δ·(1−d);
    v = v + t; θ = θ + v·lr. ADAM (scal = β1, 1−β1, β2, 1−β2, 1/√bc2, eps, lr/bc1;
    buf1 = m, buf2 = v): see ``_reference.apply_rule_ref`` for the same op sequence.
    """
    n = theta.shape[0]
    nb = (n + BLOCK - 1) // BLOCK
    for b in prange(nb):
        start = b * BLOCK
        stop = min(start + BLOCK, n)
        delta = np.empty(BLOCK, dtype=np.float32)
        _accumulate_block(delta, start, stop, keys, kxs, coefs, table)
        for p in range(stop - start):
            i = start + p
            g = delta[p]
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


@njit(parallel=True, **_OPTS)
def delta(out, keys, kxs, coefs, table):
    """out = Δ only (for tests and callers that want the raw update)."""
    n = out.shape[0]
    nb = (n + BLOCK - 1) // BLOCK
    for b in prange(nb):
        start = b * BLOCK
        stop = min(start + BLOCK, n)
        buf = np.empty(BLOCK, dtype=np.float32)
        _accumulate_block(buf, start, stop, keys, kxs, coefs, table)
        for p in range(stop - start):
            out[start + p] = buf[p]


@njit(parallel=True, **_OPTS)
def perturb(out, master, key, kx, scale, table):
    """out = master + scale·eps (product exact; one fp32 rounding)."""
    n = out.shape[0]
    nb = (n + BLOCK - 1) // BLOCK
    for b in prange(nb):
        start = b * BLOCK
        stop = min(start + BLOCK, n)
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
def fingerprint_lanes(bits, salt0, salt1):
    """(Σ bits_i·(fmix(salt0 + i·G)|1), Σ bits_i·(fmix(salt1 + i·G)|1)) mod 2**64."""
    n = bits.shape[0]
    nb = (n + BLOCK - 1) // BLOCK
    acc0 = np.zeros(nb, dtype=np.uint64)
    acc1 = np.zeros(nb, dtype=np.uint64)
    for b in prange(nb):
        start = b * BLOCK
        stop = min(start + BLOCK, n)
        a0 = uint64(0)
        a1 = uint64(0)
        for i in range(start, stop):
            x = uint64(bits[i])
            w = uint64(i) * _G
            a0 += x * (_fmix(salt0 + w) | _ONE)
            a1 += x * (_fmix(salt1 + w) | _ONE)
        acc0[b] = a0
        acc1[b] = a1
    s0 = uint64(0)
    s1 = uint64(0)
    for b in range(nb):
        s0 += acc0[b]
        s1 += acc1[b]
    return s0, s1
