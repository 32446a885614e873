"""Crash safety: SIGKILL a process while it commits generations; every committed generation
survives, the file passes integrity_check, and each generation is whole or absent (SQLite;
on PostgreSQL the server rolls back the killed client's transaction: the same checks)."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import struct

import pytest
import sqlalchemy as sa
from test_ledger_kit import new_run, record

from seedledger.ledger import Ledger
from seedledger.ledger.db import make_engine, to_url

FORK = mp.get_context("fork")
N = 48


def _writer(path, pipe) -> None:
    led = Ledger.open(path)
    with led.lease("r", ttl=30):
        g = led.latest_generation("r") + 1
        pipe.send(("ready", g))
        while True:
            led.commit_generation("r", record(g, N, samples=True))
            pipe.send(("committed", g))
            g += 1


def _check(path, committed: set[int]) -> int:
    engine = make_engine(to_url(path))
    try:
        con = engine.connect().execution_options(driver_column_names=True)
        if con.dialect.name == "sqlite":
            assert con.exec_driver_sql("PRAGMA integrity_check").fetchone() == ("ok",)
            assert con.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
        gens = con.exec_driver_sql(
            "SELECT id, idx, population, keys, coefficients FROM generations ORDER BY idx"
        ).fetchall()
        assert [g[1] for g in gens] == list(range(1, len(gens) + 1))
        for gid, _idx, pop, keys, coefs in gens:
            members = con.execute(
                sa.text("SELECT key, coefficient FROM members WHERE generation_id = :g ORDER BY idx"),
                {"g": gid},
            ).fetchall()
            assert pop == N and len(members) == N and len(keys) == len(coefs) == 8 * N
            assert [k for k, _ in members] == list(struct.unpack(f"<{N}q", keys))
        assert committed <= {g[1] for g in gens}
        con.close()
        return len(gens)
    finally:
        engine.dispose()


@pytest.mark.slow
def test_sigkill_while_committing(ledger_url):
    path = ledger_url
    with Ledger.open(path) as led:
        new_run(led, "r")
    rng = random.Random(5)
    committed: set[int] = set()
    trials = 20 if "://" not in path else 10
    for _ in range(trials):
        parent, child = FORK.Pipe()
        p = FORK.Process(target=_writer, args=(path, child))
        p.start()
        assert parent.poll(30)
        assert parent.recv()[0] == "ready"
        # one commit first, so each holder makes progress however slow the machine; then a
        # kill at a random moment: sometimes mid-commit, sometimes between commits
        assert parent.poll(30)
        kind, g = parent.recv()
        assert kind == "committed"
        committed.add(g)
        parent.poll(rng.uniform(0.0, 0.15))
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        while parent.poll():
            kind, g = parent.recv()
            if kind == "committed":
                committed.add(g)
        total = _check(path, committed)
    assert total >= trials  # progress was made; the dead holders' leases were taken over
    with Ledger.open(path) as led:
        assert len(led.replay_history("r")) == total
        assert len(led.events("r", "lease-takeover")) == trials - 1
