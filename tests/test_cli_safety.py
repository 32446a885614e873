"""What seedledger writes never destroys what it did not write, and nothing unchecked is
reported as checked (issue 13, items 1 and 2), through the console script on `tiny`.

`export -o` and `rebuild -o` never write over a ledger (any SQLite database, whatever its
name), write atomically and replace an existing file only with `--force`. A seed file
without fingerprints is data nothing can be checked against: `import` refuses it unless
`--allow-unverified`, and `verify` / `rebuild` of such a run fail saying what is missing.
Hostile seed files are made here, from a real export, with a valid checksum.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict]:
    """A ledger holding run `r` (2 generations) and its seed file; (ledger, train's --json)."""
    work = tmp_path_factory.mktemp("trained")
    (work / "c.yaml").write_text(tiny_config(sigma=0.05, lr=0.01))
    cli = Cli(work)
    out = cli.json("train", "c.yaml", "--run", "r")
    cli.json("export", "r", "-o", "r.seeds")
    return work / "ledger.db", out


@pytest.fixture
def cli(tmp_path, trained) -> Cli:
    """A fresh working directory with a copy of the trained ledger and its seed file."""
    shutil.copy(trained[0], tmp_path / "ledger.db")
    shutil.copy(trained[0].with_name("r.seeds"), tmp_path / "r.seeds")
    return Cli(tmp_path)


def _no_leftovers(work: Path) -> None:
    assert sorted(p.name for p in work.iterdir() if p.name.startswith(".")) == []


# -- export -o / rebuild -o: never over a ledger, never a silent clobber ----------------------


def test_export_never_writes_over_a_ledger(cli):
    work = cli.workdir
    ledger = work / "ledger.db"
    before = ledger.read_bytes()
    for extra in ([], ["--force"]):
        line = cli.bad("export", "r", "-o", "ledger.db", "--ledger", "ledger.db", *extra)
        assert "SQLite" in line and "ledger" in line, line
        assert ledger.read_bytes() == before
    # any SQLite database, whatever its name, and the WAL beside one
    shutil.copy(ledger, work / "notes.txt")
    assert "SQLite" in cli.bad("export", "r", "-o", "notes.txt", "--force")
    assert (work / "notes.txt").read_bytes() == before
    shutil.copy(ledger, work / "other.db")
    (work / "other.db-wal").write_bytes(b"wal frames")
    assert "SQLite" in cli.bad("export", "r", "-o", "other.db-wal", "--force")
    assert (work / "other.db-wal").read_bytes() == b"wal frames"
    _no_leftovers(work)


def test_export_to_a_directory_is_bad_input(cli):
    (cli.workdir / "out").mkdir()
    for extra in ([], ["--force"]):
        assert "is a directory" in cli.bad("export", "r", "-o", "out", *extra)
    assert list((cli.workdir / "out").iterdir()) == []


def test_export_replaces_an_existing_file_only_with_force(cli):
    from ledger.seedfile import read_seedfile
    from replay.noise import member_key

    work = cli.workdir
    seeds = work / "r.seeds"
    cli.json("export", "r@1", "-o", "r1.seeds")
    first = (work / "r1.seeds").read_bytes()
    assert "--force" in cli.bad("export", "r@2", "-o", "r1.seeds")
    assert (work / "r1.seeds").read_bytes() == first
    (work / "mine.txt").write_text("keep me")
    assert "--force" in cli.bad("export", "r@2", "-o", "mine.txt")
    assert (work / "mine.txt").read_text() == "keep me"

    out = cli.json("export", "r@2", "-o", "r1.seeds", "--force")
    assert out["generation"] == 2 and out["bytes"] == (work / "r1.seeds").stat().st_size
    assert (work / "r1.seeds").read_bytes() != first
    assert read_seedfile(work / "r1.seeds", key_fn=member_key).generation == 2
    assert read_seedfile(seeds, key_fn=member_key).generation == 2
    _no_leftovers(work)


def test_rebuild_never_replaces_a_ledger(cli):
    work = cli.workdir
    ledger = work / "ledger.db"
    before = ledger.read_bytes()
    line = cli.bad("rebuild", "r", "-o", "ledger.db", "--force")
    assert "not a directory" in line and "ledger" in line
    (work / "models").mkdir()
    shutil.copy(ledger, work / "models" / "old.bin")  # a ledger by another name, inside
    line = cli.bad("rebuild", "r", "-o", "models", "--force")
    assert "SQLite" in line and "old.bin" in line
    assert (work / "models" / "old.bin").read_bytes() == before == ledger.read_bytes()
    _no_leftovers(work)
