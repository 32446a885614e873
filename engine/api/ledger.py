"""Which ledger a call of the Python API uses, and opening it for the call (a SQLite
path, a SQLAlchemy URL, `$SEEDLEDGER_DB`, or an open `Ledger` the caller keeps)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from seedledger.ledger import Ledger

DEFAULT_LEDGER = "seedledger.db"

LedgerArg = Ledger | str | os.PathLike[str] | None


def open_ledger(location: str | os.PathLike[str] | None = None, *, create: bool = False,
                upgrade: bool = True) -> Ledger:
    """Open a ledger (a SQLite path or a SQLAlchemy URL; None: `$SEEDLEDGER_DB`, else
    `./seedledger.db`). Use it as a context manager, which closes it. A missing SQLite file
    is an error unless `create`, so a mistyped path is reported, not made into an empty
    ledger; an older schema is upgraded (after a backup) unless `upgrade=False`."""
    return Ledger.open(ledger_location(location), upgrade=upgrade, create=create)


def ledger_location(location: str | os.PathLike[str] | None) -> str:
    return os.fspath(location) if location is not None else os.environ.get("SEEDLEDGER_DB") or DEFAULT_LEDGER


@contextmanager
def ledger_for_call(ledger: LedgerArg, create: bool = False) -> Iterator[Ledger]:
    """`ledger` itself when it is open (the caller closes it), else opened for this call;
    a SQLite file this call creates is removed again if the call fails before any run
    exists in it (engine.runtime.setup.fresh_ledger)."""
    if isinstance(ledger, Ledger):
        yield ledger
        return
    from seedledger.engine.runtime.setup.fresh_ledger import removed_if_unused

    where = ledger_location(ledger)
    with removed_if_unused(where) if create else nullcontext(), open_ledger(where, create=create) as led:
        yield led
