"""Seed files carry each lineage segment's perturbation kind, through the console script:
a low-rank `tiny` run forked to full rank exports, imports into a fresh ledger and
rebuilds / verifies to the same fingerprints (issue 13, seed-file trust of low-rank runs).
"""

from __future__ import annotations

import pytest
from test_cli_walkthrough import Cli

from seedledger.ledger.seedfile import read_seedfile
from seedledger.replay.noise import member_key
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow


def test_a_fork_that_changed_kind_round_trips_through_a_seed_file(tmp_path):
    src, dst = Cli(tmp_path / "src"), Cli(tmp_path / "dst")
    for cli in (src, dst):
        cli.workdir.mkdir()
    (src.workdir / "c.yaml").write_text(tiny_config(sigma=0.05, lr=0.01))
    low = src.json("train", "c.yaml", "--run", "low", "--set", "perturbation=lowrank")
    full = src.json("fork", "low@2", "--run", "full", "--set", "perturbation=full", "--generations", "1")
    src.json("export", "full", "-o", "full.seeds")
    src.json("export", "low", "-o", str(dst.workdir / "low.seeds"))

    sf = read_seedfile(src.workdir / "full.seeds", key_fn=member_key)
    kinds = [(s["run"], s["first"], s["last"], s["noise_spec"], s["param_selection"]) for s in sf.header["segments"]]
    assert [k[:3] for k in kinds] == [("low", 1, 2), ("full", 3, 3)]
    assert kinds[0][3] == "lowrank-v1:r=1" and kinds[0][4].startswith("suffix:q_proj,")
    assert kinds[1][3:] == ("v1", "all")

    # from the file alone, in a directory with no ledger
    rebuilt = dst.json("rebuild", str(src.workdir / "full.seeds"), "--base", "tiny", "-o", "m", "--verify", "every")
    assert rebuilt["fingerprint"] == full["fingerprint"] and rebuilt["verified"] is True

    # imported as one run that keeps each generation's kind
    assert dst.json("import", str(src.workdir / "full.seeds"), "--run", "copy")["latest_generation"] == 3
    assert dst.json("import", "low.seeds", "--run", "low-copy")["latest_generation"] == 2
    report = dst.json("verify", "copy")
    assert report["ok"] is True and report["fingerprint"] == full["fingerprint"]
    assert dst.json("verify", "low-copy")["fingerprint"] == low["fingerprint"]
    assert dst.json("rebuild", "copy", "-o", "m2")["fingerprint"] == full["fingerprint"]

    # and out again: the re-export has the same segments' kinds
    dst.json("export", "copy", "-o", "again.seeds")
    again = read_seedfile(dst.workdir / "again.seeds", key_fn=member_key)
    assert [(s["first"], s["last"], s["noise_spec"], s["param_selection"]) for s in again.header["segments"]] == [
        k[1:] for k in kinds
    ]
