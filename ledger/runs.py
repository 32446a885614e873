"""Runs: create, look up, list, change status, delete (part of `Ledger`)."""

from __future__ import annotations

import socket
from typing import Any

from sqlalchemy import delete, func, select, update

from seedledger.ledger import rows
from seedledger.ledger.base import LedgerBase, run_spec
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.lease import check_writer, stale_reason
from seedledger.ledger.records import RunInfo, RunSpec
from seedledger.ledger.rows import now
from seedledger.ledger.schema import Anchor, Event, Generation, Lease, Member, Run


class RunsMixin(LedgerBase):
    def create_run(
        self,
        name: str,
        spec: RunSpec | None = None,
        *,
        parent: tuple[str, int] | None = None,
        status: str = "created",
        **fields: Any,
    ) -> RunInfo:
        """Record a new run (a fork when `parent=(run, generation)`), given its RunSpec or
        the RunSpec's fields as keywords."""
        spec = run_spec(spec, fields)
        with self.transaction() as conn:
            return self._info(conn, self._create_run(conn, name, spec, parent, status))

    def get_run(self, name: str) -> RunInfo:
        with self._read() as conn:
            return self._info(conn, self._run_row(conn, name))

    def has_run(self, name: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(Run.id).where(Run.name == name)).first() is not None

    def list_runs(self) -> list[RunInfo]:
        with self._read() as conn:
            runs = conn.execute(select(Run).order_by(Run.id)).all()
            names = {r.id: r.name for r in runs}
            return [rows.run_info(r, names.get(r.parent_id)) for r in runs]

    def set_status(self, name: str, status: str) -> None:
        with self.transaction() as conn:
            conn.execute(
                update(Run).where(Run.id == self._run_row(conn, name).id).values(status=status)
            )

    def live_writer(self, name: str) -> str | None:
        """The holder of the run's writer lease while it is live (else None: no lease, or
        one whose process died or whose heartbeat expired)."""
        with self._read() as conn:
            rid = self._run_row(conn, name).id
            row = conn.execute(select(Lease).where(Lease.run_id == rid)).first()
        if row is None or stale_reason(row, socket.gethostname(), now()) is not None:
            return None
        return row.holder

    def children(self, name: str) -> list[tuple[str, int]]:
        """Direct forks of a run: (child name, generation forked from)."""
        with self._read() as conn:
            rid = self._run_row(conn, name).id
            q = select(Run.name, Run.parent_generation).where(Run.parent_id == rid).order_by(Run.id)
            return [(n, g) for n, g in conn.execute(q)]

    def delete_run(self, name: str, reason: str | None = None) -> dict[str, Any]:
        """Delete a run and its rows (generations, members, anchors, lease) in one
        transaction; its events stay, unlinked, and a `run-deleted` event records what
        went. Refused while forks of it exist or a live writer holds its lease. Returns the
        event's payload (`anchors`: the sha256 of each anchor row removed; their files are
        the caller's, since the ledger knows no directories)."""
        with self.transaction() as conn:
            row = self._run_row(conn, name)
            rid = row.id
            kids = conn.execute(select(Run.name).where(Run.parent_id == rid).order_by(Run.id)).scalars().all()
            if kids:
                raise SeedLedgerError(f"run {name!r} has forks ({', '.join(kids)}); delete them first")
            if rid not in self.held_leases:  # LeaseHeld while another writer trains it
                check_writer(conn, name, rid, None)
            own = conn.execute(select(func.count()).where(Generation.run_id == rid)).scalar_one()
            shas = conn.execute(select(Anchor.sha256).where(Anchor.run_id == rid)).scalars().all()
            gens = select(Generation.id).where(Generation.run_id == rid)
            conn.execute(delete(Member).where(Member.generation_id.in_(gens)))
            conn.execute(delete(Generation).where(Generation.run_id == rid))
            conn.execute(delete(Anchor).where(Anchor.run_id == rid))
            conn.execute(delete(Lease).where(Lease.run_id == rid))
            conn.execute(update(Event).where(Event.run_id == rid).values(run_id=None))
            conn.execute(delete(Run).where(Run.id == rid))
            payload: dict[str, Any] = {
                "run": name,
                "status": row.status,
                "generations": own,
                "anchors": list(shas),
            }
            if row.parent_id is not None:
                parent = conn.execute(select(Run.name).where(Run.id == row.parent_id)).scalar_one()
                payload["parent"] = f"{parent}@{row.parent_generation}"
            if reason is not None:
                payload["reason"] = reason
            self._event(conn, None, "run-deleted", payload)
        self._ids.pop(name, None)
        return payload
