"""The writer lease comes before any work: a second `resume` of a run that is training is
refused at once, naming the holder, and leaves no trace; a fork whose setup fails leaves
no empty child behind."""

from __future__ import annotations

import sqlite3
import subprocess
import time

import pytest
from test_cli_walkthrough import Cli

from seedledger.ledger import Ledger
from seedledger.ledger.errors import RunNotFound, SeedLedgerError
from tests.support.cli import script
from tests.support.configs import tiny_config

CONFIG = tiny_config(generations=1)


def _lease_and_resume(ledger, pid: int) -> tuple[bool, int]:
    """(does `pid` hold the lease, how many resume events) read straight from the file."""
    con = sqlite3.connect(f"file:{ledger}?mode=ro", uri=True)
    try:
        held = con.execute("SELECT count(*) FROM leases WHERE pid = ?", (pid,)).fetchone()[0] == 1
        resumes = con.execute("SELECT count(*) FROM events WHERE kind = 'resume'").fetchone()[0]
    finally:
        con.close()
    return held, resumes


@pytest.mark.slow
def test_a_second_resume_is_refused_before_it_loads_anything(tmp_path):
    cli = Cli(tmp_path)
    (tmp_path / "c.yaml").write_text(CONFIG)
    cli.json("train", "c.yaml", "--run", "r")
    ledger = tmp_path / "ledger.db"

    with open(tmp_path / "first.out", "w") as out:
        first = subprocess.Popen(
            [*script(), "resume", "r", "--generations", "100", "--json"],
            cwd=tmp_path, env=cli.env, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 240
        while _lease_and_resume(ledger, first.pid) != (True, 1):  # leased, set up, training
            assert first.poll() is None, (tmp_path / "first.out").read_text()
            assert time.monotonic() < deadline, "the first resume never started training"
            time.sleep(0.5)

        started = time.perf_counter()
        line = cli.bad("resume", "r")
        seconds = time.perf_counter() - started
        assert "being written by" in line and f"pid {first.pid}" in line and "since" in line, line
        import socket

        assert f"host {socket.gethostname()}" in line
        # nothing was loaded or replayed, and the audit trail holds no false resume
        assert _lease_and_resume(ledger, first.pid) == (True, 1)
        assert first.poll() is None, "the refused resume disturbed the one training"
        assert seconds < 60, f"refusal took {seconds:.1f}s"
    finally:
        first.kill()
        first.wait()


def test_a_fork_whose_setup_fails_leaves_no_empty_child(tmp_path, monkeypatch):
    from seedledger.engine.runtime import session

    with Ledger.open(tmp_path / "l.db") as led:
        led.create_run("p", base_model="tiny", noise_spec="v1", run_key=1, config={"model": "tiny"})

        def broken(cfg, model_dir):
            held = led.lease("child")
            with pytest.raises(SeedLedgerError, match="being written by"):
                held.acquire()  # the child is leased while its model loads
            raise SeedLedgerError("model exploded")

        monkeypatch.setattr(session, "resolve_model", lambda name: tmp_path)
        monkeypatch.setattr(session, "make_pool", broken)
        with pytest.raises(SeedLedgerError, match="model exploded"):
            session.fork(led, "p@0", "child", [], 1)
        with pytest.raises(RunNotFound):
            led.get_run("child")
        assert [k for k, _ in led.children("p")] == []
