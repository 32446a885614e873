"""Hostile ledgers made in the tests: the hash chain guards against edits by hand, not
against an author who recomputes it, so a forged ledger has edited rows *and* a chain that
matches them. `rechain` recomputes every digest exactly as migration 0004 fills them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import sqlalchemy as sa

MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0004_postgres_chain.py"


def rechain(db: Path) -> None:
    """Recompute every generation digest of the SQLite ledger at `db` from its rows."""
    spec = importlib.util.spec_from_file_location("chain_fill", MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    engine = sa.create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as conn:
            module._fill(conn)
    finally:
        engine.dispose()
