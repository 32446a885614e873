"""Ledger API: every table round-trips, coefficients are bit-exact, lineage, refusals;
on SQLite and on a real PostgreSQL server (the `ledger_url` fixture)."""

from __future__ import annotations

import math
import random
import re
import sqlite3
import struct
from dataclasses import replace
from pathlib import Path

import pytest
from test_ledger_kit import bits, fill, new_run, record

from seedledger.ledger import LeaseHeld, Ledger, RunNotFound, SeedLedgerError
from seedledger.ledger.db import to_url

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def led(ledger_url):
    with Ledger.open(ledger_url) as ledger:
        yield ledger


def test_runs_round_trip(led):
    info = new_run(led, "a", run_key=(1 << 64) - 1)
    fork = new_run(led, "b", run_key=1 << 63, parent=("a", 0))
    got = led.get_run("a")
    assert got == info and got.run_key == (1 << 64) - 1 and got.parent is None
    assert got.config == {"population": 4, "sigma": 1e-3} and got.base_revision == "r1"
    assert led.get_run("b") == fork and fork.parent == ("a", 0) and fork.run_key == 1 << 63
    assert led.has_run("a") and led.has_run("b") and not led.has_run("c")
    assert [r.name for r in led.list_runs()] == ["a", "b"]
    led.set_status("a", "running")
    assert led.get_run("a").status == "running"
    with pytest.raises(RunNotFound):
        led.get_run("nope")
    with pytest.raises(SeedLedgerError, match="already exists"):
        new_run(led, "a")
    for bad in ("", "x@3", " x"):
        with pytest.raises(SeedLedgerError):
            new_run(led, bad)


def test_generation_and_members_round_trip(led):
    new_run(led, "a")
    rec = record(1, 6, samples=True)
    rec.members[2].reward = float("nan")
    led.commit_generation("a", rec)
    got = led.generation("a", 1)
    assert got.committed_at is not None
    got.committed_at = None
    assert bits(got.members[2].reward) == bits(rec.members[2].reward)
    got.members[2].reward = rec.members[2].reward = 0.0
    assert got == rec
    assert led.records("a")[0].members[0].samples is None  # records(): no sample blobs
    assert led.latest_generation("a") == 1


def test_coefficients_bit_exact(led):
    rng = random.Random(1)
    special = [
        0.0,
        -0.0,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        float("inf"),
        float("-inf"),
        1e300,
        -1e-310,
        3.0,
    ]
    rand = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(52)]
    coefs = [c for c in special + rand if not math.isnan(c)]
    new_run(led, "a")
    led.commit_generation("a", record(1, len(coefs), coefficients=coefs, mirrored=False))
    for got in (
        [m.coefficient for m in led.generation("a", 1).members],
        led.replay_history("a")[0].coefficients,
    ):
        assert [bits(c) for c in got] == [bits(c) for c in coefs]


def test_keys_full_range(led):
    new_run(led, "a")
    rec = record(1, 4, mirrored=False)
    for m, k in zip(rec.members, [0, 1, (1 << 63) - 1, (1 << 64) - 1], strict=True):
        m.key = k
    led.commit_generation("a", rec)
    assert led.replay_history("a")[0].keys == [0, 1, (1 << 63) - 1, (1 << 64) - 1]
    bad = record(2, 1)
    bad.members[0].key = 1 << 64
    with pytest.raises(SeedLedgerError, match="unsigned 64-bit"):
        led.commit_generation("a", bad)


def test_duplicate_and_gap_refused(led):
    new_run(led, "a")
    fill(led, "a", 1, 3)
    with pytest.raises(SeedLedgerError, match="already committed"):
        led.commit_generation("a", record(2))
    with pytest.raises(SeedLedgerError, match="next generation is 4"):
        led.commit_generation("a", record(6))
    bad = record(4)
    bad.population = 5
    with pytest.raises(SeedLedgerError, match="population"):
        led.commit_generation("a", bad)
    assert led.latest_generation("a") == 3


def test_lineage(led):
    new_run(led, "root")
    fill(led, "root", 1, 5)
    new_run(led, "kid", parent=("root", 3), run_key=8)
    assert led.latest_generation("kid") == 3
    with pytest.raises(SeedLedgerError, match="already committed"):
        led.commit_generation("kid", record(3, run_key=8))
    fill(led, "kid", 4, 6, run_key=8)
    new_run(led, "grandkid", parent=("kid", 5), run_key=9)
    fill(led, "grandkid", 6, 7, run_key=9)
    assert led.ancestors("grandkid") == [("root", 1, 3), ("kid", 4, 5), ("grandkid", 6, 7)]
    assert led.ancestors("grandkid", 2) == [("root", 1, 2)]
    assert led.ancestors("kid", 0) == []
    steps = led.replay_history("grandkid")
    assert [(s.run, s.index) for s in steps] == [
        ("root", 1),
        ("root", 2),
        ("root", 3),
        ("kid", 4),
        ("kid", 5),
        ("grandkid", 6),
        ("grandkid", 7),
    ]
    assert steps[3].keys == [m.key for m in led.generation("kid", 4).members]
    assert led.generation("grandkid", 2) == led.generation("root", 2)
    assert [(s.run, s.index) for s in led.replay_history("grandkid", upto=4)][-1] == ("kid", 4)
    with pytest.raises(RunNotFound):
        led.replay_history("kid", upto=7)
    with pytest.raises(SeedLedgerError, match="cannot fork"):
        new_run(led, "bad", parent=("root", 9))
    assert led.children("root") == [("kid", 3)]
    with pytest.raises(SeedLedgerError, match="has forks"):
        led.delete_run("kid")
    led.delete_run("grandkid")
    led.delete_run("kid")
    assert [r.name for r in led.list_runs()] == ["root"]
    assert led.events(kind="run-deleted")[-1].payload == {
        "run": "kid", "status": "created", "generations": 3, "anchors": [], "parent": "root@3"}


def test_replay_steps_carry_each_runs_perturbation(led):
    """noise spec and parameter selection are per run: a fork may perturb otherwise."""
    new_run(led, "a")
    fill(led, "a", 1, 2)
    spec = replace(led.get_run("a").spec(), noise_spec="lowrank-test", param_selection="lora:q")
    child = led.create_run("b", spec, parent=("a", 1))
    assert child.spec() == spec and child.parent == ("a", 1)
    fill(led, "b", 2, 3)
    assert [(s.run, s.index, s.noise_spec, s.param_selection) for s in led.replay_history("b")] == [
        ("a", 1, "v1", "all"), ("b", 2, "lowrank-test", "lora:q"), ("b", 3, "lowrank-test", "lora:q"),
    ]
    with pytest.raises(TypeError, match="not both"):
        led.create_run("c", spec, seed=1)


def test_anchors_and_events(led):
    new_run(led, "a")
    fill(led, "a", 1, 4)
    new_run(led, "b", parent=("a", 2))
    led.add_anchor("a", 2, "anchors/ab12.safetensors", "ab12", "f" * 32, 1234)
    led.add_anchor("a", 2, "anchors/ab12.safetensors", "ab12", "f" * 32, 1234)  # idempotent
    led.add_anchor("a", 4, "anchors/cd34.safetensors", "cd34", "e" * 32, 99)
    with pytest.raises(SeedLedgerError):
        led.add_anchor("a", 4, "other", "ffff", "e" * 32, 99)
    with pytest.raises(SeedLedgerError):
        led.add_anchor("a", 5, "x", "x", "x", 1)
    assert [(a.generation, a.size) for a in led.anchors("a")] == [(2, 1234), (4, 99)]
    assert led.anchors("b") == []
    assert [(a.run, a.generation) for a in led.anchors("b", lineage=True)] == [("a", 2)]
    led.log_event("a", "verify", {"generation": 4, "ok": True})
    led.log_event(None, "note", {"x": [1, 2]})
    kinds = [(e.run, e.kind) for e in led.events()]
    assert kinds == [("a", "create"), ("b", "fork"), ("a", "verify"), (None, "note")]
    assert led.events("a", "verify")[0].payload == {"generation": 4, "ok": True}


def test_sql_views_and_pragmas(tmp_path):
    path = tmp_path / "l.db"
    with Ledger.open(path) as led:
        new_run(led, "a")
        fill(led, "a", 1, 3)
        with led.engine.connect() as conn:
            pragmas = {
                p: conn.exec_driver_sql(f"PRAGMA {p}").scalar()
                for p in ("journal_mode", "foreign_keys", "synchronous", "busy_timeout")
            }
    assert pragmas == {
        "journal_mode": "wal",
        "foreign_keys": 1,
        "synchronous": 2,
        "busy_timeout": 30000,
    }
    con = sqlite3.connect(path)
    rows = con.execute(
        "SELECT run, generation, population, lr, sigma, wall_time FROM generation_summary "
        "ORDER BY generation"
    ).fetchall()
    assert rows == [("a", g, 4, 5e-4, 1e-3, 0.26) for g in (1, 2, 3)]
    assert con.execute("SELECT count(*) FROM member_audit").fetchone() == (12,)
    assert con.execute("SELECT run, latest_generation FROM run_lineage").fetchall() == [("a", 3)]
    con.close()


@pytest.mark.postgres
def test_sql_views_on_postgres(pg_url):
    """The audit views are plain SQL: the same rows on PostgreSQL."""
    with Ledger.open(pg_url) as led:
        new_run(led, "a")
        fill(led, "a", 1, 3)
        with led.engine.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT run, generation, population, lr, sigma, wall_time FROM generation_summary "
                "ORDER BY generation"
            ).fetchall()
            assert [tuple(r) for r in rows] == [("a", g, 4, 5e-4, 1e-3, 0.26) for g in (1, 2, 3)]
            assert conn.exec_driver_sql("SELECT count(*) FROM member_audit").scalar() == 12
            lineage = conn.exec_driver_sql("SELECT run, latest_generation FROM run_lineage").fetchall()
            assert [tuple(r) for r in lineage] == [("a", 3)]


def test_commit_respects_foreign_lease(ledger_url):
    path = ledger_url
    with Ledger.open(path) as a, Ledger.open(path) as b:
        new_run(a, "r")
        with a.lease("r"):
            a.commit_generation("r", record(1))
            with pytest.raises(LeaseHeld):  # same pid is alive: b is another writer
                b.lease("r").acquire()
        b.commit_generation("r", record(2))


def test_urls():
    assert to_url("x.db").startswith("sqlite:////")
    url = "postgresql+psycopg://u:p@localhost:5432/seedledger"
    assert to_url(url) == url
    with pytest.raises(SeedLedgerError):  # no driver or no server: one clean error either way
        Ledger.open("postgresql+psycopg://u:p@127.0.0.1:1/none")


def test_no_sqlite_only_sql_outside_hooks():
    """PostgreSQL-safe: pragmas and BEGIN IMMEDIATE live only in ledger/db.py's hooks."""
    sqlite_sql = re.compile(r"[\"']\s*(PRAGMA|BEGIN IMMEDIATE|INSERT OR|REPLACE INTO)", re.I)
    for f in (ROOT / "ledger").glob("*.py"):
        if f.name != "db.py":
            assert not sqlite_sql.search(f.read_text()), f.name
    assert "import torch" not in "".join(p.read_text() for p in (ROOT / "ledger").glob("*.py"))
