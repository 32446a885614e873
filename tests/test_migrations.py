"""Alembic migrations: old ledgers upgrade without loss (after a backup), newer ones are refused."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from test_ledger_kit import fill, new_run

from ledger import Ledger, SeedLedgerError, migrate
from ledger.db import make_engine, to_url
from ledger.schema import Base


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_layout_and_history():
    revs = migrate.known_revisions()
    assert revs[:2] == ["0001", "0002"] and migrate.head() == revs[-1]
    assert [h.split()[0] for h in migrate.history()] == revs


def test_head_matches_the_orm_schema(tmp_path):
    """Every schema change ships a migration: the migrated DB equals the ORM metadata."""
    path = tmp_path / "l.db"
    migrate.upgrade(str(path))
    engine = make_engine(to_url(path))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_upgrade_from_first_revision_keeps_everything(tmp_path):
    path = tmp_path / "old.db"
    assert migrate.upgrade(str(path), "0001").after == "0001"
    old = Ledger(make_engine(to_url(path)))  # write with the 0001 schema, bypassing open()
    new_run(old, "a")
    fill(old, "a", 1, 5)
    new_run(old, "b", parent=("a", 3), run_key=9)
    fill(old, "b", 4, 6, run_key=9)
    old.add_anchor("a", 5, "x.safetensors", "ab", "cd", 10)
    old.log_event("a", "verify", {"ok": True})
    before = (
        old.list_runs(),
        old.records("b"),
        old.generation("a", 2),
        old.events(),
        old.anchors("a"),
    )
    old.close()
    assert migrate.current(str(path)) == "0001"

    with pytest.raises(SeedLedgerError, match="seedledger db upgrade") as err:
        Ledger.open(path, upgrade=False)
    assert "\n" not in str(err.value)

    with Ledger.open(path) as led:  # backs up, then upgrades
        after = (
            led.list_runs(),
            led.records("b"),
            led.generation("a", 2),
            led.events(),
            led.anchors("a"),
        )
    assert after == before
    assert migrate.current(str(path)) == migrate.head()
    backups = list(tmp_path.glob("old.db.bak-0001-*"))
    assert len(backups) == 1
    con = sqlite3.connect(backups[0])
    assert con.execute("SELECT version_num FROM alembic_version").fetchone() == ("0001",)
    assert con.execute("SELECT count(*) FROM generations").fetchone() == (8,)
    con.close()
    con = sqlite3.connect(path)
    assert con.execute("SELECT count(*) FROM generation_summary").fetchone() == (8,)
    con.close()


def test_newer_schema_refused_untouched(tmp_path):
    path = tmp_path / "new.db"
    with Ledger.open(path) as led:
        new_run(led, "a")
    con = sqlite3.connect(path)
    con.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    con.commit()
    con.execute("PRAGMA journal_mode = DELETE")  # a file as another tool might leave it
    con.close()
    digest = _digest(path)
    for upgrade in (True, False):
        with pytest.raises(SeedLedgerError, match="newer than this seedledger") as err:
            Ledger.open(path, upgrade=upgrade)
        assert "\n" not in str(err.value)
    with pytest.raises(SeedLedgerError, match="newer"):
        migrate.upgrade(str(path))
    assert migrate.current(str(path)) == "9999_from_the_future"
    assert _digest(path) == digest and not list(tmp_path.glob("new.db.bak*"))


def test_foreign_database_refused(tmp_path):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (x)")
    con.close()
    with pytest.raises(SeedLedgerError, match="not a seedledger ledger"):
        Ledger.open(path)
    with pytest.raises(SeedLedgerError, match="no ledger"):
        Ledger.open(tmp_path / "missing.db", create=False)
