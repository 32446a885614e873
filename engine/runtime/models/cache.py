"""The model cache's entries: where they live (`$SEEDLEDGER_HOME/models`), their manifest
(sha256, size, parameter count) and the checks that tell a sound entry from a truncated
or corrupt one (size + safetensors header; sha256 with `verify`). Untrusted input: a bad
entry reads as "corrupt, rebuild", never as a crash. engine.runtime.models.resolve provisions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
from pathlib import Path
from typing import Any

# the build steps of every alias log here; provisioning shows them (engine.runtime.models.resolve)
log = logging.getLogger("seedledger.engine.runtime.models")

MANIFEST = "seedledger-manifest.json"
MANIFEST_FORMAT = 1
WEIGHTS = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def seedledger_home() -> Path:
    """The cache root: `$SEEDLEDGER_HOME`, default `~/.cache/seedledger`."""
    return Path(os.environ.get("SEEDLEDGER_HOME") or Path.home() / ".cache" / "seedledger")


def models_dir() -> Path:
    return seedledger_home() / "models"


def _safetensors_tensor_bytes(path: Path) -> tuple[int, int]:
    """Parse the safetensors header cheaply: (bytes the header promises, number of params).

    Raises ValueError on a malformed header (whatever its JSON holds: a cache file is
    untrusted input, and a bad one must read as "corrupt, rebuild", never as a crash).
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (hlen,) = struct.unpack("<Q", head)
        if hlen <= 0 or 8 + hlen > size or hlen > 100 << 20:
            raise ValueError("bad header length")
        try:
            header = json.loads(f.read(hlen))
        except RecursionError:
            raise ValueError("header nests too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"header is a JSON {type(header).__name__}, not an object")
    end, params = 0, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        shape = info.get("shape") if isinstance(info, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(_is_count(x) for x in offsets)
            and offsets[0] <= offsets[1]
            and isinstance(shape, list)
            and all(_is_count(d) for d in shape)
        ):
            raise ValueError(f"tensor {name!r} has a malformed entry")
        end = max(end, offsets[1])
        n = 1
        for d in shape:
            n *= d
        params += n
    return 8 + hlen + end, params


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 62


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _read_manifest(entry: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((entry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _check_entry(entry: Path, revision: str, verify: bool = False) -> str | None:
    """None when the cache entry is sound, else the reason it is not (cheap unless verify)."""
    if not entry.is_dir():
        return "missing"
    m = _read_manifest(entry)
    if m is None:
        return "no readable manifest"
    if m.get("format") != MANIFEST_FORMAT or m.get("revision") != revision:
        return f"stale manifest (revision {m.get('revision')!r}, want {revision!r})"
    for name in ("config.json", *TOKENIZER_FILES):
        if not (entry / name).is_file():
            return f"{name} missing"
    weights = entry / WEIGHTS
    try:
        size = weights.stat().st_size
        if size != m.get("size"):
            return f"{WEIGHTS} is {size} bytes, manifest says {m.get('size')}"
        expect, params = _safetensors_tensor_bytes(weights)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{WEIGHTS} unreadable ({exc})"
    if expect != size:
        return f"{WEIGHTS} truncated ({size} of {expect} bytes)"
    if params != m.get("params"):
        return f"{WEIGHTS} holds {params} parameters, manifest says {m.get('params')}"
    if verify and sha256_file(weights) != m.get("sha256"):
        return f"{WEIGHTS} sha256 differs from the manifest"
    return None
