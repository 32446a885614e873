"""Regenerate ``noise_table.bin`` (noise spec v1). Needs scipy; runtime never imports this.

The table is part of the spec: changing a single bit changes every replay, so the
checksum in ``replay/table.py`` pins it. Run ``python -m seedledger.replay.make_noise_table`` only
to re-derive the committed file; its sha256 must not change.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np

TABLE_BITS = 16
SIG_BITS = 12


def round_sig(x: float, bits: int = SIG_BITS) -> float:
    """Round to ``bits`` significant bits, ties to even (same rule as round_coefficient)."""
    if x == 0.0:
        return 0.0
    m, e = math.frexp(x)
    return math.ldexp(round(m * (1 << bits)), e - bits)


def build() -> np.ndarray:
    from scipy.special import ndtri

    n = 1 << TABLE_BITS
    q = ndtri((np.arange(n, dtype=np.float64) + 0.5) / n)
    q /= math.sqrt(float(np.mean(q * q)))  # unit variance before rounding
    return np.array([round_sig(float(v)) for v in q], dtype="<f4")


def main() -> None:
    table = build()
    path = Path(__file__).with_name("noise_table.bin")
    path.write_bytes(table.tobytes())
    print(path, hashlib.sha256(table.tobytes()).hexdigest(), float(np.var(table.astype(np.float64))))


if __name__ == "__main__":
    main()
