"""Seed files: a run@g with its whole lineage in one small, self-describing file.

Layout (all little-endian; no pickle, nothing executed):

    magic    8 bytes  b"SLSEEDS\\0"
    version  u16      FORMAT_VERSION
    flags    u16      0
    zlen     u64      length of the zstd body that follows
    rawlen   u64      its decompressed length (checked against limits BEFORE decompressing)
    body     zlen bytes, zstd
    digest   32 bytes blake2b-256 of everything before it

Body: u32 header length, header JSON (base model and fingerprint, the exported run's noise
spec, parameter selection and config, lineage segments with their run keys and their own
perturbation, per-generation σ / lr / optimizer / schedule step / fingerprint), then the
member arrays (signs, keys, coefficients: ledger.seedarrays).

Versions: 3 adds an optional `member` entry: the file then names one member M of
generation G (`RUN@G#M`, the weights that member was evaluated with), its lineage covers
1..G-1 and the entry says the rest (generation, index, key, sign, σ, the run and the
perturbation kind of generation G). A file without a member is written as 2, so older
readers still take every run's export. 2 gives every segment its `noise_spec` and
`param_selection`, and a lineage is split into segments wherever the perturbation changes
(a low-rank run forked to full rank), so every step replays with its own kind. 1 (still
read) had one perturbation for the whole file: its segments take the file's.

A hostile file cannot blow up memory or time. A real seed file is kilobytes (27.7 KB for
500 generations x N=30), so the limits are generous for real runs and tight for bombs:
at most 65,536 members per generation, 2,097,152 in all, 1,048,576 generations; the body
may be at most 1024x its compressed size (above an 8 MB floor) and ~52 MB in all, checked
before decompressing, and the decompressor never reads past the declared size. Every
header field is checked (types, ranges, lengths that the SQL columns hold), and the
declared counts against the actual byte count, before any per-member list is built;
per-member checks and key derivation are vectorized with numpy. `encode` refuses to make
a file its reader would refuse. This module knows no Ledger: ledger.seedio exports a
run's lineage as a file and imports a file as a run.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import zstandard

from seedledger.ledger import codec, seedarrays
from seedledger.ledger.checks import (
    Malformed,
    finite,
    integer,
    json_object,
    need,
    per_generation,
    text,
    u64_text,
)
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import GenerationRecord, ReplayStep, RunInfo
from seedledger.ledger.seedarrays import KeyFn

MAGIC = b"SLSEEDS\x00"
FORMAT_VERSION = 3  # 3: an optional `member` entry (RUN@G#M); written only when there is one
PLAIN_VERSION = 2  # a file without a member: every segment names its own perturbation
READABLE_VERSIONS = (1, 2, 3)  # 1: one perturbation for the whole file
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
MAX_FINGERPRINT = 64
MAX_NOISE_SPEC = 32
MAX_DTYPE_POLICY = 64
LEDGER_BYTES_PER_MEMBER = 70  # what an imported member costs a SQLite ledger, measured

@dataclass(frozen=True)
class SeedMember:
    """Member `index` of generation `generation`, which a version-3 file names on top of
    its lineage (1..generation-1): `RUN@G-1` plus sign·σ·ε(key) in the perturbation kind
    (`noise_spec`, `param_selection`) of the run that recorded generation G (`run`)."""

    generation: int
    index: int
    key: int
    sign: int
    sigma: float
    run: str
    noise_spec: str
    param_selection: str

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "index": self.index, "key": str(self.key),
                "sign": self.sign, "sigma": self.sigma, "run": self.run,
                "noise_spec": self.noise_spec, "param_selection": self.param_selection}

    def step(self) -> ReplayStep:
        """Generation G's step as `replay.rebuild.apply_member` takes it: this member's key,
        σ and perturbation kind (the coefficient and optimizer are the member's to set)."""
        return ReplayStep(self.run, self.generation, [self.key], [0.0], self.sigma, {"name": "sgd"},
                          noise_spec=self.noise_spec, param_selection=self.param_selection)


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
    member: SeedMember | None = None  # version 3: the file names this member of generation+1

    @property
    def generation(self) -> int:
        """The last generation of the lineage (a member file: the member's parent)."""
        return self.header["generation"]

    @property
    def ref(self) -> str:
        """What the file names: `RUN@G`, or `RUN@G#M` for a member."""
        if self.member is None:
            return f"{self.header['run']}@{self.generation}"
        return f"{self.header['run']}@{self.member.generation}#{self.member.index}"

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


def encode(
    info: RunInfo,
    g: int,
    segments: list[tuple[str, int, int]],
    segment_runs: dict[str, RunInfo],
    records: list[GenerationRecord],
    key_fn: KeyFn | None = None,
    member: SeedMember | None = None,
) -> tuple[dict[str, Any], bytes]:
    """(header, file bytes) for `info`@`g`: its lineage `segments` (run, first, last) with
    each segment's run, and the `records` of generations 1..g, oldest first; with `member`
    (of generation g + 1) the file names that member instead (format 3).

    With `key_fn` (replay.noise.member_key) keys are stored as indices when every key is
    derived. Raises SeedLedgerError for a file that `read_seedfile` would refuse.
    """
    seg_key = {name: ri.run_key for name, ri in segment_runs.items()}
    run = info.name
    kinds = _kind_segments(segments, segment_runs, records)
    steps = [
        ReplayStep(name, r.index, [m.key for m in r.members], [m.coefficient for m in r.members],
                   r.sigma, r.optimizer)
        for (name, a, b, _spec, _sel) in kinds
        for r in records[a - 1 : b]
    ]
    optimizers: list[dict[str, Any]] = []
    opt_of: list[int] = []
    seen: dict[str, int] = {}
    for r in records:
        opt_json = json.dumps(r.optimizer, sort_keys=True)
        if opt_json not in seen:
            seen[opt_json] = len(optimizers)
            optimizers.append(r.optimizer)
        opt_of.append(seen[opt_json])
    signs = [m.sign for r in records for m in r.members]
    key_mode, coef_mode, arrays = seedarrays.pack(steps, signs, seg_key, key_fn)
    max_pop = max((r.population for r in records), default=0)
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
                "noise_spec": spec,
                "param_selection": selection,
            }
            for n, a, b, spec, selection in kinds
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
    if member is not None:
        if member.generation != g + 1:
            raise ValueError(f"member of generation {member.generation} on a lineage of {g}")
        header["member"] = member.to_json()
    hjson = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = b"".join([struct.pack("<I", len(hjson)), hjson, arrays])
    z = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(body)
    too_big = _too_big(len(records), max_pop, len(signs), len(hjson), len(body), len(z))
    if too_big:
        raise SeedLedgerError(f"cannot export {run}@{g} as a seed file: {too_big}")
    version = PLAIN_VERSION if member is None else FORMAT_VERSION
    head = PREFIX.pack(MAGIC, version, 0, len(z), len(body))
    blob = head + z
    return header, blob + _digest(blob)


def _kind_segments(
    segments: list[tuple[str, int, int]], runs: dict[str, RunInfo], records: list[GenerationRecord]
) -> list[tuple[str, int, int, str, str]]:
    """The lineage's segments split where the perturbation changes: (run, first, last,
    noise_spec, param_selection). A generation's kind is its run's unless it records its
    own (an imported lineage), so one run may span several segments."""
    out: list[tuple[str, int, int, str, str]] = []
    for name, a, b in segments:
        for r in records[a - 1 : b]:
            spec = r.noise_spec if r.noise_spec is not None else runs[name].noise_spec
            sel = r.param_selection if r.param_selection is not None else runs[name].param_selection
            if out and out[-1][0] == name and out[-1][3:] == (spec, sel):
                out[-1] = (*out[-1][:2], r.index, spec, sel)
            else:
                out.append((name, r.index, r.index, spec, sel))
    return out


# -- reading -------------------------------------------------------------------------------


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


def _body(data: bytes) -> tuple[int, bytes]:
    need(len(data) >= PREFIX.size + DIGEST_SIZE, "too short to be a seed file")
    magic, version, flags, zlen, rawlen = PREFIX.unpack_from(data)
    need(magic == MAGIC, "not a seedledger seed file (bad magic)")
    if version > FORMAT_VERSION:
        raise Malformed(f"format {version} is newer than this seedledger reads ({FORMAT_VERSION})")
    need(version in READABLE_VERSIONS and flags == 0, f"unknown format {version}/{flags}")
    need(zlen == len(data) - PREFIX.size - DIGEST_SIZE, "truncated or has trailing bytes")
    need(4 <= rawlen <= MAX_BODY, f"declared body size {rawlen} is out of bounds")
    need(
        _ratio_ok(rawlen, zlen),
        f"declared body size {rawlen} is out of bounds for {zlen} compressed bytes",
    )
    need(_digest(memoryview(data)[:-DIGEST_SIZE]) == data[-DIGEST_SIZE:], "checksum mismatch")
    z = memoryview(data)[PREFIX.size : -DIGEST_SIZE]
    framed = zstandard.frame_content_size(z)
    need(framed in (-1, rawlen), "body length differs from the declared one")
    # streaming, so the decompressor never produces more than rawlen + 1 bytes
    body = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(z)).read(rawlen + 1)
    need(len(body) == rawlen, "body length differs from the declared one")
    return version, body


def _header(body: bytes) -> tuple[dict[str, Any], int]:
    (hlen,) = struct.unpack_from("<I", body)
    need(hlen <= min(MAX_HEADER, len(body) - 4), "header length out of bounds")
    h = json.loads(body[4 : 4 + hlen].decode("utf-8"))
    need(isinstance(h, dict) and h.get("format") == "seedledger-seeds", "bad header")
    return h, 4 + hlen


def _parse(body: bytes, key_fn: KeyFn | None, version: int = FORMAT_VERSION,
           max_members: int = MAX_MEMBERS) -> SeedFile:
    h, pos = _header(body)
    text(h.get("run"), "run name", MAX_NAME)
    G = integer(h.get("generation"), 0, MAX_GENERATIONS, "generation")
    base = h.get("base")
    need(isinstance(base, dict), "bad base")
    text(base.get("model"), "base model")
    text(base.get("revision"), "base revision", optional=True)
    text(base.get("fingerprint"), "base fingerprint", MAX_FINGERPRINT, optional=True)
    spec = text(h.get("noise_spec"), "noise_spec", MAX_NOISE_SPEC)
    text(h.get("dtype_policy"), "dtype_policy", MAX_DTYPE_POLICY)
    selection = text(h.get("param_selection"), "param_selection")
    json_object(h.get("config"), "config")
    json_object(h.get("software"), "software")
    if h.get("seed") is not None:
        integer(h.get("seed"), codec.I64_MIN, codec.I64_MAX, "seed")
    u64_text(h.get("run_key"), "run key")
    final = text(h.get("final_fingerprint"), "final fingerprint", MAX_FINGERPRINT, optional=True)
    segs = h.get("segments")
    need(isinstance(segs, list) and len(segs) <= G + 1, "bad segments")
    seg_of: list[tuple[str, int, str, str]] = []  # per generation: (run, run_key, spec, selection)
    nxt = 1
    for s in segs:
        need(isinstance(s, dict), "bad segment")
        name = text(s.get("run"), "segment run", MAX_NAME)
        first = integer(s.get("first"), nxt, nxt, "segment start")
        last = integer(s.get("last"), first, G, "segment end")
        if version == 1:  # one perturbation for the whole file
            need(s.get("noise_spec") == spec, "a segment's noise spec differs from the file's")
            seg_spec, seg_sel = spec, selection
        else:
            seg_spec = text(s.get("noise_spec"), "segment noise_spec", MAX_NOISE_SPEC)
            seg_sel = text(s.get("param_selection"), "segment param_selection")
        rk = u64_text(s.get("run_key"), "segment run key")
        seg_of += [(name, rk, seg_spec, seg_sel)] * (last - first + 1)
        nxt = last + 1
    need(nxt == G + 1, "segments do not cover the generations")
    gens = h.get("generations")
    need(isinstance(gens, dict), "bad generations")
    pops = [
        integer(p, 0, MAX_POPULATION, f"population (at most {MAX_POPULATION})")
        for p in per_generation(gens.get("population"), G, "population")
    ]
    M = sum(pops)
    need(M <= MAX_MEMBERS, f"declares {M} members, more than {MAX_MEMBERS}")
    if M > max_members:
        raise OverBudget(M, G)
    sigmas = [finite(v, "sigma") for v in per_generation(gens.get("sigma"), G, "sigma")]
    lrs = [finite(v, "lr") for v in per_generation(gens.get("lr"), G, "lr")]
    ssteps = [
        integer(v, -I32, I32 - 1, "schedule step")
        for v in per_generation(gens.get("schedule_step"), G, "schedule_step")
    ]
    fps = [
        text(v, "fingerprint", MAX_FINGERPRINT, optional=True)
        for v in per_generation(gens.get("fingerprint"), G, "fingerprint")
    ]
    need(final == (fps[-1] if fps else None), "final fingerprint differs from the last one")
    opts = gens.get("optimizers")
    need(isinstance(opts, list) and len(opts) <= G, "bad optimizers")
    for o in opts:
        json_object(o, "optimizer")
    opt_of = [
        integer(v, 0, len(opts) - 1, "optimizer index")
        for v in per_generation(gens.get("optimizer_of"), G, "optimizer_of")
    ]
    key_mode, coef_mode = h.get("keys"), h.get("coefficients")
    kw = seedarrays.KEY_WIDTH.get(key_mode)  # type: ignore[arg-type]
    cw = seedarrays.COEFFICIENT_WIDTH.get(coef_mode)  # type: ignore[arg-type]
    need(kw is not None and cw is not None, "unknown key or coefficient encoding")
    need(len(body) - pos == M * (1 + kw + cw), "array sizes differ from the header")
    if key_mode != "raw-u64" and key_fn is None:
        raise SeedLedgerError(
            "this seed file stores derived member keys; pass key_fn "
            "(replay.noise.member_key) to read it"
        )
    signs, keys, coefs = seedarrays.unpack(
        body, pos, pops, [seg[1] for seg in seg_of], key_mode, coef_mode, key_fn  # type: ignore[arg-type]
    )
    # Python lists only now, of checked sizes
    kl, cl, sl = keys.tolist(), coefs.tolist(), signs.tolist()
    steps: list[ReplayStep] = []
    sign_lists: list[list[int]] = []
    at = 0
    for gi, n in enumerate(pops):
        run, _rk, seg_spec, seg_sel = seg_of[gi]
        steps.append(  # each step stamped with its own segment's perturbation
            ReplayStep(
                run, gi + 1, kl[at : at + n], cl[at : at + n], sigmas[gi], dict(opts[opt_of[gi]]),
                noise_spec=seg_spec, param_selection=seg_sel,
            )
        )
        sign_lists.append(sl[at : at + n])
        at += n
    member = _member(h.get("member"), G, version)
    return SeedFile(h, steps, sign_lists, fps, lrs, ssteps, member=member)


def _member(m: Any, G: int, version: int) -> SeedMember | None:
    """The header's `member` entry (format 3), checked; None when the file names none."""
    if m is None:
        return None
    need(version >= 3, f"a member entry needs format 3, this file is format {version}")
    need(isinstance(m, dict), "bad member")
    need(set(m) == {"generation", "index", "key", "sign", "sigma", "run", "noise_spec", "param_selection"},
         "bad member (unknown or missing fields)")
    return SeedMember(
        generation=integer(m["generation"], G + 1, G + 1, f"member generation (the lineage ends at {G})"),
        index=integer(m["index"], 0, MAX_POPULATION - 1, "member index"),
        key=u64_text(m["key"], "member key"),
        sign=integer(m["sign"], -1, 1, "member sign"),
        sigma=finite(m["sigma"], "member sigma"),
        run=text(m["run"], "member run", MAX_NAME),
        noise_spec=text(m["noise_spec"], "member noise_spec", MAX_NOISE_SPEC),
        param_selection=text(m["param_selection"], "member param_selection"),
    )


class OverBudget(Exception):
    """A file declaring more members than the caller's budget (checked before unpacking)."""

    def __init__(self, members: int, generations: int):
        super().__init__(f"{members} members")
        self.members, self.generations = members, generations


def read_seedfile(
    path: str | os.PathLike[str], *, key_fn: KeyFn | None = None,
    check: Callable[[SeedFile], None] | None = None, max_members: int = MAX_MEMBERS,
) -> SeedFile:
    """Parse and check a seed file; any defect raises one-line SeedLedgerError.

    `check(seedfile)` may refuse what the format allows but a replay cannot apply (the
    engine passes replay.seedcheck.check_seedfile: known perturbation kinds, rounded
    coefficients, positive σ, well-formed fingerprints); its SeedLedgerError or ValueError
    becomes the one line. A file declaring more than `max_members` members is refused
    before its arrays are unpacked (`import`'s ledger-growth budget).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > MAX_FILE:
            raise Malformed(f"{size} bytes is larger than any seed file ({MAX_FILE})")
        data = p.read_bytes()
        version, body = _body(data)
        sf = _parse(body, key_fn, version, max_members)
        if check is not None:
            check(sf)
    except OverBudget as exc:
        raise SeedLedgerError(
            f"seed file {p} declares {exc.members:,} members in {exc.generations:,} generations "
            f"(about {exc.members * LEDGER_BYTES_PER_MEMBER / 1e6:,.0f} MB of ledger), more than "
            f"the import limit of {max_members:,}; pass --max-members {exc.members} to import it"
        ) from None
    except Malformed as exc:
        raise SeedLedgerError(f"seed file {p}: {exc}") from None
    except SeedLedgerError as exc:
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
