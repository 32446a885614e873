"""A full disk, for real: a size-limited tmpfs mounted by the test (root only; skipped with
the reason elsewhere). A commit that hits ENOSPC exits 2 with the ledger intact; the run,
left `training` under the dead session's lease because its clean-up writes failed too, is
taken over by the next `resume` (`--take-over` when the lease names another host) and
reaches the bits of an uninterrupted run. `export` and `rebuild -o` leave nothing behind."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import uuid

import pytest
from test_cli_walkthrough import Cli

from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture
def small_fs(tmp_path):
    """mount(size) -> a fresh tmpfs of that size under tmp_path, unmounted afterwards."""
    mounted = []

    def mount(size: str):
        where = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
        where.mkdir()
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a size-limited tmpfs here: {proc.stderr.strip() or 'not root'}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(path) -> None:
    """Fill the filesystem holding `path` (a new file) to the last byte."""
    with open(path, "wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(bytes(1 << 16))
    with open(path, "ab", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 2-generation run on an ordinary disk: its ledger and fingerprint."""
    d = tmp_path_factory.mktemp("ref")
    (d / "c.yaml").write_text(tiny_config(generations=2))
    out = Cli(d).json("train", "c.yaml", "--run", "r")
    return d, out["fingerprint"]


def _db(path) -> tuple:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        gens = [g for (g,) in con.execute("SELECT idx FROM generations ORDER BY idx")]
        status = con.execute("SELECT status FROM runs").fetchone()[0]
        lease = con.execute("SELECT host, pid FROM leases").fetchall()
        return gens, status, lease
    finally:
        con.close()


def test_commit_hitting_enospc_exits_2_and_the_run_is_taken_over(tmp_path, small_fs, reference):
    fs = small_fs("16m")
    cli = Cli(tmp_path)
    cli.env["SEEDLEDGER_DB"] = str(fs / "ledger.db")
    (tmp_path / "c.yaml").write_text(tiny_config(generations=2))
    assert cli.json("train", "c.yaml", "--run", "r", "--generations", "1")["generations_committed"] == [1]

    # generation 2: the disk fills just before its commit (a failpoint writes a filler file)
    cli.env["SEEDLEDGER_FAILPOINT"] = f"commit@2:fill={fs / 'filler'}"
    line = cli.bad("resume", "r")
    del cli.env["SEEDLEDGER_FAILPOINT"]
    assert "disk is full" in line, line
    gens, status, lease = _db(fs / "ledger.db")
    # intact: generation 1 only; the clean-up writes failed too, so the run is still
    # `training` under the dead session's lease
    assert gens == [1] and status == "training" and len(lease) == 1, (gens, status, lease)

    # space again; as if that session had run on another machine, whose pid no one here can check
    (fs / "filler").unlink()
    con = sqlite3.connect(fs / "ledger.db")
    con.execute("UPDATE leases SET host = 'gpu-box-7'")
    con.commit()
    con.close()
    refused = cli.bad("resume", "r")
    assert "being written by" in refused and "host gpu-box-7" in refused
    assert "last heartbeat" in refused and "seedledger resume r --take-over" in refused

    resumed = cli.run("resume", "r", "--take-over", "--json")
    assert "note: took over the lease of run 'r'" in resumed.stderr and "gpu-box-7" in resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["generations_committed"] == [2] and out["fingerprint"] == reference[1]
    assert cli.json("verify", "r", "--quick")["ok"]
    with sqlite3.connect(fs / "ledger.db") as con:
        (payload,) = con.execute("SELECT payload FROM events WHERE kind = 'lease-takeover'").fetchone()
    assert json.loads(payload)["reason"] == "taken over on request (--take-over)"


def test_export_and_rebuild_leave_nothing_on_a_full_disk(small_fs, reference):
    d, _ = reference
    cli = Cli(d)
    full = small_fs("1m")
    _fill(full / "filler")
    line = cli.bad("export", "r", "-o", str(full / "r.seeds"))
    assert "no space left on device" in line and "nothing was left behind" in line
    assert os.listdir(full) == ["filler"]

    small = small_fs("2m")  # the tiny model's 13 MB of weights cannot fit: full mid-write
    line = cli.bad("rebuild", "r", "-o", str(small / "model"))
    assert "no space left on device" in line and "nothing was left behind" in line
    assert os.listdir(small) == []
