"""`Ledger`: the API over one ledger database (runs, generations, lineage, anchors, events).

Reads and writes go through SQLAlchemy Core statements on the typed ORM tables. The class
is assembled by purpose: ledger.base (engine, transactions, lineage walk), ledger.runs,
ledger.history (reads along a lineage), ledger.commits (generations, imports) and
ledger.trail (anchors, events); opening, closing and the writer lease are here.
"""

from __future__ import annotations

import os
from pathlib import Path

from seedledger.ledger import migrate
from seedledger.ledger.commits import CommitsMixin
from seedledger.ledger.db import (
    display_location,
    make_engine,
    read_only_reason,
    read_only_url,
    sqlite_path,
    to_url,
)
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.history import HistoryMixin
from seedledger.ledger.lease import WriterLease
from seedledger.ledger.runs import RunsMixin
from seedledger.ledger.trail import TrailMixin


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
        shown = display_location(loc)
        url = to_url(loc)
        path = sqlite_path(url)
        if path is not None and not path.exists():
            if not create:
                raise SeedLedgerError(f"no ledger at {shown}")
            if not path.parent.is_dir():
                raise SeedLedgerError(
                    f"cannot create ledger {shown}: {path.parent} is not a directory"
                )
        read_only = read_only_reason(url)
        if read_only is not None:
            return cls._open_read_only(loc, path, read_only)  # type: ignore[arg-type]
        state = migrate.inspect_schema(url)
        if state.status == "empty" and not create:
            raise SeedLedgerError(f"{shown} is not a ledger (an empty database); nothing to read")
        migrate.refuse_newer(loc, state)
        if state.status == "old" and not upgrade:
            raise SeedLedgerError(
                f"ledger {shown} has schema {state.revision}, this seedledger needs "
                f"{migrate.head()}; run `seedledger db upgrade --ledger {shown}`"
            )
        result = migrate.upgrade(url) if state.status != "current" else None
        led = cls(make_engine(url), loc)
        if result is not None and state.status == "old":
            led.upgraded = result
        return led

    @classmethod
    def _open_read_only(cls, loc: str, path: Path, why: str) -> Ledger:
        """A SQLite ledger opened for reading only (ledger.db.read_only_reason): nothing is
        written, not even WAL's `-shm`; no upgrade, and every write is refused in one line."""
        url = read_only_url(path)
        state = migrate.inspect_schema(url)
        migrate.refuse_newer(loc, state)
        if state.status == "empty":
            raise SeedLedgerError(f"{path} is not a ledger (an empty database); nothing to read")
        if state.status == "old":
            raise SeedLedgerError(
                f"ledger {path} has schema {state.revision}, this seedledger needs {migrate.head()}, "
                f"and it is read-only ({why}), so it cannot be upgraded; upgrade a writable copy"
            )
        led = cls(make_engine(url, tuned=False), loc)
        led.read_only = why
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
