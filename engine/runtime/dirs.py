"""Where a ledger's side files live: anchors and tracker logs beside a SQLite ledger, else
under $SEEDLEDGER_HOME (a ledger behind a URL has no folder of its own)."""

from __future__ import annotations

import os
from pathlib import Path

from seedledger.ledger import Ledger
from seedledger.ledger.db import sqlite_path, to_url


def anchors_dir(ledger: Ledger) -> Path:
    """Anchors live next to a SQLite ledger, else under $SEEDLEDGER_HOME."""
    path = sqlite_path(to_url(ledger.location))
    if path is not None:
        return Path(str(path) + ".anchors")
    home = Path(os.environ.get("SEEDLEDGER_HOME", Path.home() / ".cache" / "seedledger"))
    return home / "anchors"


def log_dir(ledger: Ledger) -> Path:
    """Where `report_to` trackers write: `logs/` beside a SQLite ledger, else
    `$SEEDLEDGER_HOME/logs`; each tracker uses `<log_dir>/<tracker>/<run>`."""
    return anchors_dir(ledger).parent / "logs"
