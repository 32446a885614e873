"""Exact, portable encodings for what SQL types would mangle.

SQLite stores an integral REAL as an integer (so -0.0 comes back as 0.0) and NaN as NULL;
SQL integers are signed. So keys are stored as signed int64, and the exact arrays (keys,
coefficients, rewards) are little-endian blobs on the generation row.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import zstandard

from seedledger.ledger.errors import SeedLedgerError

U64 = 1 << 64
I64_MAX = (1 << 63) - 1
I64_MIN = -(1 << 63)


def key_to_sql(key: int) -> int:
    """uint64 -> int64 (two's complement), refusing anything outside [0, 2**64)."""
    if not isinstance(key, int) or isinstance(key, bool) or not 0 <= key < U64:
        raise SeedLedgerError(f"key {key!r} is not an unsigned 64-bit integer")
    return key - U64 if key > I64_MAX else key


def key_from_sql(value: int) -> int:
    return value + U64 if value < 0 else value


def pack_u64(values: list[int]) -> bytes:
    for v in values:
        key_to_sql(v)
    return struct.pack(f"<{len(values)}Q", *values)


def unpack_u64(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 8}Q", blob))


def pack_f64(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def unpack_f64(blob: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(blob) // 8}d", blob))


def sql_float(value: float) -> float | None:
    """A float for an audit column: NaN becomes NULL (what SQLite would do anyway)."""
    return None if value != value else value


_ENC = json.JSONEncoder(sort_keys=True, separators=(",", ":"))


def dumps(obj: Any) -> str:
    """Canonical JSON text (sorted keys; Python's float repr round-trips exactly)."""
    return _ENC.encode(obj)


MAX_DEPTH = 100  # JSON nesting a ledger may hold: seedledger's own nests a few levels


def nested_within(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether parsed JSON `value` nests at most `limit` containers deep, walked level by
    level (no recursion: the value may be as deep as the parser allowed)."""
    level = [value]
    for _ in range(limit):
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
                 if isinstance(c, dict | list)]
        if not level:
            return True
    return False


def _bounded(text: str | bytes, what: str) -> Any:
    """`text` parsed, refused in one line when it nests deeper than MAX_DEPTH: a ledger may
    come from anyone, and its readers and printers (`log`, `show`, --json, the chain) recurse
    over what they read, so a payload a thousand levels deep failed mid-way (RecursionError)
    depending on how deep the caller already was."""
    too_deep = SeedLedgerError(f"{what} nests deeper than {MAX_DEPTH} levels (seedledger writes none so deep)")
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep from None
    opening = (b"[", b"{") if isinstance(text, bytes) else ("[", "{")
    if sum(map(text.count, opening)) > MAX_DEPTH and not nested_within(value):  # walked only where it could be deep
        raise too_deep
    return value


def loads(text: str | None, what: str = "a JSON value in the ledger") -> Any:
    return None if text is None else _bounded(text, what)


_ZC = zstandard.ZstdCompressor(level=10)


def zjson(obj: Any) -> bytes | None:
    """Per-sample audit data as zstd-compressed JSON (never pickle)."""
    return None if obj is None else _ZC.compress(dumps(obj).encode())


def unzjson(blob: bytes | None, limit: int = 1 << 30) -> Any:
    if blob is None:
        return None
    return _bounded(zstandard.ZstdDecompressor().decompress(blob, max_output_size=limit), "a member's samples")
