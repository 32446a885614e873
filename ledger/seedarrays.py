"""A seed file's member arrays: signs (i8), keys, coefficients over all M members in
generation order, each byte-planed (all first bytes, then all second bytes...) so zstd
compresses them well. Both encodings round-trip bit-exactly.

Keys are member-key *indices* j with key = key_fn(run_key, g, j) when every key is
derived (`index-u16`/`index-u32`), else raw u64 (`raw-u64`, not byte-planed: whole
8-byte keys repeat in mirrored pairs and zstd finds them). Coefficients rounded to ≤ 12
significant bits are exactly the top 20 bits of a float32, stored in 3 bytes (`f32hi20`);
anything else is raw float64 (`f64`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from seedledger.ledger.checks import need
from seedledger.ledger.records import ReplayStep

KeyFn = Callable[[int, int, int], int]
KEY_WIDTH = {"index-u16": 2, "index-u32": 4, "raw-u64": 8}
COEFFICIENT_WIDTH = {"f32hi20": 3, "f64": 8}


def _planes(arr: np.ndarray, width: int) -> bytes:
    return np.ascontiguousarray(arr.view(np.uint8).reshape(-1, width).T).tobytes()


def _unplanes(buf: bytes, width: int, count: int) -> np.ndarray:
    return np.frombuffer(buf, dtype=np.uint8).reshape(width, count).T.copy()


def _pack_coefficients(coefs: np.ndarray) -> tuple[str, bytes]:
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = coefs.astype("<f4")
    bits = f32.view("<u4")
    exact = np.array_equal(f32.astype("<f8").view("<u8"), coefs.view("<u8"))
    if exact and not (bits & 0xFFF).any():
        hi = (bits >> 12).astype("<u4")
        return "f32hi20", _planes(hi, 4)[: 3 * len(hi)]
    return "f64", _planes(coefs, 8)


def _key_indices(steps: list[ReplayStep], run_keys: dict[str, int], key_fn: KeyFn | None):
    """Per member, j with key == key_fn(run_key, g, j), or None if some key is not derived."""
    if key_fn is None:
        return None
    out: list[int] = []
    for s in steps:
        table: dict[int, int] = {}
        rk = run_keys[s.run]
        for j in range(len(s.keys)):
            table.setdefault(key_fn(rk, s.index, j), j)
        for k in s.keys:
            if k not in table:
                return None
            out.append(table[k])
    return out


def pack(
    steps: list[ReplayStep], signs: list[int], run_keys: dict[str, int], key_fn: KeyFn | None
) -> tuple[str, str, bytes]:
    """(key encoding, coefficient encoding, the arrays) for the members of `steps`, with
    `run_keys` naming each segment run's key."""
    keys = [k for s in steps for k in s.keys]
    coefs = np.array([c for s in steps for c in s.coefficients], dtype="<f8")
    idx = _key_indices(steps, run_keys, key_fn)
    if idx is not None:
        kw = 2 if max((len(s.keys) for s in steps), default=0) <= 1 << 16 else 4
        key_mode, key_bytes = f"index-u{kw * 8}", _planes(np.array(idx, dtype=f"<u{kw}"), kw)
    else:
        key_mode, key_bytes = "raw-u64", np.array(keys, dtype="<u8").tobytes()
    coef_mode, coef_bytes = _pack_coefficients(coefs)
    return key_mode, coef_mode, np.array(signs, dtype="<i1").tobytes() + key_bytes + coef_bytes


def _derive_keys(idx: np.ndarray, pops: list[int], runs: list[int], key_fn: KeyFn) -> np.ndarray:
    """key = key_fn(run_key, g, j) per member, calling key_fn once per distinct (g, j)."""
    keys = np.empty(len(idx), dtype="<u8")
    at = 0
    for gi, n in enumerate(pops):
        if n:
            uniq, inv = np.unique(idx[at : at + n], return_inverse=True)
            table = np.array([key_fn(runs[gi], gi + 1, j) for j in uniq.tolist()], dtype="<u8")
            keys[at : at + n] = table[inv]
        at += n
    return keys


def unpack(
    body: bytes, pos: int, pops: list[int], run_keys: list[int],
    key_mode: str, coef_mode: str, key_fn: KeyFn | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(signs, keys, coefficients) of the arrays at `body[pos:]`, whose size the caller
    checked; `pops` and `run_keys` are per generation. Every step is numpy: no per-member
    Python object is made here."""
    M = sum(pops)
    kw = KEY_WIDTH[key_mode]
    signs = np.frombuffer(body, dtype="<i1", count=M, offset=pos)
    need(bool(np.isin(signs, (-1, 0, 1)).all()), "bad member sign")
    pos += M
    if key_mode == "raw-u64":
        keys = np.frombuffer(body, dtype="<u8", count=M, offset=pos)
    else:
        idx = _unplanes(body[pos : pos + M * kw], kw, M).view(f"<u{kw}").ravel()
        pop_of = np.repeat(np.asarray(pops, dtype=np.int64), pops)
        need(not bool((idx >= pop_of).any()), "member key index out of range")
        keys = _derive_keys(idx, pops, run_keys, key_fn)  # type: ignore[arg-type]
    pos += M * kw
    if coef_mode == "f32hi20":
        planes = _unplanes(body[pos : pos + 3 * M], 3, M).astype("<u4")
        bits = (planes[:, 0] | (planes[:, 1] << 8) | (planes[:, 2] << 16)) << 12
        coefs = bits.astype("<u4").view("<f4").astype("<f8")
    else:
        coefs = _unplanes(body[pos : pos + 8 * M], 8, M).view("<f8").ravel()
    return signs, keys, coefs
