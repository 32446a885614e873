"""The command-line contract beyond the walkthrough, through the console script.

One-line usage errors (exit 2); read-only commands that never create a ledger;
`--no-upgrade`; `db upgrade` naming its backup; `rebuild -o` that never destroys what
it did not write; `rebuild --verify every|end`; how `rebuild` tells a run from a seed
file; `verify` failing (exit 1) on a tampered ledger, with the report and the event.
One `tiny` run is trained once for the module; tests that tamper work on copies.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow

CONFIG = tiny_config(sigma=0.05, lr=0.01)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """A ledger holding run `r` (2 generations); returns (ledger file, train's --json)."""
    work = tmp_path_factory.mktemp("trained")
    (work / "c.yaml").write_text(CONFIG)
    out = Cli(work).json("train", "c.yaml", "--run", "r")
    assert out["generations_committed"] == [1, 2]
    return work / "ledger.db", out


@pytest.fixture
def cli(tmp_path, trained) -> Cli:
    """A fresh working directory whose ledger is a copy of the trained one."""
    shutil.copy(trained[0], tmp_path / "ledger.db")
    return Cli(tmp_path)


def _tamper_fingerprint(ledger: Path, generation: int) -> None:
    """A wrong recorded fingerprint in a ledger whose hash chain agrees with it (as a faulty
    writer would leave it), so that the replay, not the chain check, finds it."""
    from tests.support.ledgercopy import rechain

    con = sqlite3.connect(ledger)
    with con:
        n = con.execute(
            "UPDATE generations SET fingerprint = ? WHERE idx = ?", ("0" * 32, generation)
        ).rowcount
    con.close()
    assert n == 1
    rechain(str(ledger))


# -- usage errors -----------------------------------------------------------------------


def test_usage_errors_are_one_line_and_exit_2(tmp_path):
    cli = Cli(tmp_path)
    assert "--bogus" in cli.bad("log", "--bogus")
    assert "--output" in cli.bad("rebuild", "r")  # -o is required
    assert "ref" in cli.bad("verify").lower()
    assert "every" in cli.bad("rebuild", "r", "-o", "x", "--verify", "sometimes")
    assert "--bogus" in cli.bad("--bogus")
    assert "Usage:" in cli.run("log", "--help").stdout  # help still works
    assert "Usage:" in cli.run("--debug", "log", "--bogus", code=2).stderr  # the full block


# -- ledgers: never created by a reader; --no-upgrade; db upgrade's backup ------------------


@pytest.mark.parametrize(
    "args",
    [
        ["log"],
        ["log", "r"],
        ["show", "r@1"],
        ["diff", "r@1", "r@2"],
        ["verify", "r"],
        ["export", "r@1", "-o", "x.seeds"],
        ["plot", "r", "-o", "x.png"],
        ["rebuild", "r@1", "-o", "out"],
        ["resume", "r"],
        ["fork", "r@1", "--run", "s"],
    ],
    ids=lambda a: a[0] + ("-" + a[1] if a[0] == "log" and len(a) > 1 else ""),
)
def test_commands_that_read_do_not_create_a_ledger(tmp_path, args):
    cli = Cli(tmp_path)
    line = cli.bad(*args, "--ledger", "typo.db")
    assert "no ledger at typo.db" in line or "typo.db" in line, line
    assert not (tmp_path / "typo.db").exists()


def test_no_upgrade_refuses_an_old_schema_and_db_upgrade_names_its_backup(tmp_path):
    from seedledger.ledger import migrate

    old = tmp_path / "old.db"
    migrate.upgrade(str(old), "0001")
    cli = Cli(tmp_path)
    line = cli.bad("--no-upgrade", "log", "--ledger", str(old))
    assert "seedledger db upgrade" in line and "0001" in line
    assert migrate.current(str(old)) == "0001", "--no-upgrade left the ledger as it was"

    out = cli.json("db", "upgrade", "--ledger", str(old))
    assert out["before"] == "0001" and out["revision"] == migrate.head()
    backup = Path(out["backup"])
    assert backup.is_file() and backup.name.startswith("old.db.bak-0001-")
    assert migrate.current(str(backup)) == "0001"
    assert "already at revision" in cli.run("db", "upgrade", "--ledger", str(old)).stdout

    again = tmp_path / "again.db"
    migrate.upgrade(str(again), "0001")
    human = cli.run("db", "upgrade", "--ledger", str(again)).stdout
    assert "backed up at" in human and str(tmp_path / "again.db.bak-0001-") in human

    silently = tmp_path / "silently.db"  # any command upgrades an old ledger, and says so
    migrate.upgrade(str(silently), "0001")
    notice = cli.run("log", "--ledger", str(silently)).stderr
    assert "upgraded schema 0001 ->" in notice and "silently.db.bak-0001-" in notice
    assert migrate.current(str(silently)) == migrate.head()


# -- rebuild -o: refuse to destroy ---------------------------------------------------------


def test_rebuild_never_replaces_what_it_did_not_write(cli, trained):
    work = cli.workdir
    ledger = work / "ledger.db"
    before = ledger.read_bytes()

    # `-o .` would have removed the working directory and the ledger with it
    assert "current directory" in cli.bad("rebuild", "r@1", "-o", ".")
    assert "current directory" in cli.bad("rebuild", "r@1", "-o", ".", "--force")
    assert ledger.read_bytes() == before

    mine = work / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert "not empty" in cli.bad("rebuild", "r@1", "-o", "mine")
    assert (mine / "notes.txt").read_text() == "keep me"
    (work / "sub").mkdir()
    shutil.copy(ledger, work / "sub" / "l.db")
    line = cli.bad("rebuild", "r@1", "-o", "sub", "--force", "--ledger", "sub/l.db")
    assert "holds the ledger" in line and (work / "sub" / "l.db").is_file()
    assert "not a directory" in cli.bad("rebuild", "r@1", "-o", "ledger.db")

    # an earlier rebuild output is replaced (its marker file says what it is) ...
    first = cli.json("rebuild", "r@1", "-o", "model")
    assert json.loads((work / "model" / "seedledger.json").read_text())["generation"] == 1
    second = cli.json("rebuild", "r@2", "-o", "model")
    assert json.loads((work / "model" / "seedledger.json").read_text())["generation"] == 2
    assert second["fingerprint"] == trained[1]["fingerprint"] != first["fingerprint"]
    # ... and so is anything else with --force; no staging directories are left behind
    cli.json("rebuild", "r@2", "-o", "mine", "--force")
    assert not (mine / "notes.txt").exists() and (mine / "seedledger.json").is_file()
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []


def test_rebuild_verify_every_checks_each_generation_and_end_only_the_last(cli):
    _tamper_fingerprint(cli.workdir / "ledger.db", 1)
    end = cli.json("rebuild", "r@2", "-o", "end", "--verify", "end")
    assert end["verify"] == "end" and end["generation"] == 2
    line = cli.bad("rebuild", "r@2", "-o", "every", "--verify", "every", code=1)
    assert "generation 1" in line
    assert not (cli.workdir / "every").exists()


def test_rebuild_tells_a_run_from_a_seed_file(cli, trained):
    work = cli.workdir
    cli.json("export", "r@2", "-o", "r2.seeds")
    (work / "r").write_bytes((work / "r2.seeds").read_bytes())  # a file named like the run
    line = cli.bad("rebuild", "r", "-o", "out")
    assert "both a run" in line and "./r" in line
    from_file = cli.json("rebuild", "./r", "-o", "out", "--base", "tiny")  # the file, explicitly
    assert from_file["fingerprint"] == trained[1]["fingerprint"]
    assert "neither a run" in cli.bad("rebuild", "nope", "-o", "out2")


# -- verify: a tampered ledger fails (exit 1), reported and logged ---------------------------


def test_verify_names_the_first_generation_that_does_not_replay(cli):
    _tamper_fingerprint(cli.workdir / "ledger.db", 1)
    proc = cli.run("verify", "r", "--json", code=1)
    report = json.loads(proc.stdout)
    assert report["ok"] is False and report["first_bad_generation"] == 1
    assert report["run"] == "r" and report["generation"] == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "generation 1" in lines[0] and "Traceback" not in proc.stderr
    assert "generation 1" in cli.bad("verify", "r", code=1)

    events = [e for e in cli.json("log", "r")["events"] if e["kind"] == "verify"]
    assert [e["payload"]["ok"] for e in events] == [False, False]
    assert events[0]["payload"]["first_bad_generation"] == 1
    assert "does not replay" in events[0]["payload"]["error"]


# -- demo --json: the figures as one JSON document, the demo's own table on stderr ----------


def test_demo_json_prints_only_the_figures(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from seedledger.engine.cli import app
    from seedledger.engine.cli import demo as demo_command

    seen = {}

    def fake_demo(workdir, generations=None, config=None, overrides=()):
        seen["args"] = (workdir, generations)
        seen["config"] = config
        seen["overrides"] = list(overrides)
        print("a table the demo prints")  # must not reach stdout under --json
        return {"generations": generations, "verified": True}

    monkeypatch.setattr(demo_command, "run_demo", fake_demo)
    result = CliRunner().invoke(
        app, ["demo", "--workdir", str(tmp_path), "-n", "3", "--set", "population=30", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"generations": 3, "verified": True}
    assert seen["args"] == (tmp_path, 3) and seen["overrides"] == ["population=30"]
    assert seen["config"] == demo_command.CONFIG  # the built-in demo unless --config
