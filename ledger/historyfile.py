"""History files: a seed file's audit trail, in a companion file beside it.

A seed file holds what replay needs (keys, coefficients, fingerprints) and stays
kilobytes; its receiver would see rewards as unknown and no events. `export
--with-history` also writes `FILE.history` (the seed file's name plus `.history`, so
every seed file has exactly one companion, listed beside it): per generation the members'
rewards and reward components, the batch (dataset rows), the timings, the policy's
`extra` and when it committed; and the lineage's events (sessions' `inputs`,
evaluations, resumes, leases, ...) with their times. `import` restores them
(ledger.seedio), so `log`, `show`, `plot` and `verify` read on the receiving side as
on the sender's. Members' stored samples (model outputs) do not travel.

Layout (little-endian; no pickle, nothing executed; the container of a seed file,
ledger.seedformat.Container, with its own magic and seal):

    magic    8 bytes  b"SLHIST\\0\\0"
    version  u16      VERSION
    flags    u16      0
    zlen     u64      length of the zstd body that follows
    rawlen   u64      its decompressed length (checked against limits BEFORE decompressing)
    body     zlen bytes: zstd of UTF-8 JSON
    digest   32 bytes sha256 over the seed file's digest, then everything before it

The digest ties a history to one seed file: paired with another, its checksum fails.
Read only beside its seed file (`read_history(path, seedfile)`), so every bound is the seed
file's: the body at most `FLOOR` + `BYTES_PER_MEMBER` per member + `BYTES_PER_GENERATION`
per generation of the seed file (never above `MAX_BODY`) and `MAX_RATIO` x its compressed
size above `RATIO_FLOOR`, checked from the prefix and the frame before decompressing,
streamed so no more than the declared size is ever produced. Every field is type- and
range-checked, and the history must match the seed file: its run and generation, one
entry per generation with one reward per member, and the sessions' inputs its header
lists. Any defect: one line (SeedLedgerError). `encode` refuses to write what the reader
would refuse. This module knows no Ledger.

Versions: 2 adds `chain`, per generation its place in the sender's hash chain, which the
reader checks the joined records against (ledger.historychain); 1 (none) is still read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from seedledger.ledger import codec, historychain
from seedledger.ledger.checks import Malformed, finite, integer, json_object, need, text
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.historychain import Link
from seedledger.ledger.provenance import EXPORTED, INPUTS_EVENT
from seedledger.ledger.records import EventInfo, GenerationRecord, MemberRecord
from seedledger.ledger.rows import utc
from seedledger.ledger.seedformat import DIGEST_SIZE, MAX_NAME, PREFIX, Container, Seal, SeedFile, _ratio_ok

MAGIC = b"SLHIST\x00\x00"
VERSION = 2  # 2: a `chain` list (ledger.historychain); 1 (still read) has none
FORMAT = "seedledger-history"
SUFFIX = ".history"
FLOOR = 16 << 20  # events, inputs records: a real run's are kilobytes
BYTES_PER_MEMBER = 512  # a reward and its components (~80 bytes), a share of `extra`
BYTES_PER_GENERATION = 64 << 10  # a batch of 4,096 rows, timings, `extra`
MAX_BODY = 128 << 20
MAX_FILE = MAX_BODY + (1 << 20)
LEVEL = 10  # zstd: 5% larger than level 19 on a 500-generation history, 15x faster
MAX_BATCH = 1 << 16  # dataset rows per generation
MAX_ENTRIES = 256  # timings, or reward components of a member
MAX_EVENTS = 1 << 20
MAX_KIND = 64  # events.kind
MAX_TIME = 64
IMPORT_MARKS = ("imported_from", "source_run")  # what ledger.seedio's import adds to a generation's `extra`
HISTORY = Container("history file", MAGIC, (1, VERSION), 2, MAX_FILE, " (damaged, or written for another seed file)")


@dataclass(frozen=True)
class GenerationHistory:
    """What a generation's row holds besides replay's data: rewards (NaN: unknown) and
    components per member, the batch, timings, the policy's `extra`, the commit time."""

    index: int
    rewards: list[float]
    components: list[dict[str, float | None]]
    batch_indices: list[int]
    timings: dict[str, float]
    extra: dict[str, Any]
    committed_at: str | None

    @classmethod
    def of(cls, r: GenerationRecord) -> GenerationHistory:
        """The history of record `r`, without what an import added to its `extra` (the next
        import adds its own), so that an imported history exports again at its size."""
        extra = {k: v for k, v in (r.extra or {}).items() if k not in IMPORT_MARKS}
        return cls(r.index, [m.reward for m in r.members], [dict(m.components or {}) for m in r.members],
                   list(r.batch_indices or []), dict(r.timings or {}), extra,
                   r.committed_at.isoformat() if r.committed_at else None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class HistoryEvent:
    """One event of the lineage's audit trail, as the sender's ledger held it."""

    kind: str
    at: str
    payload: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class History:
    """A parsed history file: one entry per generation of its seed file, oldest first, and
    the lineage's events in the order they happened."""

    generations: list[GenerationHistory]
    events: list[HistoryEvent]
    digest: str = ""
    chain: list[Link | None] | None = None  # per generation, what its sender's row digest covers (v2)
    checked: int = 0  # generations whose records hash to their sender's digests (read_history)
    head: str | None = None  # the last generation's digest in its sender's chain, when checked


def companion(seedfile: str | os.PathLike[str]) -> Path:
    """The history file that goes with `seedfile`: its name plus `.history`."""
    return Path(os.fspath(seedfile) + SUFFIX)


def limit(sf: SeedFile) -> int:
    """The largest body a history of `sf` may declare."""
    members = sum(len(s.keys) for s in sf.steps)
    return min(MAX_BODY, FLOOR + BYTES_PER_MEMBER * members + BYTES_PER_GENERATION * len(sf.steps))


def _checksum(seed_digest: bytes, data: bytes | memoryview) -> bytes:
    return hashlib.sha256(seed_digest + bytes(data)).digest()


def encode(sf: SeedFile, records: list[GenerationRecord], events: list[EventInfo],
           stored: list[dict[str, Any]] | None = None) -> bytes:
    """The history file of seed file `sf` (as written: its digest set) from the lineage's
    `records` (generations 1..G) and `events`, oldest first, and with `stored`
    (`Ledger.chain_links`) the generations' places in the sender's chain where their
    records give them back (ledger.historychain), unless that would not fit `limit(sf)`.
    Raises SeedLedgerError for a history `read_history` would refuse."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "run": sf.header["run"],
        "generation": sf.generation,
        "seed_file": sf.digest,
        "generations": [GenerationHistory.of(r).to_json() for r in records],
        "events": [HistoryEvent(e.kind, (e.sent_at or e.at).isoformat(), e.payload).to_json() for e in events],
    }
    if stored is not None:
        doc["chain"] = [e and e.to_json() for e in historychain.links(records, stored, IMPORT_MARKS)]
    try:
        parsed = _parse(doc, sf, VERSION)
        if parsed.chain is not None:  # an entry the receiver could not recompute is not sent
            for i in historychain.unmatched(join(sf, parsed, marks=False), parsed.chain):
                doc["chain"][i] = None
        body = codec.dumps(doc).encode()
        if len(body) > limit(sf) and "chain" in doc:  # the history fits as it did before format 2
            body = codec.dumps({k: v for k, v in doc.items() if k != "chain"}).encode()
    except (Malformed, ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise SeedLedgerError(f"cannot export the history of {sf.ref}: {exc}") from None
    data = HISTORY.frame(VERSION, body, LEVEL, _seal(sf))
    if len(body) > limit(sf) or not _ratio_ok(len(body), len(data) - PREFIX.size - DIGEST_SIZE):
        raise SeedLedgerError(f"cannot export the history of {sf.ref}: {len(body):,} bytes is more than "
                              f"the {limit(sf):,} a history of its {sf.generation} generations may hold")
    return data


def join(sf: SeedFile, past: History | None, marks: bool = True) -> list[GenerationRecord]:
    """The generation records seed file `sf` holds, with the audit of its history `past`
    (None: rewards unknown, NaN): the one place a generation's two halves meet again
    (`GenerationHistory.of` splits them; records.SEED_FILE and HISTORY_FILE name each
    half's fields). Each record names the file it came from (IMPORT_MARKS, unless not
    `marks`: the record as its sender's row held it, ledger.historychain); a generation
    whose segment used another perturbation than the file's own records it (a fork that
    changed kind), so replay applies each as it was trained."""
    own = (sf.noise_spec, sf.header["param_selection"])
    out: list[GenerationRecord] = []
    for i, s in enumerate(sf.steps):
        was = past.generations[i] if past is not None else None
        members = [MemberRecord(j, k, sign, was.rewards[j] if was else math.nan, c,
                                components=was.components[j] if was else {})
                   for j, (k, sign, c) in enumerate(zip(s.keys, sf.signs[i], s.coefficients, strict=True))]
        kind = {} if (s.noise_spec, s.param_selection) == own else {
            "noise_spec": s.noise_spec, "param_selection": s.param_selection}
        out.append(GenerationRecord(
            index=s.index, lr=sf.lrs[i], sigma=s.sigma, population=len(members), optimizer=s.optimizer,
            schedule_step=sf.schedule_steps[i], batch_indices=was.batch_indices if was else [],
            members=members, fingerprint=sf.fingerprints[i], timings=was.timings if was else {},
            extra={**(was.extra if was else {}), **(dict(zip(IMPORT_MARKS, (sf.digest, s.run), strict=True))
                                                    if marks else {})},
            committed_at=datetime.fromisoformat(was.committed_at) if was and was.committed_at else None, **kind))
    return out


def _seal(sf: SeedFile) -> Seal:
    """The history's digest: over its seed file's digest, then the history's bytes."""
    return lambda data: _checksum(bytes.fromhex(sf.digest), data)


def _parse(doc: Any, sf: SeedFile, version: int) -> History:
    """The checked history of seed file `sf` from its JSON document (format `version`)."""
    need(isinstance(doc, dict) and doc.get("format") == FORMAT, "bad header")
    keys = {"format", "run", "generation", "seed_file", "generations", "events"} | ({"chain"} & set(doc))
    need(set(doc) == keys and (version >= 2 or "chain" not in doc), "bad header (unknown or missing fields)")
    run, g = text(doc["run"], "run", MAX_NAME), integer(doc["generation"], 0, codec.I64_MAX, "generation")
    need(run == sf.header["run"], f"a history of run {run!r}, the seed file's is {sf.header['run']!r}")
    need(g == sf.generation, f"a history of {g} generations, the seed file holds {sf.generation}")
    need(doc["seed_file"] == sf.digest, "written for another seed file")
    gens = doc["generations"]
    need(isinstance(gens, list) and len(gens) == len(sf.steps),
         f"generations must list the seed file's {len(sf.steps)}")
    out = [_generation(g, i + 1, len(step.keys)) for i, (g, step) in enumerate(zip(gens, sf.steps, strict=True))]
    events = doc["events"]
    need(isinstance(events, list) and len(events) <= MAX_EVENTS, "bad events")
    parsed = [_event(e) for e in events]
    sessions = [{"from_generation": e.payload.get("from_generation"), **{k: e.payload.get(k) for k in EXPORTED}}
                for e in parsed if e.kind == INPUTS_EVENT]
    need(sessions == sf.inputs, "its sessions' inputs differ from those the seed file lists")
    chain = historychain.parse(doc["chain"], len(sf.steps)) if "chain" in doc else None
    return History(out, parsed, chain=chain)


def _generation(g: Any, index: int, population: int) -> GenerationHistory:
    need(isinstance(g, dict) and set(g) == {f.name for f in fields(GenerationHistory)}, f"bad generation {index}")
    integer(g["index"], index, index, f"generation index (expected {index})")
    rewards, components = g["rewards"], g["components"]
    need(isinstance(rewards, list) and len(rewards) == population,
         f"generation {index} must list {population} rewards, one per member of the seed file")
    need(isinstance(components, list) and len(components) == population, f"bad components of generation {index}")
    batch, timings = g["batch_indices"], g["timings"]
    need(isinstance(batch, list) and len(batch) <= MAX_BATCH, f"bad batch of generation {index}")
    need(isinstance(timings, dict) and len(timings) <= MAX_ENTRIES, f"bad timings of generation {index}")
    return GenerationHistory(
        index=index,
        rewards=[_reward(r, f"reward of generation {index}") for r in rewards],
        components=[_components(c, index) for c in components],
        batch_indices=[integer(b, 0, codec.I64_MAX, f"batch row of generation {index}") for b in batch],
        timings={
            text(k, "timing name", MAX_NAME): finite(v, f"timing of generation {index}") for k, v in timings.items()
        },
        extra=json_object(g["extra"], f"extra of generation {index}"),
        committed_at=_time(g["committed_at"], f"commit time of generation {index}", optional=True),
    )


def _reward(v: Any, what: str) -> float:
    """A reward: finite, or NaN (unknown)."""
    need(isinstance(v, float | int) and not isinstance(v, bool), f"bad {what}")
    x = float(v)
    need(not math.isinf(x), f"bad {what} (infinite)")
    return x


def _components(c: Any, index: int) -> dict[str, float | None]:
    need(isinstance(c, dict) and len(c) <= MAX_ENTRIES, f"bad components of generation {index}")
    return {text(k, "component name", MAX_NAME): None if v is None else _reward(v, f"component of generation {index}")
            for k, v in c.items()}


def _event(e: Any) -> HistoryEvent:
    need(isinstance(e, dict) and set(e) == {"kind", "at", "payload"}, "bad event")
    kind = text(e["kind"], "event kind", MAX_KIND)
    need(bool(kind), "bad event kind")
    return HistoryEvent(kind, _time(e["at"], "event time"), json_object(e["payload"], f"{kind} event"))


def _time(v: Any, what: str, optional: bool = False) -> str | None:
    if optional and v is None:
        return None
    text(v, what, MAX_TIME)
    try:
        utc(datetime.fromisoformat(v))  # as the ledger stores it: in UTC, within years 1..9999
    except ValueError:
        raise Malformed(f"bad {what}") from None
    except OverflowError:  # 9999-12-31T23:59:59-14:00 is past year 9999 in UTC
        raise Malformed(f"bad {what} (out of range in UTC)") from None
    return v


def read_history(path: str | os.PathLike[str], sf: SeedFile) -> History:
    """Parse and check the history file of seed file `sf` (read, its digest set); any
    defect raises a one-line SeedLedgerError."""
    def parse(data: bytes) -> History:
        bounds = f" for a seed file of {sf.generation} generations (at most {limit(sf):,})"
        version, body = HISTORY.unframe(data, limit(sf), _seal(sf), bounds)
        history = _parse(json.loads(body.decode("utf-8")), sf, version)
        history.digest = data[-DIGEST_SIZE:].hex()
        if history.chain is not None:
            history.checked, history.head = historychain.check(
                join(sf, history, marks=False), history.chain, [s.run for s in sf.steps])
        return history

    return HISTORY.read(path, parse)
