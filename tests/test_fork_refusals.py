"""A fork's refusals come before its child run exists (issue 31 item 6), through the console
script: forking LM-MA-ES with another path layout is one line, exit 2, and leaves the name free."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from seedledger.ledger import Ledger
from tests.support.runs import cli as seedledger
from tests.test_lmmaes_run import CONFIG

ROOT = Path(__file__).resolve().parents[1]



@pytest.fixture(scope="module")
def lm_ledger(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forks")
    (tmp / "lm.yaml").write_text(yaml.safe_dump(CONFIG))  # lmmaes.memory: 3
    seedledger("train", tmp / "lm.yaml", "--run", "l", "--generations", "1", "--ledger", tmp / "l.db")
    return tmp / "l.db"


def runs(db: Path) -> list[str]:
    with Ledger.open(str(db), create=False) as led:
        return sorted(r.name for r in led.list_runs())


@pytest.mark.parametrize("change", ["lmmaes.memory=4", "lmmaes.adapt_sigma=false", "lmmaes.memory=null"])
def test_an_lmmaes_fork_that_changes_its_paths_is_refused_before_the_child_exists(lm_ledger, change):
    """memory 4 and adapt_sigma are refused from the records alone; the default memory
    (4 + ⌊3 ln n⌋, from the loaded weights) while the fork is set up, its child deleted."""
    sets = [change] if change != "lmmaes.adapt_sigma=false" else [change, "sigma=0.05"]
    args = [a for s in sets for a in ("--set", s)]
    proc = seedledger("fork", "l@1", "--run", "c", *args, "--ledger", lm_ledger, check=False)
    *notes, error = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "memory 3" in error and "a fork keeps both" in error, proc.stderr
    assert all(line.startswith("note:") for line in notes), proc.stderr
    if change != "lmmaes.memory=null":
        assert not notes
    assert runs(lm_ledger) == ["l"]


def test_the_refused_name_stays_free(lm_ledger):
    seedledger("fork", "l@1", "--run", "c", "--generations", "1", "--set", "lmmaes.memory=4",
               "--ledger", lm_ledger, check=False)
    seedledger("fork", "l@1", "--run", "c", "--generations", "1", "--ledger", lm_ledger)
    with Ledger.open(str(lm_ledger), create=False) as led:
        assert led.latest_generation("c") == 2 and led.get_run("c").parent == ("l", 1)
