"""Anchors: full-weight caches (master + optimizer state) that shorten a rebuild.

An anchor is a zstd-compressed safetensors file named by its own sha256, recorded in the
ledger with the fingerprint of its master. It is only a cache (docs/design.md invariant 1): loading
checks the sha256 and then the fingerprint against the ledger, and any failure is
reported so the caller can fall back to an earlier anchor or the base model. Since the
ledger's anchor rows are untrusted, only `<sha256>.safetensors.zst` inside the anchors
directory is opened, only as a regular file of the recorded size, bounded by what a
model of the base's shape can hold (where no trusted base sizes it: `unsized_bound`),
hashed while it streams in and decompressed with the same bound.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tempfile
from pathlib import Path

import torch
import zstandard
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.names import printable
from seedledger.ledger.records import AnchorInfo

from .fingerprint import fingerprint
from .update import OptimizerState

FORMAT = "seedledger-anchor/1"
SUFFIX = ".safetensors.zst"


class AnchorError(Exception):
    """An anchor that cannot be used (missing, corrupt, or not the ledger's model)."""


class AnchorWriteError(SeedLedgerError):
    """An anchor that could not be written (full disk, read-only directory): the
    environment's fault, so one line and exit 2; `generation` is the anchored one, which
    is committed."""

    def __init__(self, message: str, generation: int):
        super().__init__(message)
        self.generation = generation


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
    path = directory / f"{sha}{SUFFIX}"
    try:
        _write(directory, path, blob)
    except OSError as exc:
        raise AnchorWriteError(
            f"{run}@{g} is committed, but its anchor could not be written to {directory}: "
            f"{exc.strerror or exc}", g,
        ) from None
    ledger.add_anchor(run, g, str(path.resolve()), sha, fp, len(blob))
    return next(a for a in ledger.anchors(run) if a.generation == g)


SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1 << 20


def _where(info: AnchorInfo) -> str:
    """`anchor RUN@G` for messages, the run name escaped: warnings reach the terminal."""
    return f"anchor {printable(info.run)}@{info.generation}"


def _write(directory: Path, path: Path, blob: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if path.exists():  # content-addressed: an existing file is this file
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def anchor_path(info: AnchorInfo, directory: str | os.PathLike[str]) -> Path:
    """Where the anchor must be: `<sha256>.safetensors.zst` inside the anchors directory.
    The path the ledger recorded is never opened: a ledger may come from anyone, and its
    row could name /dev/zero or any file of the reader's."""
    if not SHA256.fullmatch(info.sha256):
        raise AnchorError(f"{_where(info)}: bad sha256 {info.sha256[:70]!r}")
    return Path(directory) / f"{info.sha256}{SUFFIX}"


def max_anchor_bytes(master: dict[str, torch.Tensor], buffers: int = 2) -> int:
    """The most an anchor of a model shaped like `master` can hold, compressed or not:
    the fp32 master and at most `buffers` optimizer buffers per tensor (Adam's two, or an
    LM-MA-ES run's paths), plus headers."""
    return (1 + max(buffers, 2)) * sum(4 * t.numel() for t in master.values()) + (1 << 20) * (1 + len(master) // 1000)


UNSIZED_FLOOR = 64 << 20  # an anchor no base sizes may always decompress to this much
UNSIZED_RATIO = 32  # ... or to this many times its compressed size (fp32 weights compress ~1.1x)


def unsized_bound(compressed: int) -> int:
    """The most an anchor whose model nothing trusted can size (a module run's generation 0:
    its factory is code, and the shapes its ledger records are the ledger's word) may hold:
    UNSIZED_RATIO times its compressed size, or UNSIZED_FLOOR. Real weights compress little,
    so only a bomb (a few kilobytes of zstd that claim gigabytes) comes near it."""
    return max(UNSIZED_FLOOR, UNSIZED_RATIO * max(compressed, 0))


def _read_checked(info: AnchorInfo, path: Path, max_bytes: int) -> bytes:
    """The file's bytes, read only if it is a regular file of the recorded size (at most
    `max_bytes`), hashed while streaming and checked against the recorded sha256."""
    where = _where(info)
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError as exc:
        raise AnchorError(f"{where}: cannot read {path} ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise AnchorError(f"{where}: {path} is not a regular file")
    if st.st_size != info.size or st.st_size > max_bytes:
        raise AnchorError(f"{where}: {path} is {st.st_size} bytes, not the recorded {info.size} "
                          f"(at most {max_bytes} for this model)")
    digest, parts, total = hashlib.sha256(), [], 0
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(min(CHUNK, st.st_size + 1 - total)):
                digest.update(chunk)
                parts.append(chunk)
                total += len(chunk)
    except OSError as exc:
        raise AnchorError(f"{where}: cannot read {path} ({exc.strerror})") from None
    if total != st.st_size or digest.hexdigest() != info.sha256:
        raise AnchorError(f"{where}: {path} is corrupt (sha256 differs)")
    return b"".join(parts)


def load_anchor(
    info: AnchorInfo, directory: str | os.PathLike[str], expected_fingerprint: str | None,
    max_bytes: int,
) -> tuple[dict[str, torch.Tensor], OptimizerState]:
    """Load and check one anchor from `directory`; raises AnchorError with the reason if it
    is unusable. Nothing larger than `max_bytes` (`max_anchor_bytes` of the base) is read
    or decompressed."""
    path = anchor_path(info, directory)
    blob = _read_checked(info, path, max_bytes)
    try:
        raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(blob)).read(max_bytes + 1)
        if len(raw) > max_bytes:
            raise ValueError(f"decompresses to more than {max_bytes} bytes")
        tensors = st_load(raw)
        meta = _metadata(raw)
        names = meta["names"]
        master = {n: tensors[f"master/{n}"] for n in names}
        state = OptimizerState(name=meta["optimizer"], step=int(meta["step"]))
    except Exception as exc:  # any decode failure means the same thing: unusable cache
        raise AnchorError(f"{_where(info)}: {path} is unreadable ({exc})") from None
    state.buffers = {}
    for key, t in tensors.items():
        if key.startswith("state/"):
            _, kind, name = key.split("/", 2)
            state.buffers.setdefault(kind, {})[name] = t
    fp = fingerprint(master)
    for want in (info.fingerprint, expected_fingerprint):
        if want is not None and fp != want:
            raise AnchorError(f"{_where(info)}: fingerprint {fp} is not the ledger's {want}")
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
