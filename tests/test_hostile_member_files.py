"""Issue 31 item 5: what a member file (format 3) may be is one rule. A member's σ is
bounded as training bounds it (a σ of 2**100 rebuilt to weights of 5.5e30), and a member
of a `paths` lineage (a GA's survivors) is refused by `rebuild FILE` with export's own
words. Item 3: a GA-survivors file whose `paths` records hold another path count than its
config keeps is refused by `import` in one line. Files forged through the real encoder; the
console script run as a subprocess. Item 4: task sizes and sandbox limits of 10**9 in a
seed file's or a ledger's stored config are refused by `import` and `resume`. Item 8: an
unusable anchor's fallback is said once on stderr."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from test_ga_survivors import CONFIG as GA

from seedledger.ledger import Ledger
from seedledger.ledger.durable import write_file_durably
from seedledger.ledger.seedfile import SeedMember, encode
from seedledger.replay.noise import member_key
from tests.support.configs import tiny_config
from tests.support.runs import cli


def _forge(ledger: Path, run: str, g: int, index: int, out: Path, **change) -> Path:
    """What `export RUN@G#M` writes, with no rule applied and `change` to the member."""
    with Ledger.open(str(ledger)) as led:
        info, m = led.get_run(run), led.generation(run, g).members[index]
        step = led.replay_history(run, upto=g)[-1]
        entry = SeedMember(g, index, m.key, m.sign, step.sigma, step.run, step.noise_spec, step.param_selection)
        segments = led.ancestors(run, g - 1)
        _, data = encode(info, g - 1, segments, {n: led.get_run(n) for n, _a, _b in segments},
                         led.records(run, g - 1), member_key, dataclasses.replace(entry, **change))
    write_file_durably(out, data, False)
    return out


def _one_line(*args) -> str:
    proc = cli(*args, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir) -> Path:
    tmp = tmp_path_factory.mktemp("hostile_members")
    (tmp / "es.yaml").write_text(tiny_config(generations=2, sigma=2**-6, anchor_every=1))
    (tmp / "ga.yaml").write_text(yaml.safe_dump(GA | {"generations": 2}))
    cli("train", tmp / "es.yaml", "--run", "e", "--ledger", tmp / "l.db")
    cli("train", tmp / "ga.yaml", "--run", "g", "--ledger", tmp / "l.db")
    return tmp


def test_a_member_sigma_above_trainings_bound_is_refused(runs, tmp_path):
    fine = _forge(runs / "l.db", "e", 2, 1, tmp_path / "fine.seeds")
    cli("rebuild", fine, "-o", tmp_path / "fine")  # the same file, unchanged, rebuilds
    huge = _forge(runs / "l.db", "e", 2, 1, tmp_path / "huge.seeds", sigma=2.0**100)
    line = _one_line("rebuild", huge, "-o", tmp_path / "out")
    assert "member 1 of generation 2: σ 1.2676506002282294e+30 is not a positive rounded value at most" in line
    assert not (tmp_path / "out").exists()


def test_a_member_of_a_paths_lineage_is_refused_as_export_refuses_it(runs, tmp_path):
    said = _one_line("export", "g@2#1", "-o", tmp_path / "x.seeds", "--ledger", runs / "l.db")
    assert "rides vectors of the replay state" in said and not (tmp_path / "x.seeds").exists()
    forged = _forge(runs / "l.db", "g", 2, 1, tmp_path / "g.seeds")
    line = _one_line("rebuild", forged, "-o", tmp_path / "out")
    assert line.startswith(f"error: seed file {forged}: ") and line.endswith(said.removeprefix("error: ")), line
    first = _forge(runs / "l.db", "g", 1, 1, tmp_path / "g1.seeds")  # no lineage step: its config says paths
    line = _one_line("rebuild", first, "-o", tmp_path / "out")
    assert "g@1#1 rides vectors of the replay state" in line, line
    assert not (tmp_path / "out").exists()


def test_a_path_count_that_its_config_does_not_keep_is_refused(runs, tmp_path):
    cli("export", "g@2", "-o", tmp_path / "g.seeds", "--ledger", runs / "l.db")
    cli("import", tmp_path / "g.seeds", "--run", "copy", "--ledger", tmp_path / "ok.db")  # as written: imports
    with Ledger.open(str(runs / "l.db")) as led:
        info = led.get_run("g")
        config = info.config | {"ga": info.config["ga"] | {"survivors": 2}}  # keeps 1 path; the records hold 2
        segments = led.ancestors("g", 2)
        _, data = encode(dataclasses.replace(info, config=config), 2, segments, {"g": info},
                         led.records("g", 2), member_key)
    write_file_durably(tmp_path / "bad.seeds", data, False)
    line = _one_line("import", tmp_path / "bad.seeds", "--run", "bad", "--ledger", tmp_path / "bad.db")
    assert "generation 1: optimizer paths records 2 paths; the run's config keeps 1" in line, line
    with Ledger.open(str(tmp_path / "bad.db")) as led:
        assert not led.has_run("bad")


HUGE_TASK = {"name": "arithmetic", "train_size": 10**9, "test_size": 10**9}


def test_task_settings_out_of_bounds_are_refused_on_import(runs, tmp_path):
    """Item 4: a seed file's stored config is data; a resume would build its datasets."""
    with Ledger.open(str(runs / "l.db")) as led:
        info = led.get_run("e")
        segments = led.ancestors("e", 2)
        _, data = encode(dataclasses.replace(info, config=info.config | {"task": HUGE_TASK}), 2, segments,
                         {"e": info}, led.records("e", 2), member_key)
    write_file_durably(tmp_path / "huge.seeds", data, False)
    line = _one_line("import", tmp_path / "huge.seeds", "--ledger", tmp_path / "i.db")
    assert "task arithmetic: " in line and "must be a positive integer at most" in line, line


def test_task_settings_out_of_bounds_are_refused_on_resume(runs, tmp_path):
    """A ledger's stored config edited to 10**9 rows: `resume` refuses it in one line, and
    the run's generations are untouched."""
    db = tmp_path / "r.db"
    shutil.copy(runs / "l.db", db)
    con = sqlite3.connect(db)
    with con:
        con.execute("UPDATE runs SET config = json_set(config, '$.task', json(?)) WHERE name = 'e'",
                    (json.dumps(HUGE_TASK),))
    con.close()
    line = _one_line("resume", "e", "-n", "1", "--ledger", db)
    assert "train_size must be a positive integer at most 100_000" in line, line
    with Ledger.open(str(db)) as led:
        assert led.latest_generation("e") == 2


def test_an_unusable_anchor_is_reported_once(runs, tmp_path):
    shutil.copy(runs / "l.db", tmp_path / "a.db")
    shutil.copytree(runs / "l.db.anchors", tmp_path / "a.db.anchors")
    with Ledger.open(str(tmp_path / "a.db")) as led:
        anchors = len(led.anchors("e"))
    assert anchors == 2, "the run wrote an anchor per generation"
    for p in (tmp_path / "a.db.anchors").rglob("*"):
        if p.is_file():
            p.write_bytes(b"not an anchor")
    proc = cli("rebuild", "e@2", "-o", tmp_path / "out", "--ledger", tmp_path / "a.db")
    assert proc.stderr.count("falling back") == anchors, proc.stderr  # each unusable anchor said once
