"""Alembic migrations: old ledgers upgrade without loss (after a backup), newer ones are refused."""

from __future__ import annotations

import hashlib
import sqlite3

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.operations import Operations
from test_ledger_kit import fill, new_run, record

from seedledger.ledger import Ledger, SeedLedgerError, migrate
from seedledger.ledger.db import foreign_key_violations, make_engine, to_url
from seedledger.ledger.schema import Base


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


TABLES = ("runs", "generations", "members", "anchors", "events", "leases")
VIEWS = ("generation_summary", "member_audit", "run_lineage")


def test_layout_and_history():
    revs = migrate.known_revisions()
    assert revs[:3] == ["0001", "0002", "0003"] and migrate.head() == revs[-1]
    assert [h.split()[0] for h in migrate.history()] == revs


def test_head_matches_the_orm_schema(ledger_url):
    """Every schema change ships a migration: the migrated DB equals the ORM metadata
    (on SQLite and on PostgreSQL)."""
    migrate.upgrade(ledger_url)
    engine = make_engine(to_url(ledger_url))
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def _filled_source(path):
    """A head ledger holding every table: runs, a fork, generations, members, samples,
    anchors, events, a lease. Returns what the API reads back from it (before the lease)."""
    with Ledger.open(path) as led:
        new_run(led, "a")
        fill(led, "a", 1, 5)
        new_run(led, "b", parent=("a", 3), run_key=9)
        fill(led, "b", 4, 6, run_key=9)
        led.commit_generation("b", record(7, 6, run_key=9, samples=True))
        led.add_anchor("a", 5, "x.safetensors", "ab", "cd", 10)
        led.log_event("a", "verify", {"ok": True})
        snap = _snapshot(led)
    con = sqlite3.connect(path)  # a lease held by a writer elsewhere (closing releases ours)
    con.execute(
        "INSERT INTO leases (run_id, token, host, pid, holder, since, heartbeat, expires_at) "
        "SELECT id, 't', 'elsewhere', 1, 'w', created_at, created_at, created_at FROM runs "
        "WHERE name = 'a'"
    )
    con.commit()
    con.close()
    return snap


def _snapshot(led):
    return (
        led.list_runs(),
        led.records("b"),
        led.generation("a", 2),
        led.generation("b", 7),
        led.replay_history("b"),
        led.events(),
        led.anchors("a"),
    )


def _ledger_at(path, revision, source):
    """A ledger with schema `revision` holding `source`'s rows (the columns that revision
    has), written with plain SQL: the ORM of this version describes the head schema."""
    assert migrate.upgrade(str(path), revision).after == revision
    con = sqlite3.connect(path)
    con.execute("ATTACH DATABASE ? AS src", (str(source),))
    for table in TABLES:
        cols = ", ".join(r[1] for r in con.execute(f"PRAGMA main.table_info({table})"))
        con.execute(f"INSERT INTO main.{table} ({cols}) SELECT {cols} FROM src.{table}")
    con.commit()
    con.execute("DETACH DATABASE src")
    con.close()
    assert migrate.current(str(path)) == revision


def _counts(path) -> dict[str, int]:
    con = sqlite3.connect(path)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        con.close()


@pytest.mark.parametrize("revision", ["0001", "0002"])
def test_upgrade_from_old_revision_keeps_everything(tmp_path, revision):
    """Through 0003's table rebuild of `generations` (batch mode): every row survives,
    members included (they would be cascade-deleted if foreign keys were on)."""
    before = _filled_source(tmp_path / "src.db")
    path = tmp_path / "old.db"
    _ledger_at(path, revision, tmp_path / "src.db")
    counts = _counts(path)
    assert counts["members"] == 5 * 4 + 3 * 4 + 6 and counts["leases"] == 1

    with pytest.raises(SeedLedgerError) as err:
        Ledger.open(path, upgrade=False)
    msg = str(err.value)
    assert f"run `seedledger db upgrade --ledger {path}`" in msg and "\n" not in msg
    assert migrate.current(str(path)) == revision and not list(tmp_path.glob("old.db.bak*"))

    with Ledger.open(path) as led:  # backs up, then upgrades
        after = _snapshot(led)
        result = led.upgraded
    assert after == before
    assert _counts(path) == counts
    assert migrate.current(str(path)) == migrate.head()
    backups = list(tmp_path.glob(f"old.db.bak-{revision}-*"))
    assert len(backups) == 1
    assert (result.before, result.after, result.backup) == (revision, migrate.head(), backups[0])
    assert str(backups[0]) in result.describe()
    con = sqlite3.connect(backups[0])
    assert con.execute("SELECT version_num FROM alembic_version").fetchone() == (revision,)
    assert con.execute("SELECT count(*) FROM generations").fetchone() == (9,)
    con.close()
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA foreign_key_check").fetchall() == []
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert con.execute("SELECT DISTINCT coefficients_dtype FROM generations").fetchall() == [
        ("float64-le",)
    ]
    assert con.execute("SELECT count(*) FROM generation_summary").fetchone() == (9,)
    assert con.execute("SELECT count(*) FROM member_audit").fetchone() == (counts["members"],)
    with pytest.raises(sqlite3.IntegrityError, match="CHECK"):  # only known encodings
        con.execute("UPDATE generations SET coefficients_dtype = 'bfloat16' WHERE idx = 1")
    con.close()
    with Ledger.open(path) as led:  # a current ledger opens without another backup
        assert led.upgraded is None
    assert len(list(tmp_path.glob("old.db.bak*"))) == 1


def test_downgrade_of_0003_keeps_everything(tmp_path):
    from alembic import command

    before = _filled_source(tmp_path / "l.db")
    counts = _counts(tmp_path / "l.db")
    url = to_url(tmp_path / "l.db")
    with migrate.migration_connection(url) as conn:
        cfg = migrate.alembic_config(url)
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002")
    assert migrate.current(str(tmp_path / "l.db")) == "0002"
    assert _counts(tmp_path / "l.db") == counts
    with Ledger.open(tmp_path / "l.db") as led:
        assert _snapshot(led) == before


def _fk(conn) -> int:
    return conn.exec_driver_sql("PRAGMA foreign_keys").scalar()


def _batch_rebuild_generations(conn) -> None:
    """What a migration that alters `generations` in batch mode does (views dropped first)."""
    op = Operations(MigrationContext.configure(conn, opts={"render_as_batch": True}))
    for view in VIEWS:
        op.execute(f"DROP VIEW {view}")
    with op.batch_alter_table("generations", recreate="always") as batch:
        batch.add_column(sa.Column("note", sa.Text))


def test_migrations_run_with_foreign_keys_off(tmp_path):
    path = tmp_path / "l.db"
    _filled_source(path)
    url = to_url(path)
    members = _counts(path)["members"]

    with Ledger.open(path) as led, led.engine.connect() as conn:  # normal connections: ON
        trans = conn.begin()
        assert _fk(conn) == 1
        _batch_rebuild_generations(conn)
        # the hazard: with foreign keys on, the DROP of the old table cascades
        assert conn.exec_driver_sql("SELECT count(*) FROM members").scalar() == 0
        trans.rollback()

    with migrate.migration_connection(url) as conn:
        trans = conn.begin()
        assert _fk(conn) == 0  # set before the transaction, so it holds inside it
        _batch_rebuild_generations(conn)
        assert conn.exec_driver_sql("SELECT count(*) FROM members").scalar() == members
        assert foreign_key_violations(conn) == []
        trans.rollback()
    assert _counts(path)["members"] == members


def test_upgrade_refuses_foreign_key_violations(tmp_path):
    """env.py runs PRAGMA foreign_key_check before committing: violations roll back."""
    _filled_source(tmp_path / "src.db")
    path = tmp_path / "old.db"
    _ledger_at(path, "0002", tmp_path / "src.db")
    con = sqlite3.connect(path)  # foreign keys off by default: an orphan gets in
    con.execute(
        "INSERT INTO members (generation_id, idx, key, sign, coefficient, components) "
        "VALUES (999, 0, 1, 1, 0.0, '{}')"
    )
    con.commit()
    con.close()
    with pytest.raises(SeedLedgerError, match="break foreign keys .members.") as err:
        Ledger.open(path)
    assert "\n" not in str(err.value)
    assert migrate.current(str(path)) == "0002"
    con = sqlite3.connect(path)
    assert "coefficients_dtype" not in {r[1] for r in con.execute("PRAGMA table_info(generations)")}
    con.close()


def test_read_refuses_unknown_coefficient_dtype(tmp_path):
    path = tmp_path / "l.db"
    _filled_source(path)
    con = sqlite3.connect(path)  # as a newer seedledger's encoding would look
    con.execute("PRAGMA ignore_check_constraints = ON")
    con.execute("UPDATE generations SET coefficients_dtype = 'float32-le' WHERE idx = 2")
    con.commit()
    con.close()
    with Ledger.open(path) as led:
        for read in (lambda: led.replay_history("a"), lambda: led.generation("a", 2)):
            with pytest.raises(SeedLedgerError, match="float32-le"):
                read()


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
