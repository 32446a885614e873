"""Fingerprints: sensitive to every bit, position and name; fast == reference; pinned."""

from __future__ import annotations

import pytest
import torch

from seedledger.replay import _reference as ref
from seedledger.replay.fingerprint import fingerprint, tensor_lanes


def master() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"emb": torch.randn(50, 8, generator=g), "b": torch.randn(3, generator=g), "z": torch.zeros(4)}


def test_format_and_pinned_value():
    fp = fingerprint(master())
    assert len(fp) == 32 and int(fp, 16) >= 0
    assert fingerprint({"a": torch.arange(10, dtype=torch.float32)}) == "f9bf533ac2b3d4fe0a9d958bc58b719e"


@pytest.mark.parametrize("n", [0, 1, 3, 4096, 4097, 20011])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fast_lanes_equal_reference(n, dtype):
    t = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype)
    assert tensor_lanes(t) == ref.fingerprint_lanes_ref(t)


def test_every_single_bit_flip_is_detected():
    m = master()
    base = fingerprint(m)
    seen = {base}
    for idx in (0, 7, 399):
        for bit in range(32):
            flipped = {k: v.clone() for k, v in m.items()}
            flat = flipped["emb"].view(-1).view(torch.int32)
            flat[idx] ^= torch.tensor(1 << bit if bit < 31 else -(1 << 31), dtype=torch.int32)
            fp = fingerprint(flipped)
            assert fp not in seen
            seen.add(fp)


def test_permutation_rename_reshape_and_order():
    m = master()
    base = fingerprint(m)
    swapped = {k: v.clone() for k, v in m.items()}
    swapped["b"][[0, 1]] = swapped["b"][[1, 0]]
    assert fingerprint(swapped) != base
    assert fingerprint({("bias" if k == "b" else k): v for k, v in m.items()}) != base
    assert fingerprint({**m, "emb": m["emb"].reshape(8, 50)}) != base
    assert fingerprint({**m, "z": torch.zeros(5)}) != base  # zeros still count by shape
    assert fingerprint(dict(reversed(list(m.items())))) == base  # insertion order is irrelevant
    assert fingerprint({**m, "emb": m["emb"].t().contiguous().t()}) == base  # layout is irrelevant
