"""Runs: create, look up, list, change status, delete (part of `Ledger`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update

from ledger import rows
from ledger.base import LedgerBase, run_spec
from ledger.errors import SeedLedgerError
from ledger.records import RunInfo, RunSpec
from ledger.schema import Anchor, Event, Generation, Lease, Member, Run


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

    def children(self, name: str) -> list[tuple[str, int]]:
        """Direct forks of a run: (child name, generation forked from)."""
        with self._read() as conn:
            rid = self._run_row(conn, name).id
            q = select(Run.name, Run.parent_generation).where(Run.parent_id == rid).order_by(Run.id)
            return [(n, g) for n, g in conn.execute(q)]

    def delete_run(self, name: str) -> None:
        """Delete a run and its records; refused while forks of it exist."""
        kids = self.children(name)
        with self.transaction() as conn:
            rid = self._run_row(conn, name).id
            if kids or conn.execute(select(Run.id).where(Run.parent_id == rid)).first():
                listed = ", ".join(k for k, _ in kids) or "forks"
                raise SeedLedgerError(f"run {name!r} has forks ({listed}); delete them first")
            gens = select(Generation.id).where(Generation.run_id == rid)
            conn.execute(delete(Member).where(Member.generation_id.in_(gens)))
            conn.execute(delete(Generation).where(Generation.run_id == rid))
            conn.execute(delete(Anchor).where(Anchor.run_id == rid))
            conn.execute(delete(Lease).where(Lease.run_id == rid))
            conn.execute(update(Event).where(Event.run_id == rid).values(run_id=None))
            conn.execute(delete(Run).where(Run.id == rid))
            self._event(conn, None, "run-deleted", {"run": name})
        self._ids.pop(name, None)
