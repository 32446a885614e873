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

The header's `base` may carry `provenance` (what the base model is: source, files'
hashes; engine.runtime.models.provenance) and the header `inputs` (what each session of
the lineage read: ledger.provenance), both optional and ignored by older readers. Modules: this one
writes (`encode`); ledger.seedread reads; ledger.seedformat holds what both share. What a
seed file leaves out (rewards, batches, events) may travel in its companion history file,
tied to its digest (ledger.historyfile).

Why the body is not the hash chain's record bytes (ledger.chain), measured: the chain hashes
a generation's row as stored (raw u64 keys twice, in the row's blob and in each member row;
float64 coefficients; every field named and length-prefixed) with its audit columns
(rewards, components, batch, timings, extra, commit time, samples, row scores). Zstd'd as
here, only replay's fields in those bytes are 2.2-4.4x this body at 30 generations x N=16
and 3.8-9.7x at 500 x 30 (27,988 bytes today), every hashed field (what a check against the
sender's digests needs) 10-21x, and even the chain's framing of the per-generation scalars
alone +11% / +36%. So a seed file keeps its columns, and a generation meets its chain digest
through the history file (format 2, ledger.historychain), whose joined record is encoded as
the ledger's row (ledger.rows) and hashed by the chain's own encoder: one encoder for both.
"""


from __future__ import annotations

import struct
from datetime import UTC, datetime
from typing import Any

from seedledger.ledger import codec, seedarrays
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import GenerationRecord, ReplayStep, RunInfo
from seedledger.ledger.seedarrays import KeyFn
from seedledger.ledger.seedformat import (  # noqa: F401  (the format's names, where callers know them)
    DIGEST_SIZE,
    FORMAT_VERSION,
    MAGIC,
    MAX_BODY,
    MAX_GENERATIONS,
    MAX_HEADER,
    MAX_MEMBERS,
    MAX_POPULATION,
    PLAIN_VERSION,
    PREFIX,
    SEEDS,
    SeedFile,
    SeedMember,
    _digest,
    _ratio_ok,
)
from seedledger.ledger.seedread import OverBudget, read_seedfile  # noqa: F401  (re-exported)


def encode(
    info: RunInfo,
    g: int,
    segments: list[tuple[str, int, int]],
    segment_runs: dict[str, RunInfo],
    records: list[GenerationRecord],
    key_fn: KeyFn | None = None,
    member: SeedMember | None = None,
    base_provenance: dict[str, Any] | None = None,
    inputs: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], bytes]:
    """(header, file bytes) for `info`@`g`: its lineage `segments` (run, first, last) with
    each segment's run, and the `records` of generations 1..g, oldest first; with `member`
    (of generation g + 1) the file names that member instead (format 3).

    With `key_fn` (replay.noise.member_key) keys are stored as indices when every key is
    derived. `base_provenance` (JSON) says what the base model is; `inputs` lists the
    lineage's sessions' input fingerprints (ledger.provenance.exported_inputs). Raises
    SeedLedgerError for a file that `read_seedfile` would refuse.
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
        opt_json = codec.dumps(r.optimizer)
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
            **({"provenance": base_provenance} if base_provenance is not None else {}),
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
    if inputs:
        header["inputs"] = inputs
    if member is not None:
        if member.generation != g + 1:
            raise ValueError(f"member of generation {member.generation} on a lineage of {g}")
        header["member"] = member.to_json()
    hjson = codec.dumps(header).encode()
    body = b"".join([struct.pack("<I", len(hjson)), hjson, arrays])
    data = SEEDS.frame(PLAIN_VERSION if member is None else FORMAT_VERSION, body, 19, _digest)
    zlen = len(data) - PREFIX.size - DIGEST_SIZE
    too_big = _too_big(len(records), max_pop, len(signs), len(hjson), len(body), zlen)
    if too_big:
        raise SeedLedgerError(f"cannot export {run}@{g} as a seed file: {too_big}")
    return header, data


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
