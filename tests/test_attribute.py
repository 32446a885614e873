"""`attribute` (issue 49) on `tiny`: the curve comes from one verified replay pass; removing
a generation by replay is exactly the run committed with that generation's coefficients
zeroed (fingerprint and metric); subtracting an SGD update is not; a training row's
replay counterfactual re-weights exactly the generations that drew it; the retrain
counterfactual is a fork without the row, the same in another process."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
import yaml

import seedledger as sl
from seedledger.engine.rebuild import attribute_rows
from seedledger.ledger import Ledger
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.rebuild import replay_steps
from tests.support.runs import cli

pytestmark = pytest.mark.slow

WORDS = ["cat", "dog", "sun", "tree", "milk", "rain", "bird", "fish", "cup", "door", "lamp", "ship",
         "rock", "leaf", "bell", "coin", "road", "star", "wolf", "king"]
CONFIG = {
    "model": "tiny", "task": {"name": "jsonl", "path": "words.jsonl", "test_size": 4, "rewards": ["loglik"]},
    "population": 4, "generations": 4, "batch_size": 3, "max_new_tokens": 4, "seed": 3, "lr": 0.05,
}


def project(root, config=CONFIG):
    (root / "words.jsonl").write_text("".join(json.dumps({"prompt": f"Say {w}", "answer": w}) + "\n" for w in WORDS))
    (root / "c.yaml").write_text(yaml.safe_dump(config))
    return root / "c.yaml"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("attribute")
    sl.train(project(root), run="r", ledger=root / "l.db")
    audit = sl.attribute("r", ledger=root / "l.db", held_out=2, generations=True, training_rows=True)
    return root, audit


def test_the_curve_is_one_verified_pass_scored_at_every_generation(trained):
    root, audit = trained
    with Ledger.open(str(root / "l.db")) as led:
        recorded = {g: led.generation("r", g).fingerprint for g in range(1, 5)}
    assert [c["generation"] for c in audit.curve] == [0, 1, 2, 3, 4]
    assert {c["generation"]: c["fingerprint"] for c in audit.curve[1:]} == recorded
    assert len({c["metric"] for c in audit.curve}) == 5  # the likelihood moves at every update
    # the pass, each generation's removal (from its own generation on), each row's re-weighting
    assert audit.cost["updates"] == 4 + (4 + 3 + 2 + 1) + sum(4 - e["seen"][0] + 1 for e in audit.training_rows)


def commit_zeroed(db, run: str, g: int, name: str) -> list:
    """Run `name`: `run`'s records with generation g's coefficients set to 0, committed through
    the ledger API with the fingerprints replay gives them (row scores kept as they were)."""
    base = sl.rebuild(f"{run}@0", ledger=db)
    with Ledger.open(str(db)) as led:
        records = led.records(run)
        records[g - 1] = dataclasses.replace(records[g - 1], members=[dataclasses.replace(m, coefficient=0.0)
                                                                    for m in records[g - 1].members])
        master, state = {n: t.clone() for n, t in base.items()}, None
        for step, rec in zip(led.replay_history(run), records, strict=True):
            step = dataclasses.replace(step, coefficients=[m.coefficient for m in rec.members])
            master, state = replay_steps(master, [step], state)
            rec.fingerprint = fingerprint(master)
        led.import_run(name, records, led.get_run(run).spec())
    return records


@pytest.fixture(scope="module")
def zeroed(trained):
    return commit_zeroed(trained[0] / "l.db", "r", 2, "zeroed")


def test_a_generation_removed_by_replay_is_the_run_committed_with_it_zeroed(trained, zeroed):
    """The zeroed run verifies, and its last fingerprint and metric are exactly what
    `attribute` found without generation 2."""
    root, audit = trained
    assert sl.verify("zeroed", ledger=root / "l.db")["ok"]
    (without,) = [e for e in audit.generations if e["generation"] == 2]
    assert without["fingerprint"] == zeroed[-1].fingerprint != audit.curve[-1]["fingerprint"]
    again = sl.attribute("zeroed", ledger=root / "l.db", held_out=2, every=4)
    assert again.metric == without["without"] and without["effect"] == audit.metric - without["without"]


def test_with_adam_too_a_removed_generation_is_the_run_committed_with_it_zeroed(tmp_path):
    """Adam's state decays through a zeroed generation, as the run that recorded it replays."""
    config = {**CONFIG, "generations": 3, "optimizer": {"name": "adam"}, "lr": 0.01}
    sl.train(project(tmp_path, config), run="a", ledger=tmp_path / "l.db")
    audit = sl.attribute("a", ledger=tmp_path / "l.db", held_out=1, generations=True)
    for g in (1, 2):
        records = commit_zeroed(tmp_path / "l.db", "a", g, f"a-without-{g}")
        assert sl.verify(f"a-without-{g}", ledger=tmp_path / "l.db")["ok"]
        (without,) = [e for e in audit.generations if e["generation"] == g]
        assert without["fingerprint"] == records[-1].fingerprint != audit.curve[-1]["fingerprint"]


def test_subtracting_an_sgd_update_is_not_the_replay_without_it(trained, zeroed):
    """θ_4 − (θ_2 − θ_1) misses the replay without generation 2 in the last bits: fp32 sums
    round, so the exact removal is the zeroed replay."""
    root, _ = trained
    theta = {g: sl.rebuild(f"r@{g}", ledger=root / "l.db") for g in (1, 2, 4)}
    without = sl.rebuild("zeroed@4", ledger=root / "l.db")
    differ = total = 0
    for name, final in theta[4].items():
        subtracted = final - (theta[2][name] - theta[1][name])
        differ += int((subtracted != without[name]).sum())
        total += final.numel()
        assert torch.allclose(subtracted, without[name], rtol=0, atol=1e-5)
    assert 0 < differ < total  # close, and not bit-exact


def test_training_rows_are_ranked_by_an_exact_reweighting_of_the_generations_that_drew_them(trained):
    root, audit = trained
    with Ledger.open(str(root / "l.db")) as led:
        history = attribute_rows.generations(led, "r", 4)  # every recorded coefficient from its scores
        drawn = attribute_rows.seen(history)
    assert sorted(e["row"] for e in audit.training_rows) == sorted(drawn)
    effects = [e["effect"] for e in audit.training_rows]
    assert effects == sorted(effects, reverse=True) and len(set(effects)) > 1
    for e in audit.training_rows:
        assert e["seen"] == drawn[e["row"]] and e["effect"] == audit.metric - e["without"]
        assert e["question"] == f"Say {e['answer']}"
    assert audit.agreement is not None and -1.0 <= audit.agreement <= 1.0


def test_the_retrain_counterfactual_is_a_fork_without_the_row_the_same_in_another_process(trained, tmp_path):
    """`attribute --retrain R` forks at the generation before R was first drawn with R in
    `exclude_rows`: its batches keep their other rows; a `seedledger fork` made in a real
    subprocess on a copy of the ledger reaches the same fingerprints at every generation."""
    root, audit = trained
    row = next(e for e in audit.training_rows if e["seen"][0] == 2)["row"]
    copy = tmp_path / "copy.db"
    shutil.copy(root / "l.db", copy)
    (tmp_path / "words.jsonl").write_text((root / "words.jsonl").read_text())
    result = sl.attribute("r", ledger=root / "l.db", held_out=2, every=4, retrain=[row])
    (retrained,) = result.retrain
    assert retrained["run"] == f"r-without-{row}" and retrained["from"] == "r@1"
    assert retrained["effect"] == result.metric - retrained["without"]
    assert retrained["replay_effect"] == next(e for e in result.training_rows if e["row"] == row)["effect"]
    assert result.sign_agreement == {"agree": int(retrained["agree"]), "rows": 1}
    cli("fork", "r@1", "--run", "other", "--set", f"exclude_rows=[{row}]", "--generations", "3", "--ledger", copy,
        process=True)
    with Ledger.open(str(root / "l.db")) as led, Ledger.open(str(copy)) as other:
        mine, theirs, original = led.records(retrained["run"]), other.records("other"), led.records("r")
        assert [r.fingerprint for r in mine] == [r.fingerprint for r in theirs]
        assert mine[-1].fingerprint == retrained["fingerprint"] != original[-1].fingerprint
        for new, old in zip(mine[1:], original[1:], strict=True):
            assert new.batch_indices == [i for i in old.batch_indices if i != row]
    again = sl.attribute("r", ledger=root / "l.db", held_out=2, every=4, retrain=[row])  # reuses the fork
    assert again.retrain == result.retrain


def test_a_preference_is_the_answers_likelihood_less_the_alternatives(trained):
    """--instead: the metric is the answer's likelihood less the alternative's, row by row;
    rows naming their alternative in a column (written as the task writes answers) agree."""
    root, _ = trained
    db = root / "l.db"
    (root / "probe.jsonl").write_text(json.dumps({"prompt": "Say cat", "answer": "cat", "alt": "dog"}) + "\n")
    cat, dog = (sl.attribute("r", ledger=db, prompt="Say cat", answer=f"<answer>{w}</answer>", every=2)
                for w in ("cat", "dog"))
    both = sl.attribute("r", ledger=db, prompt="Say cat", answer="<answer>cat</answer>", instead="<answer>dog</answer>",
                        every=2)
    rows = sl.attribute("r", ledger=db, rows=str(root / "probe.jsonl"), instead_column="alt", every=2)
    assert [c["metric"] for c in both.curve] == [a["metric"] - b["metric"] for a, b in zip(cat.curve, dog.curve,
                                                                                         strict=True)]
    assert [c["metric"] for c in rows.curve] == [c["metric"] for c in both.curve]
    assert both.probe["instead"] == "'<answer>dog</answer>'" and rows.probe["instead"] == "column alt"


def test_the_console_script_prints_the_audit_as_json_and_draws_it(trained, tmp_path):
    root, audit = trained
    proc = cli("attribute", "r", "--held-out", "2", "--every", "2", "--json", "--plot", tmp_path / "a.png",
               "--ledger", root / "l.db", process=True)
    report = json.loads(proc.stdout)
    assert [(c["generation"], c["fingerprint"]) for c in report["curve"]] == [
        (c["generation"], c["fingerprint"]) for c in audit.curve if c["generation"] in (0, 2, 4)]
    assert [c["metric"] for c in report["curve"]] == [c["metric"] for c in audit.curve if c["generation"] in (0, 2, 4)]
    assert report["plot"] == str(tmp_path / "a.png") and (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    assert "updates replayed" in proc.stderr


def test_refusals_are_one_line_and_leave_the_ledger_as_it_was(trained, zeroed):
    root, _ = trained
    db = root / "l.db"
    bad = [
        (["attribute", "r", "--prompt", "Say cat"], "--prompt and --answer go together"),
        (["attribute", "r", "--row", "999"], "training row 999 is in no batch"),
        (["attribute", "r", "--every", "0"], "--every must be at least 1"),
        (["attribute", "r", "--by", "vibes"], "--by must be one of likelihood, reward"),
        (["attribute", "zeroed", "--training-rows"], "generation 2's recorded coefficients do not follow from its "
                                                     "row scores"),
        (["attribute", "r", "--held-out", "9"], "the task has 4 held-out rows"),
    ]
    before = db.read_bytes()
    for args, message in bad:
        proc = cli(*args, "--ledger", db, check=False)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, (args, proc.stderr)
    assert db.read_bytes() == before
