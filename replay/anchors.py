"""Anchors: full-weight caches (master + optimizer state) that shorten a rebuild.

An anchor is a zstd-compressed safetensors file named by its own sha256, recorded in the
ledger with the fingerprint of its master. It is only a cache (invariant 1): loading
checks the sha256 and then the fingerprint against the ledger, and any failure is
reported so the caller can fall back to an earlier anchor or the base model.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch
import zstandard
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from ledger.records import AnchorInfo

from .fingerprint import fingerprint
from .update import OptimizerState

FORMAT = "seedledger-anchor/1"
SUFFIX = ".safetensors.zst"


class AnchorError(Exception):
    """An anchor that cannot be used (missing, corrupt, or not the ledger's model)."""


def save_anchor(
    ledger, run: str, g: int, master: dict[str, torch.Tensor], state: OptimizerState | None,
    directory: str | os.PathLike[str], *, level: int = 3,
) -> AnchorInfo:
    """Write ``run@g`` (master + state) into ``directory`` and record it in the ledger."""
    state = state or OptimizerState()
    fp = fingerprint(master)
    tensors = {f"master/{n}": t.detach().cpu().contiguous() for n, t in master.items()}
    for kind, bufs in state.buffers.items():
        tensors |= {f"state/{kind}/{n}": t.detach().cpu().contiguous() for n, t in bufs.items()}
    meta = {
        "format": FORMAT, "run": run, "generation": g, "fingerprint": fp,
        "optimizer": state.name, "step": state.step, "names": list(master),
    }
    # one metadata key: safetensors writes a map in arbitrary order, which would make
    # the bytes (and so the content address) differ between identical saves
    header = {"seedledger": json.dumps(meta, sort_keys=True)}
    blob = zstandard.ZstdCompressor(level=level).compress(st_save(tensors, metadata=header))
    sha = hashlib.sha256(blob).hexdigest()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{sha}{SUFFIX}"
    if not path.exists():  # content-addressed: an existing file is this file
        fd, tmp = tempfile.mkstemp(prefix=f".{sha}.", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    ledger.add_anchor(run, g, str(path.resolve()), sha, fp, len(blob))
    return next(a for a in ledger.anchors(run) if a.generation == g)


def anchor_path(info: AnchorInfo, directory: str | os.PathLike[str] | None) -> Path:
    """Where the file is: by name inside ``directory`` (the ledger may have moved), else as recorded."""
    recorded = Path(info.path)
    if directory is not None:
        local = Path(directory) / recorded.name
        if local.exists():
            return local
    return recorded


def load_anchor(
    info: AnchorInfo, directory: str | os.PathLike[str] | None, expected_fingerprint: str | None,
) -> tuple[dict[str, torch.Tensor], OptimizerState]:
    """Load and check one anchor; raises AnchorError with the reason if it is unusable."""
    path = anchor_path(info, directory)
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise AnchorError(f"anchor {info.run}@{info.generation}: cannot read {path} ({exc.strerror})") from None
    if hashlib.sha256(blob).hexdigest() != info.sha256:
        raise AnchorError(f"anchor {info.run}@{info.generation}: {path} is corrupt (sha256 differs)")
    try:
        raw = zstandard.ZstdDecompressor().decompress(blob)
        tensors = st_load(raw)
        meta = _metadata(raw)
        names = meta["names"]
        master = {n: tensors[f"master/{n}"] for n in names}
        state = OptimizerState(name=meta["optimizer"], step=int(meta["step"]))
    except Exception as exc:  # any decode failure means the same thing: unusable cache
        raise AnchorError(f"anchor {info.run}@{info.generation}: {path} is unreadable ({exc})") from None
    state.buffers = {}
    for key, t in tensors.items():
        if key.startswith("state/"):
            _, kind, name = key.split("/", 2)
            state.buffers.setdefault(kind, {})[name] = t
    fp = fingerprint(master)
    for want in (info.fingerprint, expected_fingerprint):
        if want is not None and fp != want:
            raise AnchorError(f"anchor {info.run}@{info.generation}: fingerprint {fp} is not the ledger's {want}")
    return master, state


def _metadata(raw: bytes) -> dict:
    """The safetensors header's __metadata__ (load() does not return it)."""
    n = int.from_bytes(raw[:8], "little")
    return json.loads(json.loads(raw[8 : 8 + n])["__metadata__"]["seedledger"])


def remove_unused(ledger, shas: list[str], directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the anchor files named by `shas` from `directory` when no anchor row of the
    ledger uses them any more (after `delete_run`). Only `<sha256>.safetensors.zst` inside
    `directory` is ever removed, never a path a ledger row names: rows may be hostile."""
    in_use = ledger.anchor_shas()
    removed = []
    for sha in shas:
        if sha in in_use or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            continue
        path = Path(directory) / f"{sha}{SUFFIX}"
        if path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(path)
    return removed
