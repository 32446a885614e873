"""The sessions' inputs records inside the hash chain (part of `Ledger`).

Every training session records its inputs as an `inputs` event (ledger.provenance). Events
sit outside the rows, so each generation row also carries the digest of the record in
force when it committed (`generations.inputs_digest`, migration 0007), computed here from
the record itself and hashed into the row's chain digest (ledger.chain): a record edited
in SQL no longer has the digest its rows name, a deleted one leaves them naming a record
that is not there, and the rows cannot be edited to match without breaking the chain.
`check_inputs` is the check `check_chain` runs. Rows committed before migration 0007 hold
NULL and bind nothing: their sessions' records stay outside the chain, as they were.

A session's record is in force for the generations after its `from_generation`; along a
lineage, a fork's parent's sessions before the fork point come first, then its own, and
a later session from the same point wins (it is the one that went on).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from typing import Any

from sqlalchemy import Connection, func, select

from seedledger.ledger import codec
from seedledger.ledger.errors import ChainBroken
from seedledger.ledger.schema import Event, Generation, Run

INPUTS_EVENT = "inputs"
# the compared parts of a record: (section, how a message names one entry), in report order
SECTIONS = (("files", "file"), ("tokenizer", "tokenizer file"), ("chat_template", "chat template"),
            ("libraries", "library"), ("sandbox", "sandbox setting"))

Session = tuple[int, str, dict[str, Any]]  # (from_generation, run, the record)


def digest(inputs: dict[str, Any]) -> str:
    """sha256 over a record's compared parts, canonical JSON: equal inputs, equal digests."""
    parts = {section: inputs.get(section) for section, _ in SECTIONS}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def in_force(entries: list[Session], g: int) -> dict[str, Any] | None:
    """The record of the session that trained generation `g` (for g = 0: the first), or
    None when no session along the lineage recorded its inputs."""
    chosen = None
    for start, _run, payload in entries:
        if start < max(g, 1):
            chosen = payload
    return chosen


def sessions(conn: Connection, row: Any, upto: int | None) -> list[Session]:
    """Every session recorded along the lineage of run `row` whose generations reach `upto`
    at most (None: all), oldest first; imported records count (an imported run's sessions
    came with it)."""
    lineage = [(row, upto)]
    while lineage[-1][0].parent_id is not None:
        child = lineage[-1][0]
        parent = conn.execute(select(Run).where(Run.id == child.parent_id)).one()
        lineage.append((parent, child.parent_generation))
    out: list[Session] = []
    for run, limit in reversed(lineage):
        q = select(Event.id, Event.payload).where(Event.run_id == run.id, Event.kind == INPUTS_EVENT).order_by(Event.id)
        for eid, text in conn.execute(q):
            payload = codec.loads(text, f"the payload of event {eid}")
            start = payload.get("from_generation") if isinstance(payload, dict) else None
            if isinstance(start, int) and not isinstance(start, bool) and (limit is None or start < max(limit, 1)):
                out.append((start, run.name, payload))
    return sorted(out, key=lambda item: item[0])  # stable: a run's own sessions in order


def bound_digest(conn: Connection, row: Any, g: int) -> str | None:
    """What generation `g` of run `row`, committing now, binds: the digest of the record in
    force for it (None: no session recorded one)."""
    record = in_force(sessions(conn, row, None), g)
    return None if record is None else digest(record)


def check_inputs(conn: Connection, row: Any, upto: int) -> None:
    """Raise ChainBroken naming the first generation of `row`'s lineage up to `upto` whose
    row names an inputs record that is not there as it was: deleted, edited (its recomputed
    digest differs), or carrying a `digest` field its contents do not give; or a record of
    `row` dated from a generation it has not reached, which no session writes (a session
    records where it starts, before it commits) and which would be in force for the rows
    the next session commits: a ledger's author could plant the inputs they bind."""
    entries = sessions(conn, row, None)
    latest = conn.execute(select(func.max(Generation.idx)).where(Generation.run_id == row.id)).scalar()
    latest = latest if latest is not None else row.parent_generation or 0
    for start, run, _payload in entries:
        if run == row.name and start > latest:
            raise ChainBroken(f"run {run!r}: an inputs record from generation {start}, which the run has not "
                              f"reached (its latest is {latest}), was written outside seedledger", latest + 1)
    entries = [e for e in entries if e[1] != row.name or e[0] < max(upto, 1)]  # sessions(conn, row, upto)
    starts = [start for start, _run, _payload in entries]
    for name, g, bound in _bindings(conn, row, upto):
        at = bisect.bisect_left(starts, max(g, 1)) - 1  # in_force: the last session before g
        record = entries[at][2] if at >= 0 else None
        if record is None:
            why = "was deleted outside seedledger"
        elif digest(record) != bound:
            why = "was edited outside seedledger (its contents no longer give that digest)"
        elif record.get("digest", bound) != bound:
            why = "was edited outside seedledger (its digest field does not match its contents)"
        else:
            continue
        raise ChainBroken(f"run {name!r} generation {g}: the inputs record it was trained on {why}; its row "
                          f"names sha256 {bound[:12]} in the hash chain", g)


def _bindings(conn: Connection, row: Any, upto: int) -> list[tuple[str, int, str]]:
    """(run name, generation, bound digest) of every row along the lineage up to `upto`
    that binds a record, in generation order."""
    out = []
    while True:
        start = (row.parent_generation or 0) + 1 if row.parent_id is not None else 1
        q = select(Generation.idx, Generation.inputs_digest).where(
            Generation.run_id == row.id, Generation.idx.between(start, upto), Generation.inputs_digest.is_not(None))
        out += [(row.name, g, d) for g, d in conn.execute(q)]
        if row.parent_id is None:
            break
        upto = min(upto, row.parent_generation)
        row = conn.execute(select(Run).where(Run.id == row.parent_id)).one()
    return sorted(out, key=lambda item: item[1])
