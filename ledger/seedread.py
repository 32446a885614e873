"""Reading seed files: a hostile file costs bounded memory and time, and any defect is one
line (SeedLedgerError). Sizes are checked from the prefix before decompressing (the
container both seed and history files are: ledger.seedformat.Container), every
header field before any per-member list is built (ledger.checks), the arrays by
ledger.seedarrays. The format: ledger.seedfile."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seedledger.ledger import codec, seedarrays
from seedledger.ledger.checks import (
    finite,
    integer,
    json_object,
    need,
    per_generation,
    text,
    u64_text,
)
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.provenance import SECTIONS, digest
from seedledger.ledger.records import ReplayStep
from seedledger.ledger.seedarrays import KeyFn
from seedledger.ledger.seedformat import (
    DIGEST_SIZE,
    FORMAT_VERSION,
    I32,
    LEDGER_BYTES_PER_MEMBER,
    MAX_BODY,
    MAX_DTYPE_POLICY,
    MAX_FINGERPRINT,
    MAX_GENERATIONS,
    MAX_HEADER,
    MAX_INPUT_SESSIONS,
    MAX_MEMBERS,
    MAX_NAME,
    MAX_NOISE_SPEC,
    MAX_POPULATION,
    SEEDS,
    SeedFile,
    SeedMember,
    _digest,
)


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
    if base.get("provenance") is not None:
        json_object(base["provenance"], "base provenance")
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
    _inputs(h.get("inputs"), G)
    member = _member(h.get("member"), G, version)
    return SeedFile(h, steps, sign_lists, fps, lrs, ssteps, member=member)


def _inputs(entries: Any, G: int) -> None:
    """The header's `inputs` (optional): per session, where it started (0..G, in order), its
    fingerprints as sections of JSON, and a digest that matches them."""
    if entries is None:
        return
    need(isinstance(entries, list) and len(entries) <= MAX_INPUT_SESSIONS, "bad inputs")
    start = 0
    for e in entries:
        json_object(e, "inputs")
        start = integer(e.get("from_generation"), start, G, "inputs from_generation")
        text(e.get("session"), "inputs session", MAX_NAME)
        for section, _ in SECTIONS:
            if section != "chat_template":
                need(isinstance(e.get(section), dict), f"bad inputs {section}")
        need(e.get("digest") == digest(e), "inputs digest differs from the fingerprints it covers")


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
    engine passes engine.rebuild.seedcheck.check_seedfile: known perturbation kinds, rounded
    coefficients, positive σ, well-formed fingerprints, the stored config's task bounds);
    its SeedLedgerError or ValueError becomes the one line. A file declaring more than `max_members` members is refused
    before its arrays are unpacked (`import`'s ledger-growth budget).
    """
    def parse(data: bytes) -> SeedFile:
        sf = parse_seedfile(data, key_fn=key_fn, max_members=max_members)
        if check is not None:
            check(sf)
        return sf

    try:
        return SEEDS.read(path, parse)
    except OverBudget as exc:
        raise SeedLedgerError(
            f"seed file {Path(path)} declares {exc.members:,} members in {exc.generations:,} generations "
            f"(about {exc.members * LEDGER_BYTES_PER_MEMBER / 1e6:,.0f} MB of ledger), more than "
            f"the import limit of {max_members:,}; pass --max-members {exc.members} to import it"
        ) from None


def parse_seedfile(data: bytes, *, key_fn: KeyFn | None = None, max_members: int = MAX_MEMBERS) -> SeedFile:
    """A seed file's bytes, parsed and checked (read_seedfile's work without the file, or
    the one-line messages: it raises Malformed, OverBudget and what a malformed body does);
    `export` reads back what it wrote this way, so its history matches the file exactly."""
    version, body = SEEDS.unframe(data, MAX_BODY, _digest)
    sf = _parse(body, key_fn, version, max_members)
    sf.digest = data[-DIGEST_SIZE:].hex()
    return sf
