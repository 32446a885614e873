"""The hash chain: every generation row carries a digest over its content, its members and
its predecessor's digest; `check_chain` (and `verify --quick`, and every replay) names the
first row edited by hand. The same digests on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess

import pytest
import sqlalchemy as sa
from test_ledger_kit import fill, new_run, record

from seedledger.ledger import Ledger, chain, migrate
from seedledger.ledger.db import make_engine, to_url
from seedledger.ledger.errors import ChainBroken
from tests.support.cli import script
from tests.support.ledgercopy import copy_rows


def _lineage(led: Ledger) -> None:
    """root@1..4 -> kid (forked at root@2) @3..5 -> zero (forked at kid@0) @1..2; an import."""
    new_run(led, "root")
    fill(led, "root", 1, 4)
    new_run(led, "kid", parent=("root", 2), run_key=9)
    fill(led, "kid", 3, 4, run_key=9)
    rec = record(5, 6, run_key=9, samples=True)
    rec.members[1].reward = float("nan")
    rec.members[2].coefficient = -0.0
    led.commit_generation("kid", rec)
    new_run(led, "zero", parent=("kid", 0), run_key=11)
    fill(led, "zero", 1, 2, run_key=11)
    led.import_run("imp", [record(g, 4, run_key=3) for g in (1, 2)], base_model="tiny", noise_spec="v1", run_key=3)


def _sql(url: str, statement: str, **params) -> None:
    engine = make_engine(to_url(url))
    with engine.begin() as conn:
        conn.execute(sa.text(statement), params)
    engine.dispose()


def _digests(led: Ledger) -> dict:
    with led.engine.connect() as conn:
        q = "SELECT r.name, g.idx, g.digest FROM generations g JOIN runs r ON r.id = g.run_id"
        return {(n, i): d for n, i, d in conn.exec_driver_sql(q)}


def test_chain_checks_on_both_databases(ledger_url):
    with Ledger.open(ledger_url) as led:
        _lineage(led)
        heads = {run: led.check_chain(run) for run in ("root", "kid", "zero", "imp")}
        assert [n for _, n in heads.values()] == [4, 5, 2, 2]
        assert led.check_chain("kid", 2) == led.check_chain("root", 2)  # shared generations
        assert led.check_chain("kid", 0) == ("", 0)
        stored = _digests(led)
        assert heads["kid"][0] == stored[("kid", 5)] and len(set(stored.values())) == len(stored)


def test_sqlite_digests_verify_on_postgres(tmp_path, pg_url):
    """Computed in Python from the values as either database returns them: the rows of an
    SQLite ledger, copied verbatim to PostgreSQL, verify there with the same digests."""
    src = str(tmp_path / "l.db")
    with Ledger.open(src) as led:
        _lineage(led)
        want = {run: led.check_chain(run) for run in ("root", "kid", "zero", "imp")}
    migrate.upgrade(pg_url)
    copy_rows(src, pg_url)
    with Ledger.open(pg_url) as led:
        assert {run: led.check_chain(run) for run in want} == want
        led.commit_generation("root", record(5))  # ids and sequences carry on
        assert led.check_chain("root")[1] == 5


KID5 = "(SELECT g.id FROM generations g JOIN runs r ON r.id = g.run_id WHERE r.name = 'kid' AND g.idx = 5)"


@pytest.mark.parametrize(
    ("statement", "run", "bad"),
    [
        ("UPDATE generations SET lr = 0.5 WHERE idx = 3 AND run_id = (SELECT id FROM runs WHERE name = 'root')",
         "root", 3),
        ("UPDATE generations SET fingerprint = 'ab' WHERE idx = 2", "kid", 2),  # root@2, kid's lineage
        (f"UPDATE members SET components = '{{}}' WHERE idx = 3 AND generation_id = {KID5}", "kid", 5),
        (f"UPDATE members SET samples = NULL WHERE idx = 0 AND generation_id = {KID5}", "kid", 5),
        ("UPDATE runs SET noise_spec = 'v9' WHERE name = 'kid'", "kid", 3),  # the run's settings
        ("UPDATE runs SET base_fingerprint = 'ee' WHERE name = 'root'", "zero", 1),  # via kid@0 -> root
        (f"DELETE FROM members WHERE idx = 5 AND generation_id = {KID5}", "kid", 5),
    ],
)
def test_a_row_edited_by_hand_is_named(ledger_url, statement, run, bad):
    with Ledger.open(ledger_url) as led:
        _lineage(led)
    _sql(ledger_url, statement)
    with Ledger.open(ledger_url) as led:
        with pytest.raises(ChainBroken, match=f"generation {bad} ") as err:
            led.check_chain(run)
        assert err.value.generation == bad and "\n" not in str(err.value)


def test_a_rewritten_digest_breaks_the_next_link(ledger_url):
    """A forger who edits root@2 and recomputes its digest still breaks root@3's link."""
    from seedledger.ledger.schema import Generation, Member

    with Ledger.open(ledger_url) as led:
        _lineage(led)
        prev = _digests(led)[("root", 1)]
        _sql(ledger_url, "UPDATE generations SET lr = 0.5 "
                         "WHERE idx = 2 AND run_id = (SELECT id FROM runs WHERE name = 'root')")
        with led.engine.connect() as conn:
            g2 = conn.execute(
                sa.select(Generation).where(Generation.idx == 2, Generation.run_id == led.run_id("root"))
            ).one()
            members = conn.execute(sa.select(Member).where(Member.generation_id == g2.id).order_by(Member.idx)).all()
        forged = chain.generation_digest(prev, g2, members)
        _sql(ledger_url, "UPDATE generations SET digest = :d WHERE id = :i", d=forged, i=g2.id)
        with pytest.raises(ChainBroken, match="generation 3 ") as err:
            led.check_chain("root")
        assert err.value.generation == 3


def test_replay_checks_the_chain_first(tmp_path):
    import torch

    from seedledger.replay.rebuild import rebuild

    path = str(tmp_path / "l.db")
    with Ledger.open(path) as led:
        _lineage(led)
    _sql(path, "UPDATE members SET reward = 0.25 WHERE idx = 0 AND generation_id = 3")
    with Ledger.open(path) as led:
        with pytest.raises(ChainBroken, match="generation 3 "):
            rebuild(led, "root", None, {"w": torch.zeros(4)})


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_migration_fills_the_chain_of_an_older_ledger(tmp_path, request, db):
    """A ledger at the previous head (0003, no digests) upgrades to digests equal to those
    this version computes when it commits the same rows."""
    src = str(tmp_path / "src.db")
    with Ledger.open(src) as led:
        _lineage(led)
        want = _digests(led)
    old = str(tmp_path / "old.db") if db == "sqlite" else request.getfixturevalue("pg_url")
    migrate.upgrade(old, "0003")
    copy_rows(src, old)
    assert migrate.current(old) == "0003"
    with Ledger.open(old) as led:
        assert migrate.current(old) == migrate.head()
        assert _digests(led) == want
        assert led.check_chain("zero")[1] == 2 and led.check_chain("kid")[1] == 5


def _verify_quick(path, ref: str) -> subprocess.CompletedProcess:
    return subprocess.run([*script(), "verify", ref, "--quick", "--json", "--ledger", path],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_verify_quick_names_the_edited_row(ledger_url):
    """Through the console script: exit 0 with the chain's head, then a hand edit -> exit 1,
    one line naming the generation, the JSON report too."""
    with Ledger.open(ledger_url) as led:
        _lineage(led)
        head = _digests(led)[("kid", 5)]
    ok = _verify_quick(ledger_url, "kid")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["ok"] and report["digest"] == head and report["generations_checked"] == 5
    _sql(ledger_url, f"UPDATE members SET coefficient = 1.5 WHERE idx = 2 AND generation_id = {KID5}")
    bad = _verify_quick(ledger_url, "kid")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert not report["ok"] and report["first_bad_generation"] == 5
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("error: kid@5 does not verify: run 'kid' generation 5 was changed outside seedledger")
    assert _verify_quick(ledger_url, "kid@4").returncode == 0  # before the edit: sound
    with Ledger.open(ledger_url) as led:
        assert [e.payload["ok"] for e in led.events("kid", "verify")] == [True, False, True]
