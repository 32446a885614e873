"""What trained a run besides its seeds, as the audit trail holds it: one `inputs` event per
training session (train, resume, fork) with the fingerprints of the files, libraries,
tokenizer and base model it read (engine.runtime.inputs computes them), and an
`inputs-accepted` event when a session went on with inputs that changed. A session's
inputs are in force for the generations it trained: those after its `from_generation`.

Read along a lineage here, so that `show`, `log`, `verify` and seed-file export agree.
Ledgers written before this have no such events: their sessions read "inputs not
recorded" (no schema change, no migration).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from seedledger.ledger.ledger import Ledger

INPUTS_EVENT = "inputs"
ACCEPTED_EVENT = "inputs-accepted"
SHORT = 12  # hash characters in messages
# the compared parts of a record: (section, how a message names one entry), in report order
SECTIONS = (("files", "file"), ("tokenizer", "tokenizer file"), ("chat_template", "chat template"),
            ("libraries", "library"), ("sandbox", "sandbox setting"))
NOT_RECORDED = "inputs not recorded"


@dataclass(frozen=True)
class Change:
    """One input that differs: its section's label, its name, both values (hash or version)."""

    what: str
    name: str
    before: Any
    after: Any

    def line(self) -> str:
        return f"{self.what} {self.name}: {short(self.before)} -> {short(self.after)}"

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "name": self.name, "before": self.before, "after": self.after}


def short(value: Any) -> str:
    """A hash as messages print it (its first SHORT characters); other values as they are."""
    if value is None:
        return "absent"
    text = str(value)
    return text[:SHORT] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text


def digest(inputs: dict[str, Any]) -> str:
    """sha256 over a record's compared parts, canonical JSON: equal inputs, equal digests."""
    parts = {section: inputs.get(section) for section, _ in SECTIONS}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[Change]:
    """The inputs that differ between two records: entries both name with other values (a
    file only one names is a choice of the config, which the run's config records)."""
    out: list[Change] = []
    for section, label in SECTIONS:
        old, new = before.get(section), after.get(section)
        if section == "chat_template":
            if section in before and section in after and old != new:
                out.append(Change(label, "of the model", old, new))
        elif isinstance(old, dict) and isinstance(new, dict):
            out += [Change(label, str(k), old[k], new[k]) for k in old if k in new and old[k] != new[k]]
    return out


def inputs_along(ledger: Ledger, run: str, upto: int | None = None) -> list[tuple[int, str, dict[str, Any]]]:
    """(from_generation, run, payload) of every session recorded along `run`'s lineage whose
    generations reach `upto` at most (None: all), oldest first: a fork's parent's sessions
    before the fork point, then its own."""
    info = ledger.get_run(run)
    out: list[tuple[int, str, dict[str, Any]]] = []
    if info.parent is not None:
        out += inputs_along(ledger, info.parent[0], info.parent[1])
    for e in ledger.events(run, INPUTS_EVENT, imported=True):  # an imported run's sessions came with it
        start = e.payload.get("from_generation")
        if isinstance(start, int) and (upto is None or start < max(upto, 1)):
            out.append((start, run, e.payload))
    return sorted(out, key=lambda item: item[0])  # stable: a run's own sessions in order


EXPORTED = ("session", "digest", *(section for section, _ in SECTIONS))  # what a seed file carries


def exported_inputs(ledger: Ledger, run: str, upto: int) -> list[dict[str, Any]]:
    """The sessions' input records along `run`'s lineage up to `upto`, as a seed file
    carries them (no base model: the file's `base` says it), oldest first."""
    return [{"from_generation": start, **{k: payload.get(k) for k in EXPORTED}}
            for start, _run, payload in inputs_along(ledger, run, upto)]


def in_force(entries: list[tuple[int, str, dict[str, Any]]], g: int) -> dict[str, Any] | None:
    """The payload of the session that trained generation `g` (for g = 0: the first), or
    None when no session along the lineage recorded its inputs."""
    chosen = None
    for start, _run, payload in entries:
        if start < max(g, 1):
            chosen = payload
    return chosen


def base_provenance(ledger: Ledger, run: str) -> dict[str, Any] | None:
    """The base model's provenance as the lineage recorded it: the first session's
    `model`, or the one a seed file brought (`import` event), else None. This ledger's own
    events only: an imported history's could say anything."""
    info = ledger.get_run(run)
    while info.parent is not None:
        info = ledger.get_run(info.parent[0])
    for e in ledger.events(info.name):
        found = e.payload.get("model") if e.kind == INPUTS_EVENT else (
            e.payload.get("base_provenance") if e.kind == "import" else None)
        if isinstance(found, dict):
            return found
    return None


@dataclass
class InputsRange:
    """Generations first..last of a lineage, trained by sessions on the same inputs
    (`digest`; None: sessions that recorded none), and what changed from the range before."""

    first: int
    last: int
    digest: str | None
    changes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "digest": self.digest, "changes": self.changes}


def input_ranges(ledger: Ledger, run: str, upto: int) -> list[InputsRange]:
    """Generations 1..upto of `run`'s lineage by the inputs they were trained on, oldest
    first; neighbouring sessions on equal inputs share a range."""
    entries = inputs_along(ledger, run, upto)
    starts = [(start, payload) for i, (start, _r, payload) in enumerate(entries)
              if i + 1 == len(entries) or entries[i + 1][0] > start]  # a later session from the same point wins
    out: list[InputsRange] = []
    if upto >= 1 and (not starts or starts[0][0] > 0):
        out.append(InputsRange(1, min(upto, starts[0][0]) if starts else upto, None))
    previous: dict[str, Any] | None = None
    for i, (start, payload) in enumerate(starts):
        last = starts[i + 1][0] if i + 1 < len(starts) else upto
        if last <= start:
            continue
        d = payload.get("digest") or digest(payload)
        if out and out[-1].digest == d:
            out[-1].last = last
        else:
            found = [c.line() for c in changes(previous, payload)] if previous is not None else []
            out.append(InputsRange(start + 1, last, d, found or (["other files"] if previous is not None else [])))
        previous = payload
    return out


def verdict(ranges: list[InputsRange]) -> dict[str, Any]:
    """What `verify` says of the inputs: `unchanged`, `changed` (at `generation`, `what`)
    or `not recorded` (`text`: the words)."""
    recorded = [r for r in ranges if r.digest is not None]
    if not recorded:
        return {"status": "not recorded", "text": NOT_RECORDED}
    unrecorded = [r for r in ranges if r.digest is None]
    note = (f" (not recorded for generations {unrecorded[0].first}..{unrecorded[-1].last})"
            if unrecorded else "")
    for r in recorded[1:]:
        if r.changes:
            what = r.changes[0].split(":")[0]
            return {"status": "changed", "generation": r.first, "what": what,
                    "text": f"changed at generation {r.first} ({what}){note}"}
    return {"status": "unchanged", "text": f"unchanged{note}"}
