"""Per-row, per-member scores of a generation: the N×B matrix `attribute` needs to
recompute the generation's coefficients without one training row.

A member's reward is the mean of its row scores over the rows that could be scored (NaN:
a row no reward function scored; pass@k: one score per prompt, its pass@k estimate), so
the matrix and the recorded shaping give the coefficients back exactly, and without row r
they give the coefficients the generation would have had had r not been in its batch.

Stored on the generation row (`generations.row_scores`, migration 0008) as one zstd blob:
``b"RS1"``, a dtype byte (``f``: float32, used when every value is exactly a float32, as
0/1 and most task rewards are; ``d``: float64, e.g. likelihoods), ``<II`` N and B, then
the values member-major, little-endian. Exact either way: float32 only when it loses
nothing. The blob is inside the row's chain digest (ledger.chain), so an edited score
fails `verify --quick` like any other edited column.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import zstandard

from seedledger.ledger.errors import SeedLedgerError

MAGIC = b"RS1"
HEADER = struct.Struct("<3scII")
_ZC = zstandard.ZstdCompressor(level=10)


def pack(scores: list[list[float]] | None) -> bytes | None:
    """The blob for one generation's scores (member-major), None when there are none."""
    if scores is None:
        return None
    n, b = len(scores), len(scores[0]) if scores else 0
    if n == 0 or any(len(row) != b for row in scores):
        raise SeedLedgerError("row scores need the same number of rows for every member")
    wide = np.asarray(scores, dtype="<f8")
    narrow = wide.astype("<f4")
    exact = np.array_equal(narrow.astype("<f8"), wide, equal_nan=True)
    values, code = (narrow, b"f") if exact else (wide, b"d")
    return _ZC.compress(HEADER.pack(MAGIC, code, n, b) + values.tobytes())


def unpack(blob: bytes, population: int, rows: int, where: str) -> list[list[float]]:
    """The scores of a stored blob, checked against the generation it belongs to: one row
    of `rows` values per member of `population` (anything else is a damaged ledger)."""
    limit = HEADER.size + 8 * population * rows
    try:
        raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=limit)
    except zstandard.ZstdError as exc:
        raise SeedLedgerError(f"ledger is damaged: {where} has unreadable row scores ({exc})") from None
    if len(raw) < HEADER.size:
        raise SeedLedgerError(f"ledger is damaged: {where} has truncated row scores")
    magic, code, n, b = HEADER.unpack_from(raw)
    width = {b"f": 4, b"d": 8}.get(code)
    if magic != MAGIC or width is None or (n, b) != (population, rows) or len(raw) != HEADER.size + width * n * b:
        raise SeedLedgerError(
            f"ledger is damaged: {where} has row scores for {n}×{b} (expected {population} members × {rows} rows)"
        )
    values = np.frombuffer(raw, dtype="<f4" if width == 4 else "<f8", offset=HEADER.size).astype(np.float64)
    return values.reshape(n, b).tolist()


def member_reward(scores: list[float]) -> float:
    """A member's reward from its row scores, as evaluation computes it: the mean over the
    scored rows (NaN left out; 0.0 when none was scored), summed in row order."""
    kept = [s for s in scores if not math.isnan(s)]
    return sum(kept) / len(kept) if kept else 0.0


__all__ = ["member_reward", "pack", "unpack"]
