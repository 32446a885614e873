"""What trained a run besides its seeds, as the audit trail holds it: one `inputs` event per
training session (train, resume, fork) with the fingerprints of the files, libraries,
tokenizer and base model it read (engine.runtime.setup.inputs computes them), and an
`inputs-accepted` event when a session went on with inputs that changed. A session's
inputs are in force for the generations it trained: those after its `from_generation`;
each of those rows binds the record's digest in the hash chain (ledger.sessions), so a
record edited or deleted in SQL fails `check_chain`.

Read along a lineage here, so that `show`, `log`, `verify` and seed-file export agree.
Digests are always recomputed from a record, never read from its `digest` field. Ledgers
written before sessions recorded inputs read "inputs not recorded"; rows committed before
migration 0007 bind none (`InputsRange.chained`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seedledger.ledger.ledger import Ledger
from seedledger.ledger.sessions import INPUTS_EVENT, SECTIONS, digest, in_force

__all__ = ["ACCEPTED_EVENT", "EXPORTED", "INPUTS_EVENT", "NOT_RECORDED", "SECTIONS", "Change", "InputsRange",
           "base_provenance", "changes", "digest", "exported_inputs", "in_force", "input_ranges", "inputs_along",
           "short", "trained_inputs", "verdict"]

ACCEPTED_EVENT = "inputs-accepted"
SHORT = 12  # hash characters in messages
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
    """(from_generation, run, payload) of every session recorded along `run`'s lineage
    whose generations reach `upto` at most (None: all), oldest first: a fork's parent's
    sessions before the fork point, then its own (an imported run's came with it)."""
    return ledger.inputs_sessions(run, upto)


def trained_inputs(ledger: Ledger, run: str, g: int) -> dict[str, Any] | None:
    """The record of the session that trained `run@g`, checked against the digest the rows
    bind in the hash chain (ChainBroken when a record was edited or deleted outside
    seedledger): what `resume` and `fork` compare their inputs with."""
    ledger.check_inputs(run, g)
    return in_force(inputs_along(ledger, run, g), g)


EXPORTED = ("session", "digest", *(section for section, _ in SECTIONS))  # what a seed file carries


def exported_inputs(ledger: Ledger, run: str, upto: int) -> list[dict[str, Any]]:
    """The sessions' input records along `run`'s lineage up to `upto`, as a seed file
    carries them (no base model: the file's `base` says it), oldest first."""
    return [{"from_generation": start, **{k: payload.get(k) for k in EXPORTED}, "digest": digest(payload)}
            for start, _run, payload in inputs_along(ledger, run, upto)]


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
    (`digest`; None: sessions that recorded none), what changed from the range before, and
    whether every row of the range binds the record in the hash chain (`chained`)."""

    first: int
    last: int
    digest: str | None
    changes: list[str] = field(default_factory=list)
    chained: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"first": self.first, "last": self.last, "digest": self.digest, "changes": self.changes,
                "chained": self.chained}


def input_ranges(ledger: Ledger, run: str, upto: int) -> list[InputsRange]:
    """Generations 1..upto of `run`'s lineage by the inputs they were trained on, oldest
    first; neighbouring sessions on equal inputs share a range."""
    bound = ledger.bound_inputs(run, upto)
    out: list[InputsRange] = []
    for r in _ranges(inputs_along(ledger, run, upto), upto):  # split where rows start binding their record
        for g in range(r.first, r.last + 1):
            chained = r.digest is not None and bound.get(g) == r.digest
            if g == r.first or chained != out[-1].chained:
                out.append(InputsRange(g, g, r.digest, r.changes if g == r.first else [], chained))
            out[-1].last = g
    return out


def _ranges(entries: list[tuple[int, str, dict[str, Any]]], upto: int) -> list[InputsRange]:
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
        d = digest(payload)  # recomputed: a record's own `digest` field is what an edit would change
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
    loose = [r for r in recorded if not r.chained]
    if loose:  # rows committed before migration 0007: their records are outside the chain
        note += f" (outside the hash chain for generations {loose[0].first}..{loose[-1].last})"
    for r in recorded[1:]:
        if r.changes:
            what = r.changes[0].split(":")[0]
            return {"status": "changed", "generation": r.first, "what": what,
                    "text": f"changed at generation {r.first} ({what}){note}"}
    return {"status": "unchanged", "text": f"unchanged{note}"}
