"""The v1 noise table: 2**16 Gaussian quantiles, checked against a pinned sha256 at import.

Element values come from this table only (no log/cos/erfinv), so noise is identical on
every device. Every entry has at most 12 significant bits, so coefficient × entry is
exact in fp32 when the coefficient has at most 12 significant bits too.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import numpy as np
import torch

TABLE_BITS = 16
TABLE_SIZE = 1 << TABLE_BITS
TABLE_SHA256 = "1afcccbe0499442bf20fd94d3cb5dd5758a44713173548bccb989c6ef184d1fa"
_PATH = Path(__file__).with_name("noise_table.bin")


def _load() -> np.ndarray:
    raw = _PATH.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != TABLE_SHA256:
        raise RuntimeError(f"{_PATH} is corrupt (sha256 {digest}); reinstall seedledger")
    table = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    table.setflags(write=False)
    return table


TABLE_NP: np.ndarray = _load()


@cache
def table_on(device: str) -> torch.Tensor:
    """The table as an fp32 tensor on ``device`` (cached per device string)."""
    return torch.from_numpy(TABLE_NP.copy()).to(device)
