"""SIGINT and SIGTERM stop train, resume and fork the same way (issue 13 item 13, issue 14
item 1), through the console script with real signals: one line naming the `resume`
command, exit 130 / 143, the run marked `interrupted`, an `interrupted` event, no lease.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

from tests.support.cli import script
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


def _status(db: Path, run: str) -> str | None:
    if not db.exists():
        return None
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = con.execute("SELECT status FROM runs WHERE name = ?", (run,)).fetchone()
    except sqlite3.OperationalError:  # the ledger is still being created
        return None
    finally:
        con.close()
    return row[0] if row else None


def _interrupt(cli: Cli, run: str, sig: signal.Signals, *args: str) -> tuple[int, list[str]]:
    """Start `seedledger ARGS --json`, send `sig` once `run` is training, return (exit
    code, stderr lines)."""
    proc = subprocess.Popen(
        [*script(), *args, "--json"], cwd=cli.workdir, env=cli.env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while _status(cli.workdir / "ledger.db", run) != "training":
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never started training"
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert out == "" and "Traceback" not in err, err
    return proc.returncode, [ln for ln in err.splitlines() if ln.strip()]


def _stopped(cli: Cli, run: str, sig: signal.Signals) -> None:
    """`run` is marked interrupted, its last event says by which signal, no lease is left."""
    log = cli.json("log", run)
    assert log["run"]["status"] == "interrupted"
    kinds = [e["kind"] for e in log["events"]]
    assert kinds[-2:] == ["interrupted", "lease-released"], kinds
    event = log["events"][-2]["payload"]
    assert event == {"signal": sig.name, "generation": log["run"]["generations"]}
    con = sqlite3.connect(cli.workdir / "ledger.db")
    try:
        assert con.execute("SELECT count(*) FROM leases").fetchone()[0] == 0
    finally:
        con.close()


def test_sigint_and_sigterm_stop_train_resume_and_fork(tmp_path):
    cli = Cli(tmp_path)
    # Exact σ: no rounding note on stderr. Dense `loglik` fitness: every generation has signal,
    # so whichever generation a signal stops at, no no-signal warning joins the one line (the
    # decoded rewards tie at generation 2, and a stop at 1 made resume print its warning).
    dense = {"name": "arithmetic", "rewards": ["loglik"]}
    (tmp_path / "c.yaml").write_text(tiny_config(generations=50, sigma=2**-10, task=dense))

    code, lines = _interrupt(cli, "r", signal.SIGTERM, "train", "c.yaml", "--run", "r")
    assert code == 143 and len(lines) == 1, lines
    assert lines[0].startswith("interrupted by SIGTERM: run r stopped at generation ")
    assert lines[0].endswith("; continue with `seedledger resume r`"), lines[0]
    _stopped(cli, "r", signal.SIGTERM)

    code, lines = _interrupt(cli, "r", signal.SIGINT, "resume", "r")
    assert code == 130 and len(lines) == 1 and "interrupted by SIGINT: run r" in lines[0], lines
    assert "`seedledger resume r`" in lines[0]
    _stopped(cli, "r", signal.SIGINT)

    code, lines = _interrupt(cli, "f", signal.SIGTERM, "fork", "r@0", "--run", "f")
    assert code == 143 and len(lines) == 1 and "run f stopped" in lines[0], lines
    assert "`seedledger resume f`" in lines[0]
    _stopped(cli, "f", signal.SIGTERM)

    # the lease is free: the interrupted runs resume at once
    assert cli.json("resume", "f", "--generations", "0")["run"] == "f"
