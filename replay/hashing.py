"""64-bit mixing shared by key derivation, noise and fingerprints (spec v1), and by the
engine's sampling streams and the trainers' data splits (``splitmix64``).

Three implementations of the same integer function: plain Python ints (keys), torch
int64 tensors (the reference, any device) and numba uint64 (the fast CPU path, in
``_cpu_kernels``). torch has no uint64 arithmetic, so the tensor version works on int64
bit patterns: wrapping add/mul give the same low 64 bits, and logical right shifts are
arithmetic shifts followed by a mask.
"""

from __future__ import annotations

import hashlib

import torch

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # Weyl increment (splitmix64)
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB


def fmix64(z: int) -> int:
    """splitmix64 finalizer: a bijection of [0, 2**64) with full avalanche."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def splitmix64(x: int) -> int:
    """One splitmix64 output for state ``x``: fmix64 of x plus the Weyl increment. The one
    Python-int version; sampling streams (engine) and data splits (trainers) use it too."""
    return fmix64(x + GOLDEN)


def mix(h: int, x: int) -> int:
    """Absorb ``x`` into hash state ``h`` (order matters: mix(a, b) != mix(b, a))."""
    return fmix64((h & MASK64) ^ splitmix64(x))


def stable_hash(text: str) -> int:
    """A 64-bit hash of a string that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def to_i64(x: int) -> int:
    """uint64 bit pattern as a Python int in int64 range (for torch scalars)."""
    x &= MASK64
    return x - (1 << 64) if x >> 63 else x


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def fmix64_t(z: torch.Tensor) -> torch.Tensor:
    """fmix64 on an int64 tensor of bit patterns (wrapping arithmetic, any device)."""
    z = z ^ _srl(z, 30)
    z = z * to_i64(MIX1)
    z = z ^ _srl(z, 27)
    z = z * to_i64(MIX2)
    return z ^ _srl(z, 31)
