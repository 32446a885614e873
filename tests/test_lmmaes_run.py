"""`algorithm: lmmaes` end to end on `tiny` with a LoRA adapter: the records carry the
`paths` rule, the run verifies and rebuilds (from the ledger and from a seed file), a
member rebuilds to the adapter the HF backend evaluated, SIGKILL-and-resume reaches the
same bits, and what the policy cannot run is refused in one line."""

from __future__ import annotations

import pytest
import yaml

from seedledger.engine.config import validate
from seedledger.engine.rebuild.rebuilding import load_start, ref_master, verify_ref
from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from seedledger.replay.adapter import member_adapter, peft_adapter
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.noise import round_coefficient
from seedledger.replay.rebuild import rebuild
from tests.support.runs import cli, fingerprints

CONFIG = {
    "model": "tiny",
    "task": "arithmetic",
    "train": {"kind": "lora", "rank": 4, "target_modules": ["q_proj", "v_proj"]},
    "algorithm": "lmmaes",
    "lmmaes": {"memory": 3},
    "mirrored": False,
    "population": 4,
    "sigma": 0.05,
    "lr": 1.0,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 4,
    "seed": 5,
}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("lmmaes")
    (tmp / "lm.yaml").write_text(yaml.safe_dump(CONFIG))
    with Ledger.open(str(tmp / "l.db")) as led:
        session.start(led, str(tmp / "lm.yaml"), "l", [], None)
    return tmp


def test_the_run_records_the_paths_rule_verifies_and_rebuilds(lm_run):
    tmp = lm_run
    fps = fingerprints(tmp / "l.db", "l")
    with Ledger.open(str(tmp / "l.db")) as led:
        records = [led.generation("l", g) for g in (1, 2, 3)]
        assert all(r.optimizer["name"] == "paths" and len(r.optimizer["decay"]) == 4 for r in records)  # 3 + p_σ
        assert any(b != 0.0 for row in records[2].optimizer["members"] for b in row), "members rode the paths"
        assert records[1].sigma != records[0].sigma, "σ followed p_σ"
        assert records[1].sigma == round_coefficient(records[0].sigma * records[1].extra["lmmaes"]["sigma_factor"])
        assert len(set(fps)) == 3
        assert verify_ref(led, "l")["ok"]
        run = led.get_run("l")
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        master, state = rebuild(led, "l", 2, {n: t.clone() for n, t in start.master.items()}, frozen=start.frozen)
        # member 1 of generation 3 as `rebuild l@3#1` builds it, and as the HF backend built it
        _, member, meta, _ = ref_master(led, "l@3#1")
        m = records[2].members[1]
        scale = round_coefficient(m.sign * round_coefficient(records[2].sigma * records[2].optimizer["shrink"]))
        evaluated = member_adapter(start.adapter, master, m.key, scale, records[2].optimizer["members"][1], state)
    assert meta["parent_fingerprint"] == fps[1]
    rebuilt = peft_adapter(start.adapter, member)
    assert set(rebuilt) == set(evaluated)
    assert all(rebuilt[n].equal(evaluated[n]) for n in rebuilt)
    cli("export", "l", "-o", tmp / "l.seeds", "--ledger", tmp / "l.db")
    out = cli("rebuild", tmp / "l.seeds", "-o", tmp / "from-seeds", "--json")
    assert fps[-1] in out.stdout
    assert fingerprint(master) == fps[1]


@pytest.mark.parametrize(("change", "says"), [
    ({"train": "full"}, "train an adapter"),
    ({"mirrored": True}, "set mirrored: false"),
    ({"backend": "vllm"}, "in-process hf backend"),
    ({"algorithm": "es"}, "lmmaes: settings given but algorithm is not lmmaes"),
    ({"optimizer": "adam"}, "optimizer must be sgd"),
    ({"lmmaes": {"mu": 3}}, r"use μ < \(population \+ 1\)/2 = 2.5"),  # its last weight would be ≤ 0
])
def test_what_lmmaes_cannot_run_is_refused_in_one_line(change, says):
    with pytest.raises(Exception, match=says) as err:
        validate(CONFIG | change)
    assert "\n" not in str(err.value).strip().splitlines()[-1]


@pytest.mark.parametrize("change", ["lmmaes.memory=2", "lmmaes.adapt_sigma=false"])
def test_a_fork_that_changes_the_paths_layout_is_refused_in_one_line(lm_run, change):
    """Path j (and p_σ, the last) of the parent would be read as another vector."""
    import shutil

    tmp = lm_run
    shutil.copy(tmp / "l.db", tmp / "layout.db")
    proc = cli("fork", "l@2", "--run", "changed", "--set", change, "--ledger", tmp / "layout.db", check=False)
    *notes, error = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and "a fork keeps both" in error
    assert all(line.startswith("note:") for line in notes)
    with Ledger.open(str(tmp / "layout.db")) as led:
        assert not led.has_run("changed") or led.latest_generation("changed") == 2  # the fork point: nothing new
        assert verify_ref(led, "l")["ok"]


def test_a_member_seed_file_is_refused_in_one_line(lm_run):
    tmp = lm_run
    proc = cli("export", "l@2#1", "-o", tmp / "m.seeds", "--ledger", tmp / "l.db", check=False)
    assert proc.returncode != 0 and not (tmp / "m.seeds").exists()
    assert "an LM-MA-ES member's evolution paths" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_show_and_diff_name_a_member_along_the_paths(lm_run):
    import json

    tmp = lm_run
    shown = json.loads(cli("show", "l@3#1", "--json", "--ledger", tmp / "l.db").stdout)
    with Ledger.open(str(tmp / "l.db")) as led:
        rule = led.generation("l", 3).optimizer
    assert shown["paths"] == {"shrink": rule["shrink"], "terms": rule["members"][1]}
    assert shown["lmmaes"]["rank"] in range(4)
    diffed = json.loads(cli("diff", "l@3#1", "l@3#1", "--json", "--ledger", tmp / "l.db").stdout)
    with Ledger.open(str(tmp / "l.db")) as led:
        _, member, _, _ = ref_master(led, "l@3#1")
    assert diffed["a"]["fingerprint"] == diffed["b"]["fingerprint"] == fingerprint(member)
