"""Hostile ledgers against `seedledger tune` and `pbt` (issue 31 item 1), through the console
script: planted trial runs and forged Optuna trials are held to the study file, a planted
run's reward code is imported only with --trust-code, and a forged `pbt-score` is not adopted."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml

from seedledger.ledger import Ledger
from tests.support import ledgerforge
from tests.support.configs import tiny_config
from tests.support.runs import cli as seedledger

ROOT = Path(__file__).resolve().parents[1]
LR = 0.01
STUDY = {
    "config": "tiny.yaml", "study": "s", "trials": 1, "objective": {"rows": 2, "every": 0},
    "sampler": {"name": "random", "seed": 3}, "pruner": {"name": "none"},
    "space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
}
EVIL = """\
from pathlib import Path
Path(__file__).with_name("pwned").write_text("imported")


def f(prompts, completions, **columns):
    return [0.0] * len(completions)
"""



def refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def write_study(tmp: Path, **changes) -> Path:
    (tmp / "tiny.yaml").write_text(tiny_config(generations=1, evaluation={"rows": 2}))
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump({**STUDY, **changes}))
    return path


def forge_config(db: Path, run: str, change) -> None:
    """Edit run's stored config in place, then recompute the hash chain (a careful forger)."""
    con = sqlite3.connect(db)
    config = json.loads(con.execute("SELECT config FROM runs WHERE name = ?", (run,)).fetchone()[0])
    change(config)
    con.execute("UPDATE runs SET config = ? WHERE name = ?", (json.dumps(config), run))
    con.commit()
    con.close()
    ledgerforge.rechain(db)


def plant_trial(tmp: Path, db: Path, params: dict, *sets: str) -> None:
    """Run `s-t000` made as the study would make trial 0 with `params`, and its event."""
    seedledger("train", str(tmp / "tiny.yaml"), "--run", "s-t000", "--generations", "0",
               *(a for s in sets for a in ("--set", s)), "--ledger", str(db))
    with Ledger.open(str(db)) as led:
        led.log_event("s-t000", "tune-trial", {"study": "s", "trial": 0, "params": params})


def test_a_planted_trials_reward_code_runs_only_with_trust(tmp_path):
    """The planted run is what the study makes for its parameters but for a task naming
    reward code: refused in one line with nothing imported, then trained with --trust-code."""
    study = write_study(tmp_path, space={"lr": {"type": "categorical", "choices": [LR]}})
    db = tmp_path / "l.db"
    plant_trial(tmp_path, db, {"lr": LR}, f"lr={LR}")
    (tmp_path / "evil.py").write_text(EVIL)
    evil = {"name": "arithmetic", "rewards": ["task", {"fn": f"{tmp_path / 'evil.py'}:f"}]}
    forge_config(db, "s-t000", lambda c: c.update(task=evil))

    refused(seedledger("tune", str(study), "--ledger", str(db), check=False), "--trust-code", "evil.py")
    assert not (tmp_path / "pwned").exists()
    with Ledger.open(str(db), create=False) as led:
        assert led.latest_generation("s-t000") == 0 and not led.events("s-t000", kind="tune-result")

    out = json.loads(seedledger("tune", str(study), "--ledger", str(db), "--trust-code", "--json").stdout)
    assert [(t["run"], t["state"]) for t in out["trials"]] == [("s-t000", "complete")]
    with Ledger.open(str(db), create=False) as led:
        assert led.latest_generation("s-t000") == 1


def test_a_planted_trials_config_outside_the_study_is_refused(tmp_path):
    """A planted run whose event names in-space parameters but whose stored config trains
    lr = 5, or a population of 65,536 with 32,768 new tokens: refused, nothing trained."""
    study = write_study(tmp_path, space={"lr": {"type": "categorical", "choices": [LR]}})
    db = tmp_path / "l.db"
    plant_trial(tmp_path, db, {"lr": LR}, "lr=5.0")
    proc = seedledger("tune", str(study), "--ledger", str(db), "--trust-code", check=False)
    refused(proc, "s-t000", "lr is 5.0")

    forge_config(db, "s-t000", lambda c: c.update(lr=LR, population=65536, max_new_tokens=32768))
    refused(seedledger("tune", str(study), "--ledger", str(db), "--trust-code", check=False), "max_new_tokens")
    with Ledger.open(str(db), create=False) as led:
        assert led.latest_generation("s-t000") == 0
        assert not led.events("s-t000", kind="tune-result")  # refused, not told FAIL


def test_a_forged_optuna_trial_outside_the_space_is_refused(tmp_path):
    """Optuna's tables hold a RUNNING trial 0 with lr = 5 under a distribution widened to
    admit it: the rerun that would finish it refuses, and no run is made."""
    import optuna

    from seedledger.engine.search.tune import PrunerSpec, SamplerSpec, open_study

    study = write_study(tmp_path)
    db = tmp_path / "l.db"
    with Ledger.open(str(db)) as led:
        optuna_study = open_study(led, "s", SamplerSpec(), PrunerSpec(name="none"))
        optuna_study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, params={"lr": 5.0},
            distributions={"lr": optuna.distributions.FloatDistribution(1e-3, 10.0, log=True)}))
        optuna_study._storage._backend.engine.dispose()
    refused(seedledger("tune", str(study), "--ledger", str(db), check=False), "lr = 5.0", "outside the study's space")
    with Ledger.open(str(db), create=False) as led:
        assert not led.has_run("s-t000")


@pytest.mark.parametrize("value", [float("nan"), 0.2, "0.01", True])
def test_space_membership_is_type_and_bounds(value):
    from seedledger.engine.search.tune import Param
    from seedledger.engine.search.tunecheck import contains

    assert contains(Param(type="float", low=1e-3, high=0.1), 0.01)
    assert not contains(Param(type="float", low=1e-3, high=0.1), value)
    assert contains(Param(type="int", low=2, high=8, step=2), 4)
    assert not contains(Param(type="int", low=2, high=8, step=2), 5)
    assert not contains(Param(type="categorical", choices=[1, 2]), True)


PBT = ["--population", "2", "--rounds", "2", "--interval", "1", "--rows", "2", "--name", "p"]


@pytest.fixture(scope="module")
def pbt_ledger(tmp_path_factory):
    """A finished 2-member × 2-round PBT on `tiny` (copied by each test that forges it)."""
    tmp = tmp_path_factory.mktemp("pbt")
    (tmp / "tiny.yaml").write_text(tiny_config(generations=2, sigma=0.02, lr=0.01))
    out = json.loads(seedledger("pbt", str(tmp / "tiny.yaml"), *PBT, "--ledger", str(tmp / "l.db"), "--json").stdout)
    return tmp, out


def _copy(pbt_ledger, tmp: Path) -> Path:
    import shutil

    shutil.copy(pbt_ledger[0] / "l.db", tmp / "l.db")
    return tmp / "l.db"


@pytest.mark.slow
def test_a_forged_pbt_score_is_not_adopted(pbt_ledger, tmp_path):
    """Slot 1's round-1 score raised to 1e9 in its event: the rerun recomputes it and refuses
    in one line; nothing is forked or trained on the forged score."""
    db = _copy(pbt_ledger, tmp_path)
    con = sqlite3.connect(db)
    (eid, payload), = con.execute(
        "SELECT e.id, e.payload FROM events e JOIN runs r ON r.id = e.run_id "
        "WHERE r.name = 'p-m1' AND e.kind = 'pbt-score'").fetchall()
    con.execute("UPDATE events SET payload = ? WHERE id = ?", (json.dumps(json.loads(payload) | {"score": 1e9}), eid))
    con.commit()
    con.close()
    with Ledger.open(str(db), create=False) as led:
        before = sorted(r.name for r in led.list_runs())
    refused(seedledger("pbt", str(pbt_ledger[0] / "tiny.yaml"), *PBT, "--ledger", str(db), check=False),
            "p-m1", "pbt-score", "1000000000.0")
    with Ledger.open(str(db), create=False) as led:
        assert sorted(r.name for r in led.list_runs()) == before
    # the unforged ledger reruns to the same result: scores recompute to what the events hold
    again = json.loads(seedledger("pbt", str(pbt_ledger[0] / "tiny.yaml"), *PBT, "--ledger",
                                  str(pbt_ledger[0] / "l.db"), "--json").stdout)
    assert again["rounds_done"] == pbt_ledger[1]["rounds_done"]


def test_a_planted_pbt_members_reward_code_runs_only_with_trust(pbt_ledger, tmp_path):
    db = _copy(pbt_ledger, tmp_path)
    (tmp_path / "evil.py").write_text(EVIL)
    evil = {"name": "arithmetic", "rewards": ["task", {"fn": f"{tmp_path / 'evil.py'}:f"}]}
    forge_config(db, "p-m1", lambda c: c.update(task=evil))
    config = str(pbt_ledger[0] / "tiny.yaml")
    refused(seedledger("pbt", config, *PBT, "--ledger", str(db), check=False), "p-m1", "--trust-code", "evil.py")
    assert not (tmp_path / "pwned").exists()
    out = json.loads(seedledger("pbt", config, *PBT, "--ledger", str(db), "--trust-code", "--json").stdout)
    assert out["rounds_done"] == pbt_ledger[1]["rounds_done"]


def test_a_planted_pbt_members_config_outside_the_users_is_refused(pbt_ledger, tmp_path):
    """Issue 31: a member run planted before `pbt` starts, stored as slot 1 would be but for a
    population of 65,536 with 32,768 new tokens, is refused in one line before anything is
    made or trained; a fork whose stored lr no explore reaches is refused the same way."""
    with Ledger.open(str(pbt_ledger[0] / "l.db"), create=False) as led:
        legit = led.get_run("p-m1").config
        forks = [r.name for r in led.list_runs() if r.name.endswith("-r1")]
    config = str(pbt_ledger[0] / "tiny.yaml")
    db = tmp_path / "fresh.db"
    seedledger("train", config, "--run", "p-m1", "--generations", "0", "--ledger", str(db))
    forge_config(db, "p-m1", lambda c: c.update(legit, population=65536, max_new_tokens=32768))
    refused(seedledger("pbt", config, *PBT, "--ledger", str(db), check=False),
            "p-m1", "max_new_tokens is 32768", "the pbt config makes 4")
    with Ledger.open(str(db), create=False) as led:
        assert [r.name for r in led.list_runs()] == ["p-m1"] and led.latest_generation("p-m1") == 0

    assert forks, "the fixture's round 1 forked a member"
    db = _copy(pbt_ledger, tmp_path)
    forge_config(db, forks[0], lambda c: c.update(lr=5.0))
    refused(seedledger("pbt", config, *PBT, "--ledger", str(db), check=False),
            forks[0], "stored lr 5.0 is beyond what pbt's explore reaches by round 1")
