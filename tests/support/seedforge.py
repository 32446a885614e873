"""Hostile seed files made in the tests from a real export: what anyone can write, since a
seed file's checksum guards against damage, not against its author."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zstandard

from seedledger.ledger.seedfile import DIGEST_SIZE, FORMAT_VERSION, MAGIC, PREFIX, _digest

Edit = Callable[[dict, bytearray], "bytes | bytearray | None"]


def read(path: Path) -> tuple[dict, bytes]:
    """(header, member arrays) of a seed file."""
    data = path.read_bytes()
    body = zstandard.ZstdDecompressor().decompress(data[PREFIX.size : -DIGEST_SIZE])
    (hlen,) = struct.unpack_from("<I", body)
    return json.loads(body[4 : 4 + hlen]), body[4 + hlen :]


def write(dest: Path, header: dict, arrays: bytes, version: int = FORMAT_VERSION) -> Path:
    """A checksummed seed file of `header` and `arrays`."""
    hj = json.dumps(header).encode()
    body = struct.pack("<I", len(hj)) + hj + bytes(arrays)
    z = zstandard.ZstdCompressor().compress(body)
    head = PREFIX.pack(MAGIC, version, 0, len(z), len(body))
    dest.write_bytes(head + z + _digest(head + z))
    return dest


def forge(src: Path, dest: Path, edit: Edit) -> Path:
    """`src` with `edit(header, arrays)` applied (it may return new arrays)."""
    header, arrays = read(src)
    buf = bytearray(arrays)
    out = edit(header, buf)
    return write(dest, header, buf if out is None else out)


def with_coefficients(header: dict, arrays: bytes, coefficients: list[float]) -> bytes:
    """The arrays with every coefficient replaced (stored as raw float64 planes)."""
    m = sum(header["generations"]["population"])
    kw = {"index-u16": 2, "index-u32": 4, "raw-u64": 8}[header["keys"]]
    assert len(coefficients) == m
    c = np.asarray(coefficients, dtype="<f8")
    planes = np.ascontiguousarray(c.view(np.uint8).reshape(-1, 8).T).tobytes()
    header["coefficients"] = "f64"
    return bytes(arrays[: m * (1 + kw)]) + planes
