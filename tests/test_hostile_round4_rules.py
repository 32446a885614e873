"""Issue 46 item 14, round 4: replaying an int8 kind accepted Adam or momentum state that
its run's config refuses (CMA-ES applies its update as is: SGD only), and the rebuild-memory
estimate counted that state. A replay now refuses a generation whose update rule no run of
its config records, before the estimate and before any state exists (replay.rules). The
ledger is edited with sqlite3 and its hash chain recomputed, as its author could."""

from __future__ import annotations

import sqlite3

import pytest
from test_cli_walkthrough import Cli

import seedledger as sl
from tests.support.ledgerforge import rechain

pytestmark = pytest.mark.slow

CONFIG = {
    "model": "tiny", "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
    "train": {"kind": "quant_scales", "targets": ["q_proj", "v_proj"]}, "algorithm": "cmaes", "mirrored": False,
    "population": 4, "sigma": 1e-4, "lr": 1e-4, "generations": 1, "batch_size": 2, "max_new_tokens": 4, "seed": 3,
}


def test_an_int8_run_replays_only_the_update_rules_its_config_applies(tmp_path):
    from seedledger.engine.config import validate
    from seedledger.engine.rebuild.memory import model_params
    from seedledger.engine.runtime.models.resolve import resolve_model

    with pytest.raises(sl.SeedLedgerError, match="optimizer must be sgd"):  # what the config refuses
        validate(CONFIG | {"optimizer": "adam"})
    led = tmp_path / "l.db"
    sl.train(CONFIG, run="q", ledger=led)
    base, _ = model_params(resolve_model("tiny"), None)
    cli = Cli(tmp_path, "l.db")
    cli.env["SEEDLEDGER_REBUILD_MEMORY_MB"] = str(8 * base / 2**20)  # the fp32 base fits; Adam's moments would not
    assert cli.json("verify", "q")["ok"]

    for rule in ("adam", "momentum"):
        con = sqlite3.connect(led)
        with con:
            con.execute("UPDATE generations SET optimizer = json_set(optimizer, '$.name', ?) WHERE idx = 1", (rule,))
        con.close()
        rechain(led)  # the rows agree with their digests: only the rule is wrong
        said = (f"run 'q' generation 1 records update rule '{rule}', which its config (algorithm cmaes) does not "
                "apply (sgd): no training run records that; refused before replaying it")
        assert cli.bad("verify", "q").endswith(said)  # not the memory estimate's refusal
        assert cli.bad("rebuild", "q", "-o", "out").endswith(said)
        assert cli.bad("resume", "q", "-n", "1").endswith(said)
        assert not (tmp_path / "out").exists()
