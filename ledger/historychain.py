"""A history file's generations, checked against its sender's hash chain (history format 2).

A generation's row is its record (the seed file's half and the history's, joined by
ledger.historyfile.join) plus what only the ledger holds; the chain hashes that row
(ledger.chain). So each generation the sender trained carries, in the history's `chain`
list, its row's digest, the digest it links to, and the two stored columns the digest
covers that neither file holds (the inputs digest the row binds, the row-scores blob as
stored). The receiver encodes the joined record as the ledger's row (ledger.rows) and
hashes it as the chain does: a generation edited after export, or a history that is not
the sender's rows, no longer gives its digest, and the last one is what the sender's
`verify --quick` prints for the exported generation. A generation carries none (null)
when a member kept samples (model outputs do not travel) or when it was itself imported
(its row binds the marks the next import replaces); a v1 history carries none at all.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from seedledger.ledger import chain, rows
from seedledger.ledger.checks import Malformed, need, text
from seedledger.ledger.records import GenerationRecord

FIELDS = ("digest", "link", "inputs_digest", "row_scores")


@dataclass(frozen=True)
class Link:
    """What one generation's row digest covers beyond its record, and the digest."""

    digest: str
    link: str  # the digest the row is chained to (the previous generation's, or its run's genesis)
    inputs_digest: str | None
    row_scores: bytes | None

    def to_json(self) -> dict[str, Any]:
        scores = None if self.row_scores is None else base64.b64encode(self.row_scores).decode()
        return {"digest": self.digest, "link": self.link, "inputs_digest": self.inputs_digest, "row_scores": scores}


def links(records: list[GenerationRecord], stored: list[dict[str, Any]], marks: tuple[str, ...]) -> list[Link | None]:
    """Per record, its Link from the sender's rows (`Ledger.chain_links`); None where a
    member kept samples, the row has no digest, or the record carries an import's `marks`."""
    return [None if s["samples"] or not s["digest"] or any(k in r.extra for k in marks)
            else Link(s["digest"], s["link"], s["inputs_digest"], s["row_scores"])
            for r, s in zip(records, stored, strict=True)]


def _hex(v: Any, what: str) -> str:
    need(isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v), f"bad {what}")
    return v


def parse(v: Any, count: int) -> list[Link | None]:
    """The history's `chain` list, checked: one entry (or null) per generation."""
    need(isinstance(v, list) and len(v) == count, f"chain must list the seed file's {count} generations")
    out: list[Link | None] = []
    for i, e in enumerate(v, 1):
        if e is None:
            out.append(None)
            continue
        need(isinstance(e, dict) and set(e) == set(FIELDS), f"bad chain entry of generation {i}")
        scores = text(e["row_scores"], f"row scores of generation {i}", 1 << 62, optional=True)
        try:
            blob = None if scores is None else base64.b64decode(scores, validate=True)
        except (binascii.Error, ValueError):
            raise Malformed(f"bad row scores of generation {i}") from None
        inputs = text(e["inputs_digest"], f"inputs digest of generation {i}", 64, optional=True)
        out.append(Link(_hex(e["digest"], f"digest of generation {i}"),
                        _hex(e["link"], f"chain link of generation {i}"), inputs, blob))
    return out


def digest(record: GenerationRecord, link: Link) -> str:
    """The chain digest of the row `record` was committed as, with `link`'s stored columns
    (a trained row records no perturbation of its own: that is an import's)."""
    row = rows.generation_row(0, record, record.committed_at) | {
        "noise_spec": None, "param_selection": None, "inputs_digest": link.inputs_digest,
        "row_scores": link.row_scores}
    return chain.generation_digest(link.link, row, rows.member_rows(0, record))


def unmatched(records: list[GenerationRecord], entries: list[Link | None]) -> list[int]:
    """Positions of the entries whose record does not hash to their digest."""
    return [i for i, (r, e) in enumerate(zip(records, entries, strict=True))
            if e is not None and digest(r, e) != e.digest]


def check(records: list[GenerationRecord], entries: list[Link | None], runs: list[str]) -> tuple[int, str | None]:
    """(generations checked, the last generation's digest or None) of records (without an
    import's marks) against their entries; Malformed naming the first that differs or
    does not link to the generation before it in the same run (`runs`, per generation)."""
    checked = 0
    for i, (r, e) in enumerate(zip(records, entries, strict=True)):
        if e is None:
            continue
        before = entries[i - 1] if i else None
        need(before is None or runs[i] != runs[i - 1] or e.link == before.digest,
             f"generation {r.index} does not link to generation {r.index - 1} in its sender's chain")
        need(digest(r, e) == e.digest, f"generation {r.index} is not the row its sender's chain hashed")
        checked += 1
    last = entries[-1] if entries else None
    return checked, None if last is None else last.digest
