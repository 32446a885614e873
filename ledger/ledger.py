"""`Ledger`: the API over one ledger database (runs, generations, lineage, anchors, events).

Reads and writes go through SQLAlchemy Core statements on the typed ORM tables. The class
is assembled by purpose: ledger.base (engine, transactions, lineage walk), ledger.runs,
ledger.history (reads along a lineage), ledger.commits (generations, imports) and
ledger.trail (anchors, events); opening, closing and the writer lease are here.
"""

from __future__ import annotations

import os

from ledger import migrate
from ledger.commits import CommitsMixin
from ledger.db import make_engine, sqlite_path, to_url
from ledger.errors import SeedLedgerError
from ledger.history import HistoryMixin
from ledger.lease import WriterLease
from ledger.runs import RunsMixin
from ledger.trail import TrailMixin


class Ledger(RunsMixin, HistoryMixin, CommitsMixin, TrailMixin):
    """One ledger database. Open with `Ledger.open(path_or_url)`; use as a context manager."""

    @classmethod
    def open(cls, location: str | os.PathLike[str], upgrade: bool = True, create: bool = True):
        """Open (or create) a ledger; an old schema is backed up then upgraded.

        `upgrade=False` refuses an old schema with the command to run; a schema newer than
        this version knows is refused whatever `upgrade` says, and the file is not touched.
        `create=False` refuses a ledger that does not exist yet. After upgrading an old
        schema, `ledger.upgraded` holds the `UpgradeResult` (with the backup's path).
        Two processes creating or upgrading the same ledger at once take turns.
        """
        loc = os.fspath(location)
        url = to_url(loc)
        path = sqlite_path(url)
        if path is not None and not path.exists():
            if not create:
                raise SeedLedgerError(f"no ledger at {loc}")
            if not path.parent.is_dir():
                raise SeedLedgerError(
                    f"cannot create ledger {loc}: {path.parent} is not a directory"
                )
        state = migrate.inspect_schema(url)
        migrate.refuse_newer(loc, state)
        if state.status == "old" and not upgrade:
            raise SeedLedgerError(
                f"ledger {loc} has schema {state.revision}, this seedledger needs "
                f"{migrate.head()}; run `seedledger db upgrade --ledger {loc}`"
            )
        result = migrate.upgrade(url) if state.status != "current" else None
        led = cls(make_engine(url), loc)
        if result is not None and state.status == "old":
            led.upgraded = result
        return led

    def close(self) -> None:
        for lease in list(self.held_leases.values()):
            lease.release()
        self.engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lease(self, name: str, holder: str | None = None, ttl: float = 60.0) -> WriterLease:
        """`with led.lease(run):` the run's writer lease (LeaseHeld names a live holder)."""
        return WriterLease(self, name, holder, ttl)
