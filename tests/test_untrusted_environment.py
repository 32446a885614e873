"""The environment as an adversary: missing or read-only directories, an anchor that cannot
be written, umask, URL passwords and empty files, each met with one line and exit 2 and
nothing committed lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

from tests.support.cli import script
from tests.support.configs import tiny_config
from tests.test_untrusted_cli import _runs, copy_of, train_r


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    return train_r(tmp_path_factory.mktemp("trained"))


@pytest.fixture
def cli(tmp_path, trained) -> Cli:
    return copy_of(trained, tmp_path)


def test_environment_errors_are_one_line_and_exit_2(cli):
    work = cli.workdir
    (work / "afile").write_text("not a directory")
    assert "missing" in cli.bad("export", "r", "-o", "missing/x.seeds")
    assert "afile" in cli.bad("export", "r", "-o", "afile/x.seeds")
    assert "afile" in cli.bad("rebuild", "r", "-o", "afile/out")
    for device in ("cuda:99", "nonsense"):
        assert f"device {device!r}" in cli.bad("verify", "r", "--device", device)
        assert f"device {device!r}" in cli.bad("train", "c.yaml", "--run", "d", "--set", f"device={device}")
    assert _runs(cli) == ["r"]
    assert "~nouser" in cli.bad("log", "--ledger", "~nouser_seedledger/x.db")

    # ?mode=ro is honoured: reads work and say nothing, writes are refused in one line
    ro = f"sqlite:///{work / 'ledger.db'}?mode=ro"
    proc = cli.run("log", "--ledger", ro, "--json")
    assert proc.stderr == "" and [r["name"] for r in json.loads(proc.stdout)] == ["r"]
    assert "read-only" in cli.bad("import", "r.seeds", "--run", "z", "--ledger", ro)
    assert _runs(cli) == ["r"]


def test_an_anchor_that_cannot_be_written_names_its_committed_generation(tmp_path):
    cli = Cli(tmp_path)
    # σ = 2⁻¹⁰ is applied as given (no rounding note), so stderr holds the error line alone
    (tmp_path / "c.yaml").write_text(tiny_config(generations=1, anchor_every=1, sigma=2**-10))
    (tmp_path / "ledger.db.anchors").write_text("a file where the anchors directory goes")
    line = cli.bad("train", "c.yaml", "--run", "a", "--json")
    assert "a@1 is committed, but its anchor could not be written" in line, line
    log = cli.json("log", "a")
    assert [g["generation"] for g in log["generations"]] == [1]
    error = [e for e in log["events"] if e["kind"] == "error"][-1]["payload"]
    assert error["generation"] == 1 and error["error"] == "AnchorWriteError"


# -- item 11: read-only ledgers, shared files -----------------------------------------------


def _read_only(cli: Cli, directory: Path, *args: str) -> subprocess.CompletedProcess:
    """`seedledger ARGS` with `directory` read-only: a read-only bind mount when root can
    make one (root ignores permissions), else the directory's permissions."""
    cmd = [*script(), *args]
    if os.geteuid() == 0:
        if shutil.which("unshare") is None:
            pytest.skip("root without unshare cannot make a read-only directory")
        remount = 'mount --bind -o ro "$0" "$0" && exec "$@"'
        cmd = ["unshare", "-m", "sh", "-c", remount, str(directory), *cmd]
    else:
        directory.chmod(0o555)
    try:
        return subprocess.run(cmd, cwd=cli.workdir, env=cli.env, capture_output=True, text=True, timeout=300)
    finally:
        directory.chmod(0o755)


@pytest.mark.slow
def test_a_read_only_ledger_reads_and_verifies(cli):
    work = cli.workdir
    shelf = work / "shelf"
    shelf.mkdir()
    shutil.copy(work / "ledger.db", shelf / "ledger.db")
    before = sorted(p.name for p in shelf.iterdir())
    ledger = ["--ledger", str(shelf / "ledger.db")]
    probe = _read_only(cli, shelf, "log", *ledger, "--json")
    if probe.returncode != 0 and "mount" in probe.stderr:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.strip()}")
    assert probe.returncode == 0 and probe.stderr == "", probe.stderr
    assert [r["name"] for r in json.loads(probe.stdout)] == ["r"]
    proc = _read_only(cli, shelf, "verify", "r", *ledger, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and "read-only" in report["event_error"]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: the verify event was not recorded"), lines
    proc = _read_only(cli, shelf, "export", "r", "-o", str(work / "ro.seeds"), *ledger)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in shelf.iterdir()) == before  # no -wal, no -shm, no upgrade


def test_published_files_follow_the_umask(cli):
    old = os.umask(0o002)  # inherited by the console script
    try:
        cli.json("export", "r", "-o", "shared.seeds")
        cli.json("rebuild", "r", "-o", "model")
    finally:
        os.umask(old)
    work = cli.workdir
    assert (work / "shared.seeds").stat().st_mode & 0o777 == 0o664
    assert (work / "model").stat().st_mode & 0o777 == 0o775
    assert {p.stat().st_mode & 0o777 for p in (work / "model").iterdir()} == {0o664}


# -- items 12 and 13: secrets and stale state -----------------------------------------------------


def test_a_ledger_url_password_is_never_shown(cli):
    url = "postgresql://user:s3cret-pw@127.0.0.1:1/db"
    for args in (["log", "--ledger", url], ["train", "c.yaml", "--run", "p", "--ledger", url]):
        proc = cli.run(*args, code=2)
        assert "s3cret" not in proc.stdout + proc.stderr and "***" in proc.stderr, proc.stderr
        assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1


def test_readers_never_turn_an_empty_file_into_a_ledger(cli):
    empty = cli.workdir / "empty.db"
    empty.touch()
    for args in (["log"], ["show", "r@1"], ["verify", "r"], ["export", "r", "-o", "e.seeds"]):
        assert "not a ledger" in cli.bad(*args, "--ledger", str(empty))
    assert empty.stat().st_size == 0 and not (cli.workdir / "empty.db-wal").exists()
