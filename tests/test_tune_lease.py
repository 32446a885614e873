"""One tuner per study (issue 31 item 7), through the console script: two `tune` processes
started 0.5 s apart on one study: one is refused in one line naming the holder, the other
finishes, and a rerun holds the same trials as an uninterrupted study in another ledger. A
SIGKILLed tuner's lease is taken over by the next one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.support.cli import seedledger
from tests.support.configs import tiny_config

pytestmark = pytest.mark.slow  # make test-quick leaves it to make test

ROOT = Path(__file__).resolve().parents[1]
SEEDLEDGER = str(Path(sys.executable).with_name("seedledger"))
STUDY = {
    "config": "tiny.yaml", "study": "s", "trials": 2, "objective": {"rows": 2, "every": 0},
    "sampler": {"name": "random", "seed": 7}, "pruner": {"name": "none"},
    "space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
}


def tune(study: Path, db: Path) -> subprocess.Popen:
    return subprocess.Popen([SEEDLEDGER, "tune", str(study), "--ledger", str(db), "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def trials(out: str) -> list[tuple]:
    return [(t["trial"], t["state"], t["params"], t["value"]) for t in json.loads(out)["trials"]]


def test_two_tuners_on_one_study_one_is_refused_and_the_study_converges(tmp_path):
    (tmp_path / "tiny.yaml").write_text(tiny_config(generations=1, evaluation={"rows": 2}))
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump(STUDY))
    alone = seedledger(["tune", study, "--ledger", tmp_path / "alone.db", "--json"], cwd=ROOT)  # in process
    assert alone.returncode == 0, alone.stderr
    expected = trials(alone.stdout)

    first = tune(study, tmp_path / "l.db")
    time.sleep(0.5)
    second = tune(study, tmp_path / "l.db")
    outputs = [p.communicate(timeout=600) for p in (first, second)]
    results = [(p.returncode, *o) for p, o in zip((first, second), outputs, strict=True)]
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], results
    (_, _, refusal), = [r for r in results if r[0] == 2]
    assert refusal.count("\n") == 1 and "is being tuned by" in refusal, refusal
    (_, done, _), = [r for r in results if r[0] == 0]
    assert trials(done) == expected
    rerun = seedledger(["tune", study, "--ledger", tmp_path / "l.db", "--json"], cwd=ROOT)
    assert rerun.returncode == 0 and json.loads(rerun.stdout)["ran_now"] == [] and trials(rerun.stdout) == expected


def test_a_killed_tuners_lease_is_taken_over(tmp_path):
    """SIGKILL while trial 0 trains leaves the study's lease row; the rerun (same host, dead
    pid) takes it over and finishes the study."""
    (tmp_path / "tiny.yaml").write_text(tiny_config(generations=1, evaluation={"rows": 2}))
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({**STUDY, "trials": 1}))
    db = tmp_path / "l.db"
    proc = tune(study, db)
    deadline = time.monotonic() + 300
    while not _leased(db):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _leased(db)
    rerun = seedledger(["tune", study, "--ledger", db, "--json"], cwd=ROOT)  # takes over in this process
    assert rerun.returncode == 0, rerun.stderr
    assert [t["state"] for t in json.loads(rerun.stdout)["trials"]] == ["complete"] and not _leased(db)


def _leased(db: Path) -> bool:
    import sqlite3

    if not db.exists():
        return False
    con = sqlite3.connect(db, timeout=30)
    try:
        query = "SELECT count(*) FROM study_system_attributes WHERE key = 'seedledger:tuner'"
        return con.execute(query).fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def test_a_planted_lease_row_holds_no_study(tmp_path):
    """A copied ledger's lease row claiming a holder on another host until the year 9999 (or
    holding garbage) is no live tuner: `tune` takes it over and runs."""
    import sqlite3

    from seedledger.engine.search.studystore import KEY, open_study
    from seedledger.engine.search.tune import PrunerSpec, SamplerSpec
    from seedledger.ledger import Ledger

    (tmp_path / "tiny.yaml").write_text(tiny_config(generations=1, evaluation={"rows": 2}))
    study = tmp_path / "s.yaml"
    study.write_text(yaml.safe_dump({**STUDY, "trials": 1}))
    db = tmp_path / "l.db"
    with Ledger.open(str(db)) as led:
        sid = open_study(led, "s", SamplerSpec(), PrunerSpec(name="none"))._study_id
    forged = {"token": "x", "host": "elsewhere", "pid": 1, "holder": "mallory", "since": "2020-01-01T00:00:00+00:00",
              "heartbeat": "2020-01-01T00:00:00+00:00", "expires_at": "9999-01-01T00:00:00+00:00"}
    con = sqlite3.connect(db)
    con.execute("INSERT INTO study_system_attributes (study_id, key, value_json) VALUES (?, ?, ?)",
                (sid, KEY, json.dumps(forged)))
    con.commit()
    con.close()
    rerun = seedledger(["tune", study, "--ledger", db, "--json"], cwd=ROOT)
    assert rerun.returncode == 0, rerun.stderr
    assert [t["state"] for t in json.loads(rerun.stdout)["trials"]] == ["complete"] and not _leased(db)
