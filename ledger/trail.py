"""The audit trail: anchors (full-weight caches of a generation) and events (part of `Ledger`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select

from seedledger.ledger import codec, rows
from seedledger.ledger.base import LedgerBase
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import AnchorInfo, EventInfo
from seedledger.ledger.schema import Anchor, Event, Run


class TrailMixin(LedgerBase):
    def add_anchor(
        self, name: str, g: int, path: str, sha256: str, fingerprint: str, size: int
    ) -> None:
        """Record a full-weight cache of `name@g` (idempotent for the same sha256)."""
        with self.transaction() as conn:
            run = self._run_row(conn, name)
            if not 0 <= g <= self._latest(conn, run):
                raise SeedLedgerError(f"cannot anchor {name}@{g}: no such generation")
            old = conn.execute(
                select(Anchor.sha256).where(Anchor.run_id == run.id, Anchor.generation == g)
            ).first()
            if old is not None:
                if old.sha256 == sha256:
                    return
                raise SeedLedgerError(f"{name}@{g} already has an anchor with another sha256")
            conn.execute(
                insert(Anchor).values(
                    run_id=run.id,
                    generation=g,
                    path=str(path),
                    sha256=sha256,
                    fingerprint=fingerprint,
                    size=size,
                    created_at=rows.now(),
                )
            )

    def anchors(self, name: str, lineage: bool = False) -> list[AnchorInfo]:
        """The run's anchors by generation; `lineage=True` adds ancestors' usable ones."""
        with self._read() as conn:
            wanted = [(name, 0, self._latest(conn, self._run_row(conn, name)))]
            if lineage:  # ancestor@x is this run's model for every x <= its segment's end
                wanted += [(r, 0, b) for r, _a, b in self._segments(conn, name, None) if r != name]
            out: list[AnchorInfo] = []
            for run, a, b in wanted:
                rid = self._run_row(conn, run).id
                q = (
                    select(Anchor)
                    .where(Anchor.run_id == rid, Anchor.generation.between(a, b))
                    .order_by(Anchor.generation)
                )
                out += [rows.anchor_info(run, x) for x in conn.execute(q)]
            return sorted(out, key=lambda x: x.generation)

    def anchor_shas(self) -> set[str]:
        """The sha256 of every anchor any run records (files still in use)."""
        with self._read() as conn:
            return set(conn.execute(select(Anchor.sha256)).scalars())

    def log_event(self, name: str | None, kind: str, payload: dict[str, Any]) -> None:
        """Append to the audit trail (resume, verify results, errors...)."""
        with self.transaction() as conn:
            rid = self._run_row(conn, name).id if name is not None else None
            self._event(conn, rid, kind, payload)

    def events(self, name: str | None = None, kind: str | None = None, *, imported: bool = False) -> list[EventInfo]:
        """The audit trail (of run `name`, of `kind`), oldest first: this ledger's own events,
        and with `imported` also those an import brought (`EventInfo.origin`), which are the
        sender's account: whatever acts on an event (tune, pbt, a module run's base) reads
        its own only; what shows or carries a lineage's history asks for both."""
        with self._read() as conn:
            q = select(Event, Run.name).join(Run, Run.id == Event.run_id, isouter=True)
            if name is not None:
                q = q.where(Event.run_id == self._run_row(conn, name).id)
            if kind is not None:
                q = q.where(Event.kind == kind)
            if not imported:
                q = q.where(Event.origin.is_(None))
            return [
                EventInfo(e.id, e.name, rows.utc(e.at), e.kind, codec.loads(e.payload, f"the payload of event {e.id}"),
                          e.origin, None if e.sent_at is None else rows.utc(e.sent_at))
                for e in conn.execute(q.order_by(Event.id))
            ]
