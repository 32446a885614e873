"""Seed files: a run@g with its whole lineage in one small, self-describing file.

Layout (all little-endian; no pickle, nothing executed):

    magic    8 bytes  b"SLSEEDS\\0"
    version  u16      FORMAT_VERSION
    flags    u16      0
    zlen     u64      length of the zstd body that follows
    rawlen   u64      its decompressed length (checked against limits BEFORE decompressing)
    body     zlen bytes, zstd
    digest   32 bytes blake2b-256 of everything before it

Body: u32 header length, header JSON (base model and fingerprint, noise spec, config,
lineage segments with their run keys, per-generation σ / lr / optimizer / schedule step /
fingerprint), then byte-planed arrays over all M members in generation order: signs (i8),
keys, coefficients. Keys are member-key *indices* j with key = key_fn(run_key, g, j)
when the exporter was given `key_fn` (replay.noise.member_key) and every key matched,
else raw u64 (not byte-planed, so repeated keys compress). Coefficients rounded to ≤ 12 significant bits are exactly the top 20 bits
of a float32 and are stored in 3 bytes; anything else falls back to raw float64. Both
round-trip bit-exactly.

A hostile file cannot blow up memory or time. A real seed file is kilobytes (27.7 KB for
500 generations x N=30), so the limits are generous for real runs and tight for bombs:
at most 65,536 members per generation, 2,097,152 in all, 1,048,576 generations; the body
may be at most 1024x its compressed size (above an 8 MB floor) and ~52 MB in all, checked
before decompressing, and the decompressor never reads past the declared size. Every
header field is checked (types, ranges, lengths that the SQL columns hold), and the
declared counts against the actual byte count, before any per-member list is built;
per-member checks and key derivation are vectorized with numpy. `export_seedfile` refuses
to write a file its reader would refuse.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import zstandard

from ledger import codec
from ledger.durable import write_file_durably
from ledger.errors import SeedLedgerError
from ledger.ledger import Ledger
from ledger.records import GenerationRecord, MemberRecord, ReplayStep, RunInfo, missing_fingerprint

MAGIC = b"SLSEEDS\x00"
FORMAT_VERSION = 1
PREFIX = struct.Struct("<8sHHQQ")
DIGEST_SIZE = 32
MAX_POPULATION = 1 << 16  # members per generation (the paper: 30)
MAX_MEMBERS = 1 << 21  # members in all (e.g. 10,000 generations x 200)
MAX_GENERATIONS = 1 << 20
MAX_HEADER = 16 << 20  # header JSON (~70 bytes per generation)
MAX_MEMBER_BYTES = 1 + 8 + 8  # sign, raw key, f64 coefficient: the widest encoding
MAX_BODY = MAX_HEADER + 4 + MAX_MEMBERS * MAX_MEMBER_BYTES  # ~52 MB
MAX_FILE = MAX_BODY + (1 << 20)  # zstd never expands by more than a little
MAX_RATIO = 1024  # body size / compressed size (zstd reaches ~32,000x on a bomb)
RATIO_FLOOR = 8 << 20  # bodies up to this size may compress as well as they like
I32 = 1 << 31
# longest strings the SQL columns take (ledger.schema) / that a sane header holds
MAX_NAME = 200
MAX_TEXT = 1 << 16
MAX_FINGERPRINT = 64
MAX_NOISE_SPEC = 32
MAX_DTYPE_POLICY = 64

KeyFn = Callable[[int, int, int], int]


@dataclass
class SeedFile:
    """A parsed seed file: the header and one ReplayStep per generation (oldest first)."""

    header: dict[str, Any]
    steps: list[ReplayStep]
    signs: list[list[int]]
    fingerprints: list[str | None]
    lrs: list[float]
    schedule_steps: list[int]
    digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def generation(self) -> int:
        return self.header["generation"]

    @property
    def base_model(self) -> str:
        return self.header["base"]["model"]

    @property
    def base_revision(self) -> str | None:
        return self.header["base"]["revision"]

    @property
    def base_fingerprint(self) -> str | None:
        return self.header["base"]["fingerprint"]

    @property
    def noise_spec(self) -> str:
        return self.header["noise_spec"]

    @property
    def final_fingerprint(self) -> str | None:
        return self.header["final_fingerprint"]


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def _planes(arr: np.ndarray, width: int) -> bytes:
    """Byte-plane shuffle (all first bytes, then all second bytes...): zstd likes it."""
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


def _key_indices(steps: list[ReplayStep], seg_key: dict[str, int], key_fn: KeyFn | None):
    """Per member, j with key == key_fn(run_key, g, j), or None if some key is not derived."""
    if key_fn is None:
        return None
    out: list[int] = []
    for s in steps:
        table: dict[int, int] = {}
        rk = seg_key[s.run]
        for j in range(len(s.keys)):
            table.setdefault(key_fn(rk, s.index, j), j)
        for k in s.keys:
            if k not in table:
                return None
            out.append(table[k])
    return out


def export_seedfile(
    ledger: Ledger,
    run: str,
    g: int | None,
    path: str | os.PathLike[str],
    *,
    key_fn: KeyFn | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Write `run@g` (default latest) and its lineage to `path`; returns the header.

    Pass `key_fn=replay.noise.member_key` for compact files (keys stored as indices).
    The file is written atomically; an existing file is replaced only with `force`, and a
    directory or a ledger (any SQLite database) never (`durable.check_file_target`).
    """
    info = ledger.get_run(run)
    g = ledger.latest_generation(run) if g is None else g
    segments = ledger.ancestors(run, g)
    records = ledger.records(run, g)
    seg_info = {name: ledger.get_run(name) for name, _a, _b in segments}
    seg_key = {name: ri.run_key for name, ri in seg_info.items()}
    steps = [
        ReplayStep(
            name,
            r.index,
            [m.key for m in r.members],
            [m.coefficient for m in r.members],
            r.sigma,
            r.optimizer,
        )
        for (name, a, b) in segments
        for r in records[a - 1 : b]
    ]
    optimizers: list[dict[str, Any]] = []
    opt_of: list[int] = []
    seen: dict[str, int] = {}
    for r in records:
        text = json.dumps(r.optimizer, sort_keys=True)
        if text not in seen:
            seen[text] = len(optimizers)
            optimizers.append(r.optimizer)
        opt_of.append(seen[text])
    keys = [k for s in steps for k in s.keys]
    coefs = np.array([c for s in steps for c in s.coefficients], dtype="<f8")
    signs = np.array([m.sign for r in records for m in r.members], dtype="<i1")
    idx = _key_indices(steps, seg_key, key_fn)
    max_pop = max((r.population for r in records), default=0)
    if idx is not None:
        kw = 2 if max_pop <= 1 << 16 else 4
        key_mode, key_bytes = f"index-u{kw * 8}", _planes(np.array(idx, dtype=f"<u{kw}"), kw)
    else:
        # not byte-planed: whole 8-byte keys repeat (mirrored pairs) and zstd finds them
        key_mode, key_bytes = "raw-u64", np.array(keys, dtype="<u8").tobytes()
    coef_mode, coef_bytes = _pack_coefficients(coefs)
    header = {
        "format": "seedledger-seeds",
        "run": run,
        "generation": g,
        "base": {
            "model": info.base_model,
            "revision": info.base_revision,
            "fingerprint": info.base_fingerprint,
        },
        "noise_spec": info.noise_spec,
        "dtype_policy": info.dtype_policy,
        "param_selection": info.param_selection,
        "config": info.config,
        "seed": info.seed,
        "run_key": str(info.run_key),
        "segments": [
            {
                "run": n,
                "first": a,
                "last": b,
                "run_key": str(seg_key[n]),
                "noise_spec": seg_info[n].noise_spec,
            }
            for n, a, b in segments
        ],
        "generations": {
            "population": [r.population for r in records],
            "sigma": [r.sigma for r in records],
            "lr": [r.lr for r in records],
            "schedule_step": [r.schedule_step for r in records],
            "optimizers": optimizers,
            "optimizer_of": opt_of,
            "fingerprint": [r.fingerprint for r in records],
        },
        "final_fingerprint": records[-1].fingerprint if records else None,
        "keys": key_mode,
        "coefficients": coef_mode,
        "software": info.software,
        "exported_at": datetime.now(UTC).isoformat(),
    }
    hjson = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = b"".join([struct.pack("<I", len(hjson)), hjson, signs.tobytes(), key_bytes, coef_bytes])
    z = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(body)
    too_big = _too_big(len(records), max_pop, len(signs), len(hjson), len(body), len(z))
    if too_big:
        raise SeedLedgerError(f"cannot export {run}@{g} as a seed file: {too_big}")
    head = PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(z), len(body))
    blob = head + z
    blob += _digest(blob)
    write_file_durably(Path(path), blob, force)
    return header


# -- reading -------------------------------------------------------------------------------


class _Bad(Exception):
    """Internal: a malformed file; turned into one SeedLedgerError line."""


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise _Bad(what)


def _ratio_ok(rawlen: int, zlen: int) -> bool:
    return rawlen <= max(RATIO_FLOOR, MAX_RATIO * zlen)


def _too_big(gens: int, max_pop: int, members: int, hlen: int, rawlen: int, zlen: int) -> str:
    """Why a file of these sizes exceeds the limits ("" when it does not)."""
    if gens > MAX_GENERATIONS:
        return f"{gens} generations, more than {MAX_GENERATIONS}"
    if max_pop > MAX_POPULATION:
        return f"a population of {max_pop}, more than {MAX_POPULATION}"
    if members > MAX_MEMBERS:
        return f"{members} members, more than {MAX_MEMBERS}"
    if hlen > MAX_HEADER:
        return f"a {hlen}-byte header, more than {MAX_HEADER}"
    if rawlen > MAX_BODY or not _ratio_ok(rawlen, zlen):
        return f"a {rawlen}-byte body compressed to {zlen} bytes is out of bounds"
    return ""


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    _need(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi, f"bad {what}")
    return v


def _float(v: Any, what: str) -> float:
    """A finite number (JSON int or float; booleans are not numbers here)."""
    _need(isinstance(v, float | int) and not isinstance(v, bool), f"bad {what}")
    try:
        x = float(v)
    except OverflowError:
        raise _Bad(f"bad {what}") from None
    _need(math.isfinite(x), f"bad {what} (not finite)")
    return x


def _str(v: Any, what: str, max_len: int = MAX_TEXT, optional: bool = False) -> str | None:
    """A string the SQL columns take: at most `max_len` characters, valid UTF-8, no NUL."""
    if optional and v is None:
        return None
    _need(isinstance(v, str) and len(v) <= max_len and "\x00" not in v, f"bad {what}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a \ud800 escape
        raise _Bad(f"bad {what} (not UTF-8)") from None
    return v


def _u64_text(v: Any, what: str) -> int:
    _need(isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 20, f"bad {what}")
    n = int(v)
    _need(n < 1 << 64, f"bad {what}")
    return n


def _json_obj(v: Any, what: str) -> dict[str, Any]:
    _need(isinstance(v, dict), f"bad {what}")
    try:
        codec.dumps(v)  # what the ledger will store: must serialize again
    except (ValueError, TypeError, RecursionError):
        raise _Bad(f"bad {what}") from None
    return v


def _list(v: Any, n: int, what: str) -> list[Any]:
    _need(isinstance(v, list) and len(v) == n, f"{what} must list {n} generations")
    return v


def _body(data: bytes) -> bytes:
    _need(len(data) >= PREFIX.size + DIGEST_SIZE, "too short to be a seed file")
    magic, version, flags, zlen, rawlen = PREFIX.unpack_from(data)
    _need(magic == MAGIC, "not a seedledger seed file (bad magic)")
    if version > FORMAT_VERSION:
        raise _Bad(f"format {version} is newer than this seedledger reads ({FORMAT_VERSION})")
    _need(version == FORMAT_VERSION and flags == 0, f"unknown format {version}/{flags}")
    _need(zlen == len(data) - PREFIX.size - DIGEST_SIZE, "truncated or has trailing bytes")
    _need(4 <= rawlen <= MAX_BODY, f"declared body size {rawlen} is out of bounds")
    _need(
        _ratio_ok(rawlen, zlen),
        f"declared body size {rawlen} is out of bounds for {zlen} compressed bytes",
    )
    _need(_digest(memoryview(data)[:-DIGEST_SIZE]) == data[-DIGEST_SIZE:], "checksum mismatch")
    z = memoryview(data)[PREFIX.size : -DIGEST_SIZE]
    framed = zstandard.frame_content_size(z)
    _need(framed in (-1, rawlen), "body length differs from the declared one")
    # streaming, so the decompressor never produces more than rawlen + 1 bytes
    body = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(z)).read(rawlen + 1)
    _need(len(body) == rawlen, "body length differs from the declared one")
    return body


def _header(body: bytes) -> tuple[dict[str, Any], int]:
    (hlen,) = struct.unpack_from("<I", body)
    _need(hlen <= min(MAX_HEADER, len(body) - 4), "header length out of bounds")
    h = json.loads(body[4 : 4 + hlen].decode("utf-8"))
    _need(isinstance(h, dict) and h.get("format") == "seedledger-seeds", "bad header")
    return h, 4 + hlen


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


def _parse(body: bytes, key_fn: KeyFn | None) -> SeedFile:
    h, pos = _header(body)
    _str(h.get("run"), "run name", MAX_NAME)
    G = _int(h.get("generation"), 0, MAX_GENERATIONS, "generation")
    base = h.get("base")
    _need(isinstance(base, dict), "bad base")
    _str(base.get("model"), "base model")
    _str(base.get("revision"), "base revision", optional=True)
    _str(base.get("fingerprint"), "base fingerprint", MAX_FINGERPRINT, optional=True)
    spec = _str(h.get("noise_spec"), "noise_spec", MAX_NOISE_SPEC)
    _str(h.get("dtype_policy"), "dtype_policy", MAX_DTYPE_POLICY)
    _str(h.get("param_selection"), "param_selection")
    _json_obj(h.get("config"), "config")
    _json_obj(h.get("software"), "software")
    if h.get("seed") is not None:
        _int(h.get("seed"), codec.I64_MIN, codec.I64_MAX, "seed")
    _u64_text(h.get("run_key"), "run key")
    final = _str(h.get("final_fingerprint"), "final fingerprint", MAX_FINGERPRINT, optional=True)
    segs = h.get("segments")
    _need(isinstance(segs, list) and len(segs) <= G + 1, "bad segments")
    seg_of: list[tuple[str, int]] = []  # per generation: (run, run_key)
    nxt = 1
    for s in segs:
        _need(isinstance(s, dict), "bad segment")
        name = _str(s.get("run"), "segment run", MAX_NAME)
        first = _int(s.get("first"), nxt, nxt, "segment start")
        last = _int(s.get("last"), first, G, "segment end")
        _need(s.get("noise_spec") == spec, "a segment's noise spec differs from the file's")
        rk = _u64_text(s.get("run_key"), "segment run key")
        seg_of += [(name, rk)] * (last - first + 1)
        nxt = last + 1
    _need(nxt == G + 1, "segments do not cover the generations")
    gens = h.get("generations")
    _need(isinstance(gens, dict), "bad generations")
    pops = [
        _int(p, 0, MAX_POPULATION, f"population (at most {MAX_POPULATION})")
        for p in _list(gens.get("population"), G, "population")
    ]
    M = sum(pops)
    _need(M <= MAX_MEMBERS, f"declares {M} members, more than {MAX_MEMBERS}")
    sigmas = [_float(v, "sigma") for v in _list(gens.get("sigma"), G, "sigma")]
    lrs = [_float(v, "lr") for v in _list(gens.get("lr"), G, "lr")]
    ssteps = [
        _int(v, -I32, I32 - 1, "schedule step")
        for v in _list(gens.get("schedule_step"), G, "schedule_step")
    ]
    fps = [
        _str(v, "fingerprint", MAX_FINGERPRINT, optional=True)
        for v in _list(gens.get("fingerprint"), G, "fingerprint")
    ]
    _need(final == (fps[-1] if fps else None), "final fingerprint differs from the last one")
    opts = gens.get("optimizers")
    _need(isinstance(opts, list) and len(opts) <= G, "bad optimizers")
    for o in opts:
        _json_obj(o, "optimizer")
    opt_of = [
        _int(v, 0, len(opts) - 1, "optimizer index")
        for v in _list(gens.get("optimizer_of"), G, "optimizer_of")
    ]
    key_mode, coef_mode = h.get("keys"), h.get("coefficients")
    kw = {"index-u16": 2, "index-u32": 4, "raw-u64": 8}.get(key_mode)  # type: ignore[arg-type]
    cw = {"f32hi20": 3, "f64": 8}.get(coef_mode)  # type: ignore[arg-type]
    _need(kw is not None and cw is not None, "unknown key or coefficient encoding")
    _need(len(body) - pos == M * (1 + kw + cw), "array sizes differ from the header")
    if key_mode != "raw-u64" and key_fn is None:
        raise SeedLedgerError(
            "this seed file stores derived member keys; pass key_fn "
            "(replay.noise.member_key) to read it"
        )
    # every per-member step below is numpy; Python lists come last, of checked sizes
    signs = np.frombuffer(body, dtype="<i1", count=M, offset=pos)
    _need(bool(np.isin(signs, (-1, 1)).all()), "bad member sign")
    pos += M
    if key_mode == "raw-u64":
        keys = np.frombuffer(body, dtype="<u8", count=M, offset=pos)
    else:
        idx = _unplanes(body[pos : pos + M * kw], kw, M).view(f"<u{kw}").ravel()
        pop_of = np.repeat(np.asarray(pops, dtype=np.int64), pops)
        _need(not bool((idx >= pop_of).any()), "member key index out of range")
        keys = _derive_keys(idx, pops, [rk for _n, rk in seg_of], key_fn)  # type: ignore[arg-type]
    pos += M * kw
    if coef_mode == "f32hi20":
        planes = _unplanes(body[pos : pos + 3 * M], 3, M).astype("<u4")
        bits = (planes[:, 0] | (planes[:, 1] << 8) | (planes[:, 2] << 16)) << 12
        coefs = bits.astype("<u4").view("<f4").astype("<f8")
    else:
        coefs = _unplanes(body[pos : pos + 8 * M], 8, M).view("<f8").ravel()
    kl, cl, sl = keys.tolist(), coefs.tolist(), signs.tolist()
    steps: list[ReplayStep] = []
    sign_lists: list[list[int]] = []
    at = 0
    for gi, n in enumerate(pops):
        run = seg_of[gi][0]
        steps.append(
            ReplayStep(
                run, gi + 1, kl[at : at + n], cl[at : at + n], sigmas[gi], dict(opts[opt_of[gi]])
            )
        )
        sign_lists.append(sl[at : at + n])
        at += n
    return SeedFile(h, steps, sign_lists, fps, lrs, ssteps)


def read_seedfile(path: str | os.PathLike[str], *, key_fn: KeyFn | None = None) -> SeedFile:
    """Parse and check a seed file; any defect raises one-line SeedLedgerError."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE:
            raise _Bad(f"{size} bytes is larger than any seed file ({MAX_FILE})")
        data = p.read_bytes()
        body = _body(data)
        sf = _parse(body, key_fn)
    except _Bad as exc:
        raise SeedLedgerError(f"seed file {p}: {exc}") from None
    except OSError as exc:
        raise SeedLedgerError(f"cannot read seed file {p}: {exc.strerror}") from None
    except (
        ValueError,
        TypeError,
        KeyError,
        IndexError,
        OverflowError,
        RecursionError,
        struct.error,
        zstandard.ZstdError,
        MemoryError,
    ) as exc:
        msg = " ".join(str(exc).split())[:200]
        raise SeedLedgerError(f"seed file {p} is malformed: {type(exc).__name__}: {msg}") from None
    sf.digest = data[-DIGEST_SIZE:].hex()
    return sf


def import_seedfile(
    ledger: Ledger,
    path: str | os.PathLike[str],
    run_name: str | None = None,
    *,
    key_fn: KeyFn | None = None,
    allow_unverified: bool = False,
) -> RunInfo:
    """Import a seed file as ONE new run holding generations 1..g (lineage flattened).

    The file is fully checked first; the run and all its generations then commit in one
    transaction, so a bad file or a name clash writes nothing. Rewards are unknown (NaN).
    A file without a base or generation fingerprint holds nothing a replay could be
    checked against: refused unless `allow_unverified` (the import event then says why).
    """
    sf = read_seedfile(path, key_fn=key_fn)
    missing = missing_fingerprint(sf.base_fingerprint, dict(enumerate(sf.fingerprints, 1)))
    if missing is not None and not allow_unverified:
        raise SeedLedgerError(
            f"seed file {path}: {missing[1]}, so nothing in it can be verified; "
            "pass --allow-unverified to import it anyway"
        )
    unverified = {"not_verified": missing[1]} if missing is not None else {}
    h = sf.header
    name = run_name or h["run"]
    records = []
    for i, s in enumerate(sf.steps):
        members = [
            MemberRecord(j, k, sg, float("nan"), c)
            for j, (k, sg, c) in enumerate(zip(s.keys, sf.signs[i], s.coefficients, strict=True))
        ]
        records.append(
            GenerationRecord(
                index=s.index,
                lr=sf.lrs[i],
                sigma=s.sigma,
                population=len(members),
                optimizer=s.optimizer,
                schedule_step=sf.schedule_steps[i],
                batch_indices=[],
                members=members,
                fingerprint=sf.fingerprints[i],
                extra={"imported_from": sf.digest, "source_run": s.run},
            )
        )
    return ledger.import_run(
        name,
        records,
        base_model=sf.base_model,
        base_revision=sf.base_revision,
        base_fingerprint=sf.base_fingerprint,
        noise_spec=h["noise_spec"],
        dtype_policy=h["dtype_policy"],
        param_selection=h["param_selection"],
        config=h["config"],
        seed=h["seed"],
        run_key=int(h["run_key"]),
        software=h["software"],
        event={
            "file": str(path), "digest": sf.digest, "source": f"{h['run']}@{h['generation']}", **unverified,
        },
    )
