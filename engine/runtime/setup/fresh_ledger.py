"""A SQLite ledger that `train` created is removed again when the command fails before
any run exists in it (a bad config, a missing data file, a model that does not exist):
otherwise the failure leaves an empty `seedledger.db` behind that the next command takes
for the user's ledger. A ledger that existed before, or that holds a run (an interrupted
one that `resume` continues), is never touched; other databases are never removed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from seedledger.ledger.db import sqlite_path, to_url
from seedledger.ledger.errors import SeedLedgerError

_COMPANIONS = ("", "-wal", "-shm", "-journal")  # SQLite's own files beside the database


@contextmanager
def removed_if_unused(location: str | os.PathLike[str]) -> Iterator[None]:
    """Run the body; if it raises and `location` is a SQLite file that did not exist when
    it began and holds no run now, delete the file (and its -wal/-shm/-journal). The
    ledger must be closed by then: wrap this around the code that opens it."""
    try:
        path = sqlite_path(to_url(location))
    except (SeedLedgerError, ValueError):  # a bad URL: the body says so
        path = None
    new = path is not None and not path.exists()
    try:
        yield
    except BaseException:
        if new and path.exists() and not _holds_a_run(location):
            for suffix in _COMPANIONS:
                with contextlib.suppress(FileNotFoundError):
                    Path(str(path) + suffix).unlink()
        raise


def _holds_a_run(location: str | os.PathLike[str]) -> bool:
    """Whether the ledger at `location` holds any run; one that cannot be read counts as
    holding one (it is left for the user to look at)."""
    from seedledger.ledger import Ledger, migrate

    try:
        if migrate.inspect_schema(os.fspath(location)).status == "empty":  # created, no schema yet
            return False
        with Ledger.open(location, upgrade=False, create=False) as led:
            return bool(led.list_runs())
    except Exception:
        return True
