"""`seedledger pbt`: a 4-member × 3-round PBT on `tiny`, uninterrupted in one ledger and
SIGKILLed mid-way then rerun in another: the same forks, settings and fingerprints."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from seedledger.ledger import Ledger
from tests.support.configs import tiny_config
from tests.support.runs import cli

pytestmark = pytest.mark.slow  # make test-quick leaves it to make test

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--population", "4", "--rounds", "3", "--interval", "1", "--rows", "2", "--name", "p"]



def history(db: Path) -> dict:
    """Every run: parent, config lr/σ/seed, fingerprints, PBT events (times left out)."""
    with Ledger.open(str(db), create=False) as led:
        return {
            r.name: {
                "parent": r.parent,
                "settings": (r.config["lr"], r.config["sigma"], r.config["seed"]),
                "fingerprints": led.fingerprints(r.name),
                "events": sorted(
                    (e.kind, json.dumps(e.payload, sort_keys=True))
                    for e in led.events(r.name) if e.kind.startswith("pbt")
                ),
            }
            for r in led.list_runs()
        }


@pytest.fixture(scope="module")
def two_pbts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pbt")
    config = tmp / "tiny.yaml"
    config.write_text(tiny_config(generations=3, sigma=0.02, lr=0.01))
    whole = tmp / "whole.db"
    out = json.loads(cli("pbt", str(config), *ARGS, "--ledger", str(whole), "--json").stdout)
    killed = tmp / "killed.db"
    env = os.environ | {"SEEDLEDGER_FAILPOINT": "committed@2"}  # the first commit of round 2
    proc = cli("pbt", str(config), *ARGS, "--ledger", str(killed), env=env, check=False)
    assert proc.returncode == -signal.SIGKILL
    rerun = json.loads(cli("pbt", str(config), *ARGS, "--ledger", str(killed), "--json").stdout)
    return out, whole, rerun, killed


def test_pbt_rounds_score_exploit_and_explore(two_pbts):
    out, whole, _, _ = two_pbts
    assert [r["round"] for r in out["rounds_done"]] == [1, 2, 3]
    assert [r["generation"] for r in out["rounds_done"]] == [1, 2, 3]
    runs = history(whole)
    forks = {name: h for name, h in runs.items() if h["parent"]}
    assert {f"p-m{s}" for s in range(4)} <= set(runs)
    assert forks, "a 4-member PBT replaces its weakest member after rounds 1 and 2"
    for name, h in forks.items():
        slot, round_ = name.removeprefix("p-m").split("-r")
        (kind, payload), = [e for e in h["events"] if e[0] == "pbt-exploit"]
        payload = json.loads(payload)
        assert payload["from"] == f"{h['parent'][0]}@{h['parent'][1]}" and h["parent"][1] == int(round_)
        assert payload["from_score"] > payload["replaced_score"]
        parent_lr, parent_sigma, _ = runs[h["parent"][0]]["settings"]
        assert h["settings"][0] / parent_lr in (pytest.approx(0.8), pytest.approx(1.25))
        assert h["settings"][1] / parent_sigma in (pytest.approx(0.8), pytest.approx(1.25))
    graph = json.loads(cli("log", "--graph", "--ledger", str(whole), "--json").stdout)
    assert any(node["children"] for node in graph)  # the fork tree is the PBT history
    best = out["best"]
    assert best["score"] == max(out["rounds_done"][-1]["scores"])


def test_a_killed_pbt_reruns_to_the_same_history(two_pbts):
    out, whole, rerun, killed = two_pbts
    assert history(killed) == history(whole)
    assert rerun["rounds_done"] == out["rounds_done"] and rerun["best"] == out["best"]
    third = cli("pbt", str(Path(whole).parent / "tiny.yaml"), *ARGS, "--ledger", str(killed), "--json")
    again = json.loads(third.stdout)
    assert again["rounds_done"] == out["rounds_done"]  # nothing trains twice
    assert history(killed) == history(whole)


def test_pbt_refuses_other_settings_for_the_same_name(two_pbts):
    _, whole, _, _ = two_pbts
    proc = cli("pbt", str(Path(whole).parent / "tiny.yaml"), "--population", "3", "--rounds", "3",
               "--interval", "1", "--rows", "2", "--name", "p", "--ledger", str(whole), check=False)
    assert proc.returncode == 2 and "rerun with the same settings" in proc.stderr


@pytest.mark.ray
def test_pbt_members_train_in_parallel_on_ray(tmp_path, monkeypatch):
    """The study starts one local Ray cluster and stops it at the end: the members' runs
    are created on it (a pool each, for the base fingerprint) and trained as Ray tasks on
    it, instead of a cluster started and stopped per pool."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray connection is already open in this process")
    starts = []
    init = ray.init
    monkeypatch.setattr(ray, "init", lambda *a, **k: starts.append(k.get("address")) or init(*a, **k))
    monkeypatch.setenv("SEEDLEDGER_RAY_OBJECT_STORE", str(200 * 2**20))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config(generations=1, workers={"pool": "ray", "count": 1}))
    out = json.loads(cli("pbt", str(config), "--population", "2", "--rounds", "1", "--rows", "2",
                         "--ledger", str(tmp_path / "l.db"), "--json").stdout)
    assert starts == ["local"], "one local cluster for the whole study"
    assert not ray.is_initialized(), "the study stops the cluster it started"
    assert out["rounds_done"][0]["generation"] == 1 and len(out["rounds_done"][0]["scores"]) == 2
