"""The ledger's core: its engine, transactions, run lookup and lineage walk.

`Ledger` (ledger.ledger) is this core plus one mixin per purpose: runs (ledger.runs),
history reads (ledger.history), generation commits (ledger.commits), anchors and events
(ledger.trail). Every write is one transaction (`transaction`), so a generation, its
members and its blobs land together or not at all. Generation indices are global along
a lineage: a fork of `parent@g` starts at g + 1 and `child@g` is `parent@g`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from seedledger.ledger import codec, migrate, rows
from seedledger.ledger.db import display_location
from seedledger.ledger.errors import RunNotFound, SeedLedgerError
from seedledger.ledger.lease import WriterLease
from seedledger.ledger.names import check_run_name
from seedledger.ledger.records import RunInfo, RunSpec
from seedledger.ledger.schema import Event, Generation, Run

Segment = tuple[str, int, int]  # (run, first generation, last generation)


class LedgerBase:
    """What every part of the Ledger shares; also the surface a WriterLease uses
    (`transaction`, `run_id`, `held_leases`: see ledger.lease.LeaseHost)."""

    def __init__(self, engine: Engine, location: str = ""):
        self.engine = engine
        self.location = location or str(engine.url)
        self.display = display_location(self.location)  # for messages: the password masked
        self._ids: dict[str, int] = {}
        self.held_leases: dict[int, WriterLease] = {}  # by run id: the leases this object holds
        # set by open() when it upgraded an old schema: before/after revision and the
        # backup file (show `upgraded.describe()` to the user: it names the backup)
        self.upgraded: migrate.UpgradeResult | None = None
        # why the ledger is open read-only (Ledger.open), else None: writes are refused
        self.read_only: str | None = None

    @contextmanager
    def transaction(self, raw_integrity: bool = False) -> Iterator[Connection]:
        """One write transaction (BEGIN IMMEDIATE on SQLite); DB errors become one line
        (IntegrityError passes through with `raw_integrity`, for callers that retry)."""
        if self.read_only is not None:
            raise SeedLedgerError(f"ledger {self.display} is open read-only ({self.read_only}); nothing was written")
        try:
            with self.engine.connect() as conn:
                conn.execution_options(write=True)
                with conn.begin():
                    yield conn
        except DBAPIError as exc:
            if raw_integrity and isinstance(exc, IntegrityError):
                raise
            raise SeedLedgerError(f"ledger {self.display}: {exc.orig}") from None

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                yield conn
        except DBAPIError as exc:
            raise SeedLedgerError(f"ledger {self.display}: {exc.orig}") from None

    def _run_row(self, conn: Connection, name: str) -> Any:
        row = conn.execute(select(Run).where(Run.name == name)).first()
        if row is None:
            raise RunNotFound(f"no run named {name!r} in {self.display}")
        return row

    def run_id(self, name: str) -> int:
        """The run's row id (cached: ids never change while a run exists)."""
        if name not in self._ids:
            with self._read() as conn:
                self._ids[name] = self._run_row(conn, name).id
        return self._ids[name]

    def _info(self, conn: Connection, row: Any) -> RunInfo:
        parent = None
        if row.parent_id is not None:
            parent = conn.execute(select(Run.name).where(Run.id == row.parent_id)).scalar_one()
        return rows.run_info(row, parent)

    def _latest(self, conn: Connection, run_row: Any) -> int:
        own = conn.execute(
            select(func.max(Generation.idx)).where(Generation.run_id == run_row.id)
        ).scalar()
        return own if own is not None else (run_row.parent_generation or 0)

    def _segments(self, conn: Connection, name: str, g: int | None) -> list[Segment]:
        row = self._run_row(conn, name)
        latest = self._latest(conn, row)
        g = latest if g is None else g
        if not isinstance(g, int) or not 0 <= g <= latest:
            raise RunNotFound(f"run {name!r} has no generation {g} (it has 0..{latest})")
        out: list[Segment] = []
        seen: set[int] = set()
        while True:
            if row.id in seen:
                raise SeedLedgerError(f"run {name!r} has a cyclic lineage")
            seen.add(row.id)
            start = (row.parent_generation or 0) + 1 if row.parent_id is not None else 1
            if g >= start:
                out.append((row.name, start, g))
            if row.parent_id is None:
                break
            g = min(g, row.parent_generation)
            row = conn.execute(select(Run).where(Run.id == row.parent_id)).one()
        return out[::-1]

    def _create_run(
        self,
        conn: Connection,
        name: str,
        spec: RunSpec,
        parent: tuple[str, int] | None,
        status: str,
        event: tuple[str, dict[str, Any]] | None = None,
    ) -> Any:
        """Insert a run row (and its create/fork/import event); returns the row."""
        check_run_name(name)
        seed = spec.seed
        if seed is not None and (
            not isinstance(seed, int) or isinstance(seed, bool) or not codec.I64_MIN <= seed <= codec.I64_MAX
        ):
            raise SeedLedgerError(f"seed {seed!r} is not a signed 64-bit integer")
        if conn.execute(select(Run.id).where(Run.name == name)).first():
            raise SeedLedgerError(f"a run named {name!r} already exists")
        parent_id = parent_gen = None
        if parent is not None:
            pname, parent_gen = parent
            prow = self._run_row(conn, pname)
            latest = self._latest(conn, prow)
            if not isinstance(parent_gen, int) or not 0 <= parent_gen <= latest:
                raise SeedLedgerError(
                    f"cannot fork {pname}@{parent_gen}: it has generations 0..{latest}"
                )
            parent_id = prow.id
        run_id = conn.execute(
            insert(Run)
            .values(
                name=name,
                created_at=rows.now(),
                status=status,
                parent_id=parent_id,
                parent_generation=parent_gen,
                **rows.run_columns(spec),
            )
            .returning(Run.id)
        ).scalar_one()
        if event is None:
            event = ("fork", {"parent": list(parent)}) if parent else ("create", {})
        self._event(conn, run_id, *event)
        return conn.execute(select(Run).where(Run.id == run_id)).one()

    def _event(self, conn: Connection, run_id: int | None, kind: str, payload: dict, *,
               origin: str | None = None, sent_at: datetime | None = None) -> None:
        """Record an event now; an imported one with the `origin` it came with and the time
        its sender recorded it (`sent_at`), so that it never reads as this ledger's own."""
        conn.execute(
            insert(Event).values(
                run_id=run_id, at=rows.now(), kind=kind, payload=codec.dumps(payload), origin=origin,
                sent_at=None if sent_at is None else rows.utc(sent_at),
            )
        )


def run_spec(spec: RunSpec | None, fields: dict[str, Any]) -> RunSpec:
    """`spec`, or a RunSpec made of `fields` (create_run and import_run take either)."""
    if spec is not None and fields:
        raise TypeError(f"pass a RunSpec or its fields, not both ({', '.join(fields)})")
    return spec if spec is not None else RunSpec(**fields)
