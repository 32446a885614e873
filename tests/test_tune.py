"""`seedledger tune`: a 6-trial Optuna study on `tiny` in the ledger's own database, killed
with SIGKILL mid-study and rerun (no trial lost or run twice), and Optuna's tables beside
the ledger's (migrations ignore them)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from tests.support.configs import tiny_config
from tests.support.runs import cli

ROOT = Path(__file__).resolve().parents[1]
STUDY = {
    "config": "tiny.yaml",
    "study": "s",
    "trials": 6,
    "objective": {"rows": 2, "every": 1},
    "sampler": {"name": "tpe", "seed": 11, "startup_trials": 3},
    "pruner": {"name": "median", "startup_trials": 2},
    "space": {
        "lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True},
        "sigma": {"type": "float", "low": 1e-3, "high": 0.05, "log": True},
        "optimizer.name": {"type": "categorical", "choices": ["sgd", "adam"]},
    },
}



def write_study(tmp: Path, **changes) -> Path:
    (tmp / "tiny.yaml").write_text(tiny_config(generations=2, evaluation={"rows": 2}))
    path = tmp / "s.yaml"
    path.write_text(yaml.safe_dump({**STUDY, **changes}))
    return path


def _trained(db: Path, run: str) -> int:
    if not db.exists():
        return 0
    con = sqlite3.connect(db, timeout=30)
    try:
        row = con.execute(
            "SELECT count(*) FROM generations g JOIN runs r ON r.id = g.run_id WHERE r.name = ?", (run,)
        ).fetchone()
    except sqlite3.OperationalError:  # tables not made yet
        return 0
    finally:
        con.close()
    return row[0]


@pytest.fixture(scope="module")
def killed_study(tmp_path_factory):
    """The study's tuner SIGKILLed while trial 2 trains, then rerun to completion."""
    tmp = tmp_path_factory.mktemp("tune")
    study, db = write_study(tmp), tmp / "l.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "seedledger.engine.cli", "tune", str(study), "--ledger", str(db)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 900
    while _trained(db, "s-t002") < 1:
        assert proc.poll() is None, "the tuner ended before trial 2 trained"
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with Ledger.open(str(db), create=False) as led:  # trial 2 may have finished before the kill landed
        told = {r.name for r in led.list_runs() if led.events(r.name, kind="tune-result")}
    interrupted = next(n for n in range(6) if f"s-t{n:03d}" not in told)
    trained = _trained(db, f"s-t{interrupted:03d}")
    out = json.loads(cli("tune", str(study), "--ledger", str(db), "--json").stdout)
    return study, db, out | {"interrupted": interrupted, "trained_at_kill": trained}


@pytest.mark.slow
def test_a_killed_study_resumes_without_losing_or_repeating_a_trial(killed_study):
    _, db, out = killed_study
    assert [t["trial"] for t in out["trials"]] == list(range(6))
    assert {t["state"] for t in out["trials"]} <= {"complete", "pruned"}
    assert out["interrupted"] >= 2 and out["ran_now"][0] == out["interrupted"]  # the rerun finished it first
    assert out["best"]["value"] == max(t["value"] for t in out["trials"] if t["state"] == "complete")
    with Ledger.open(str(db), create=False) as led:
        runs = sorted(r.name for r in led.list_runs())
        assert runs == [f"s-t{n:03d}" for n in range(6)]
        for t in out["trials"]:
            trial_events = led.events(t["run"], kind="tune-trial")
            assert [e.payload for e in trial_events] == [{"study": "s", "trial": t["trial"], "params": t["params"]}]
            (result,) = led.events(t["run"], kind="tune-result")  # told exactly once
            assert result.payload["state"] == t["state"]
            cfg = led.get_run(t["run"]).config
            assert (cfg["lr"], cfg["sigma"], cfg["optimizer"]["name"]) == (
                t["params"]["lr"], t["params"]["sigma"], t["params"]["optimizer.name"])
        killed = next(t for t in out["trials"] if t["trial"] == out["interrupted"])
        if killed["state"] == "complete" and out["trained_at_kill"]:  # it went on from where the kill left it
            resumed = [e.payload["from_generation"] for e in led.events(killed["run"], kind="resume")]
            assert resumed[-1] >= 1
        done = [t for t in out["trials"] if t["state"] == "complete"]
        assert all(led.latest_generation(t["run"]) == 2 for t in done)
    again = json.loads(cli("tune", str(killed_study[0]), "--ledger", str(db), "--json").stdout)
    assert again["ran_now"] == [] and again["trials"] == out["trials"]  # nothing left to do


def test_trial_parameters_depend_only_on_the_seed_and_earlier_trials(killed_study):
    """Trial n's sampler is seeded by (seed, n): replaying trials 0..n-1 into a fresh
    in-memory study draws trial n's recorded parameters again, killed tuner or not."""
    import optuna

    from seedledger.engine.search.tune import SamplerSpec, _sampler, load_study

    study, _, out = killed_study
    space = load_study(study)[0].space  # suggested in the file's order
    stored = optuna.load_study(study_name="s", storage=optuna.storages.RDBStorage(
        f"sqlite:///{killed_study[1]}", skip_compatibility_check=True)).get_trials()
    for n in range(6):
        fresh = optuna.create_study(direction="maximize", sampler=_sampler(SamplerSpec(**STUDY["sampler"]), n))
        for t in stored[:n]:
            fresh.add_trial(t)
        trial = fresh.ask()
        assert {k: p.suggest(trial, k) for k, p in space.items()} == out["trials"][n]["params"]


def test_log_and_db_commands_live_with_optunas_tables(killed_study):
    _, db, out = killed_study
    shown = json.loads(cli("log", out["trials"][0]["run"], "--ledger", str(db), "--json").stdout)
    assert {e["kind"] for e in shown["events"]} >= {"tune-trial", "tune-result"}
    current = json.loads(cli("db", "current", "--ledger", str(db), "--json").stdout)
    assert current["up_to_date"] and current["revision"] == current["head"]  # Optuna's tables moved nothing
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"studies", "trials", "trial_params", "trial_intermediate_values", "version_info"} <= tables


def test_migrations_ignore_optunas_tables(tmp_path):
    """An old ledger holding a study upgrades; Optuna's rows survive, and the migrated schema
    still matches the ORM once tables the ledger does not own are left out."""
    import optuna
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from seedledger.ledger import migrate
    from seedledger.ledger.db import make_engine, to_url
    from seedledger.ledger.schema import Base

    path = tmp_path / "old.db"
    migrate.upgrade(str(path), "0001")
    storage = optuna.storages.RDBStorage(to_url(path), skip_compatibility_check=True)
    optuna.create_study(study_name="x", storage=storage).add_trial(
        optuna.trial.create_trial(params={"a": 1.0}, distributions={
            "a": optuna.distributions.FloatDistribution(0, 2)}, value=0.5))
    storage.engine.dispose()
    assert migrate.upgrade(str(path)).after == migrate.head()
    engine = make_engine(to_url(path))
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={
            "include_name": lambda name, type_, parents: type_ != "table" or name in Base.metadata.tables})
        assert compare_metadata(ctx, Base.metadata) == []
    engine.dispose()
    again = optuna.load_study(study_name="x", storage=optuna.storages.RDBStorage(
        to_url(path), skip_compatibility_check=True))
    assert again.best_value == 0.5


def test_a_bad_search_space_is_one_line_and_starts_nothing(tmp_path):
    study = write_study(tmp_path, space={"lrr": {"type": "float", "low": 0.1, "high": 0.2}})
    proc = cli("tune", str(study), "--ledger", str(tmp_path / "l.db"), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "space.lrr" in proc.stderr
    with pytest.raises(SeedLedgerError, match="unknown key"):
        from seedledger.engine.search.tune import load_study

        load_study(write_study(tmp_path, objective={"rowz": 3}))


EVIL = """\
from pathlib import Path
Path(__file__).with_name("pwned").write_text("imported")


def f(prompts, completions, **columns):
    return [0.0] * len(completions)
"""


def test_a_planted_trial_does_not_import_its_reward_code_without_trust(tmp_path):
    """A copied ledger holds run `s-t000` with a matching `tune-trial` event and a stored
    config naming reward code: `tune` refuses it in one line before building the held-out
    scorer (nothing imported), and runs it with --trust-code."""
    from tests.support import ledgerforge

    study = write_study(tmp_path, trials=1, pruner={"name": "none"}, objective={"rows": 2, "every": 0})
    db = tmp_path / "l.db"
    cli("train", str(tmp_path / "tiny.yaml"), "--run", "s-t000", "--generations", "0", "--ledger", str(db))
    (tmp_path / "evil.py").write_text(EVIL)
    with Ledger.open(str(db)) as led:
        led.log_event("s-t000", "tune-trial", {"study": "s", "trial": 0, "params": {}})
    con = sqlite3.connect(db)
    config = json.loads(con.execute("SELECT config FROM runs WHERE name = 's-t000'").fetchone()[0])
    config["task"] = {"name": "arithmetic", "rewards": ["task", {"fn": f"{tmp_path / 'evil.py'}:f"}]}
    con.execute("UPDATE runs SET config = ? WHERE name = 's-t000'", (json.dumps(config),))
    con.commit()
    con.close()
    ledgerforge.rechain(db)  # a forger recomputes the hash chain

    proc = cli("tune", str(study), "--ledger", str(db), check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--trust-code" in proc.stderr and "evil.py" in proc.stderr
    assert not (tmp_path / "pwned").exists()
