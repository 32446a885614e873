"""What a rebuild replays has one resolver (engine.rebuild.rebuilding.resolved) and one builder
(`build_master`, `build`) for both kinds of source, a run of the ledger and a seed file:
real SQLite, a real 2-generation run of `tiny`, real replay. The CLI's wording of the same
refusals is checked in tests/test_cli_contract.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import seedledger as sl
from seedledger.engine.rebuild.rebuilding import build, build_master, resolved
from seedledger.engine.rebuild.sources import FileSource, RunSource
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay.fingerprint import fingerprint
from tests.support.configs import TINY


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> tuple[Path, Path]:
    """Run `r` (2 generations) and member 1 of its generation 2 exported as a seed file."""
    where = tmp_path_factory.mktemp("resolver") / "ledger.db"
    assert sl.train(TINY, run="r", ledger=where).latest_generation == 2
    seeds = where.parent / "member.seeds"
    sl.export("r@2#1", seeds, ledger=where)
    return where, seeds


def test_a_member_and_its_seed_file_are_one_record_and_one_build(trained):
    where, seeds = trained
    with Ledger.open(str(where)) as led:
        with resolved("r@2#1", led) as in_ledger, resolved(str(seeds), led) as in_file:
            assert isinstance(in_ledger, RunSource) and isinstance(in_file, FileSource)
            for src in (in_ledger, in_file):
                assert (src.run, src.generation, src.upto, src.member) == ("r", 2, 1, 1)
                assert src.keep == where.resolve()  # the ledger an output never replaces
            _, from_ledger, ledger_meta, checked = build_master(in_ledger)
            _, from_file, file_meta, _ = build_master(in_file)
        assert led.has_run("r")  # an open ledger is the caller's: still open
        parent = led.generation("r", 1).fingerprint
    assert checked == {"verified": True}
    assert ledger_meta == file_meta
    assert fingerprint(from_ledger) == fingerprint(from_file) == ledger_meta["fingerprint"]
    assert ledger_meta["parent_fingerprint"] == parent != ledger_meta["fingerprint"]


def test_a_path_is_a_file_and_a_name_that_is_both_is_refused(trained, tmp_path, monkeypatch):
    where, seeds = trained
    monkeypatch.chdir(tmp_path)
    shutil.copy(seeds, tmp_path / "r")  # a file named as the ledger's run
    with Ledger.open(str(where)) as led:
        with pytest.raises(SeedLedgerError, match=r"'r' is both a run in .* and a file; write \./r for the file"):
            with resolved("r", led):
                pass
        with resolved(Path("r"), led) as src:
            assert isinstance(src, FileSource) and src.member == 1
        with resolved("./r", led) as src:
            assert isinstance(src, FileSource)


def test_neither_a_run_nor_a_file_names_the_missing_ledger_and_creates_none(tmp_path):
    missing = tmp_path / "none.db"
    with pytest.raises(SeedLedgerError, match=r"'nope' is neither a run \(no ledger at .*none\.db\) nor a seed file"):
        with resolved("nope", str(missing)):
            pass
    assert not missing.exists()


def test_a_seed_file_output_never_replaces_the_ledgers_directory(trained):
    where, seeds = trained
    with Ledger.open(str(where)) as led, resolved(seeds, led) as src:
        with pytest.raises(SeedLedgerError, match="holds the ledger"):
            build(src, where.parent, force=True)
    assert where.exists() and seeds.exists()
