"""The public Python API (`import seedledger as sl`) on the `tiny` model: real SQLite
ledgers, real training, real replay. The CLI calls the same functions; here they are
checked from Python, and against the console script once (same config, same bits)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import seedledger as sl
from seedledger.replay.fingerprint import fingerprint
from tests.support.configs import TINY

# the suite's tiny config, with longer completions (a generate() of the rebuilt model follows)
CONFIG = {**TINY, "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 40}]},
          "max_new_tokens": 8}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> tuple[Path, sl.Ledger]:
    """One run `a` of 2 generations, trained through the API into a real SQLite file."""
    where = tmp_path_factory.mktemp("api") / "ledger.db"
    result = sl.train(CONFIG, run="a", ledger=where)
    assert [r.index for r in result.records] == [1, 2]
    assert result.run.name == "a" and result.latest_generation == 2
    return where, result


def test_history_records_and_frame(trained):
    where, result = trained
    records = sl.history("a", ledger=where)
    assert [r.index for r in records] == [1, 2]
    assert [r.fingerprint for r in records] == [r.fingerprint for r in result.records]
    assert records[-1].fingerprint == result.fingerprint
    assert [len(r.members) for r in records] == [4, 4]
    assert [r.index for r in sl.history("a@1", ledger=where)] == [1]
    frame = sl.history_frame("a", ledger=where)
    assert list(frame.index) == [1, 2]
    assert list(frame["fingerprint"]) == [r.fingerprint for r in records]
    assert frame["reward_mean"].tolist() == pytest.approx([r.reward_stats()["mean"] for r in records])
    assert {"run", "lr", "sigma", "population", "committed_at"} <= set(frame.columns)
    assert any(c.startswith("time_") for c in frame.columns)


def test_open_ledger_is_a_context_manager(trained):
    where, _ = trained
    with sl.open_ledger(where) as led:
        assert [r.name for r in led.list_runs()] == ["a"]
        assert len(sl.history("a", ledger=led)) == 2  # an open ledger is used, not closed
        assert led.latest_generation("a") == 2


def test_rebuild_in_memory_matches_the_ledger(trained, tiny_model_dir):
    where, result = trained
    master = sl.rebuild("a@2", ledger=where)
    assert fingerprint(master) == result.fingerprint
    model, tokenizer = sl.rebuild_model("a", ledger=where)
    params = dict(model.named_parameters())
    assert set(params) == set(master)
    for name, p in params.items():
        assert torch.equal(p.detach(), master[name].to(p.dtype)), name
    ids = tokenizer("1 + 1 =", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 3


def test_rebuild_a_member_in_memory(trained):
    """RUN@G#M: the weights member M of generation G was evaluated with, i.e. RUN@G-1 plus
    its perturbation."""
    from seedledger.replay.rebuild import apply_member

    where, result = trained
    member = sl.rebuild("a@2#1", ledger=where)
    parent = sl.rebuild("a@1", ledger=where)
    with sl.open_ledger(where) as led:
        m = led.generation("a", 2).members[1]
        apply_member(parent, led.replay_history("a", upto=2)[-1], m.key, m.sign)
    assert fingerprint(member) == fingerprint(parent)
    assert fingerprint(member) not in {r.fingerprint for r in result.records}
    with pytest.raises(sl.SeedLedgerError, match="members 0..3"):
        sl.rebuild("a@2#4", ledger=where)


def test_fork_resume_verify(tmp_path, trained):
    where, result = trained
    led_path = tmp_path / "copy.db"
    led_path.write_bytes(where.read_bytes())  # the module's ledger stays as the other tests read it
    child = sl.fork("a@1", "b", overrides=["lr=0.0002"], generations=1, ledger=led_path)
    assert child.run.name == "b" and [r.index for r in child.records] == [2]
    assert child.records[0].lr == pytest.approx(0.0002)
    assert child.fingerprint != result.fingerprint  # another lr: other weights
    more = sl.resume("a", generations=1, ledger=led_path)
    assert [r.index for r in more.records] == [3]
    done = sl.resume("b", ledger=led_path)  # at its target (generations: 2): nothing to train
    assert done.records == [] and done.latest_generation == 2
    report = sl.verify("b", ledger=led_path)
    assert report["ok"] and report["generations_checked"] == 2 and report["fingerprint"] == child.fingerprint
    quick = sl.verify("a", ledger=led_path, quick=True)
    assert quick["ok"] and quick["generations_checked"] == 3


def test_export_import_rebuild_to(tmp_path, trained):
    where, result = trained
    seeds = tmp_path / "a.seeds"
    exported = sl.export("a", seeds, ledger=where)
    assert exported == {"run": "a", "generation": 2, "file": str(seeds), "bytes": seeds.stat().st_size}
    with pytest.raises(sl.SeedLedgerError, match="exists"):
        sl.export("a", seeds, ledger=where)
    assert fingerprint(sl.rebuild(seeds)) == result.fingerprint  # a Path: the seed file alone
    other = tmp_path / "other.db"
    imported = sl.import_seeds(seeds, "copy", ledger=other)
    assert imported == {"run": "copy", "latest_generation": 2, "verified": True}
    assert sl.verify("copy", ledger=other)["fingerprint"] == result.fingerprint
    report = sl.rebuild_to("a", tmp_path / "model", ledger=where)
    assert report["fingerprint"] == result.fingerprint and report["verified"]
    meta = json.loads((tmp_path / "model" / "seedledger.json").read_text())
    assert meta["run"] == "a" and meta["generation"] == 2
    from_file = sl.rebuild_to(str(seeds), tmp_path / "from-file")  # no ledger at all
    assert from_file["fingerprint"] == result.fingerprint


def test_bad_input_is_one_seedledger_error(tmp_path, trained):
    where, _ = trained
    with pytest.raises(sl.SeedLedgerError, match="exists"):
        sl.train(CONFIG, run="a", ledger=where)
    with pytest.raises(sl.SeedLedgerError):
        sl.open_ledger(tmp_path / "missing.db")  # a mistyped path is not made into a ledger
    assert not (tmp_path / "missing.db").exists()
    with pytest.raises(sl.SeedLedgerError):
        sl.history("nope", ledger=where)
    with pytest.raises(sl.SeedLedgerError):
        sl.train({**CONFIG, "population": "many"}, run="bad", ledger=where)
    with sl.open_ledger(where) as led:
        assert [r.name for r in led.list_runs()] == ["a"]  # nothing written by the refusals
        assert led.latest_generation("a") == 2


@pytest.mark.slow
def test_the_cli_and_the_api_reach_the_same_bits(tmp_path, trained):
    """`seedledger train` (which calls sl.train) on the same config from a YAML file: the
    run is named after the file and reaches the API run's fingerprint."""
    import yaml

    _, result = trained
    config = tmp_path / "same.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    script = Path(sys.executable).with_name("seedledger")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "seedledger.engine.cli"]
    env = {k: v for k, v in os.environ.items() if k != "SEEDLEDGER_DB"}
    proc = subprocess.run([*cli, "train", str(config), "--json", "--ledger", str(tmp_path / "cli.db")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["run"] == "same" and payload["fingerprint"] == result.fingerprint
    assert [r.fingerprint for r in sl.history("same", ledger=tmp_path / "cli.db")] == \
        [r.fingerprint for r in result.records]
