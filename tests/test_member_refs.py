"""`RUN@G#M` (member M of generation G: `RUN@G-1` plus its perturbation) in `show`, `diff`
and `export` on a real ES run of `tiny`: real SQLite, real training, real replay. The GA's
members (elite, the child that is the next master) are checked in tests/test_ga.py, the
seed-file format (version 3's `member` entry) in tests/test_seedfile.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import seedledger as sl
from seedledger.engine.cli import audit
from seedledger.ledger import Ledger
from seedledger.replay.fingerprint import fingerprint
from tests.support.configs import TINY
from tests.support.runs import cli as _cli

CONFIG = {**TINY, "keep_samples": True}  # the suite's tiny run, with its outputs stored


@pytest.fixture(scope="module")
def es(tmp_path_factory, tiny_model_dir) -> Path:
    """One mirrored ES run `e` of 2 generations, its samples kept, in a real SQLite file."""
    where = tmp_path_factory.mktemp("members") / "ledger.db"
    assert sl.train(CONFIG, run="e", ledger=where).latest_generation == 2
    return where


def test_show_a_member_as_json_and_text(es):
    shown = json.loads(_cli("show", "e@2#1", "--samples", "--json", "--ledger", es).stdout)
    with Ledger.open(es) as led:
        record, parent = led.generation("e", 2), led.generation("e", 1)
    m = record.members[1]
    assert {k: shown[k] for k in ("ref", "run", "generation", "member", "parent", "recorded_in")} == {
        "ref": "e@2#1", "run": "e", "generation": 2, "member": 1, "parent": "e@1", "recorded_in": "e"}
    assert shown["parent_fingerprint"] == parent.fingerprint
    assert (shown["key"], shown["sign"], shown["reward"], shown["coefficient"], shown["sigma"]) == (
        f"{m.key:016x}", m.sign, m.reward, m.coefficient, record.sigma)
    assert shown["components"] == m.components and set(m.components) == {"arithmetic", "length"}
    assert shown["perturbation"] == {"noise_spec": "v1", "param_selection": "all"}
    assert shown["samples"] == json.loads(json.dumps(m.samples)) and len(m.samples) == TINY["batch_size"]
    assert shown["same_weights_as"] is None and "ga" not in shown and "cmaes" not in shown  # ES
    plain = json.loads(_cli("show", "e@2#1", "--json", "--ledger", es).stdout)
    assert "samples" not in plain and plain["key"] == shown["key"]
    text = _cli("show", "e@2#1", "--samples", "--ledger", es).stdout
    sign = {1: "+", -1: "−"}[m.sign]
    assert "e@2#1" in text and f"e@1 {sign} σ·ε(key)" in text and "member 1 outputs" in text
    assert m.samples[0]["prompt"] in text


def test_show_refuses_a_member_named_twice(es):
    proc = _cli("show", "e@2#1", "2", "--ledger", es, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: 'e@2#1' names member 1 already: drop the MEMBER argument 2"]


def _l2(a: dict, b: dict) -> float:
    return math.sqrt(sum(float(((b[n].double() - t.double()) ** 2).sum()) for n, t in a.items()))


def test_diff_a_member_against_its_generation_and_another_member(es):
    """A member side is rebuilt as `rebuild RUN@G#M` is (same fingerprint, same numbers);
    a mirrored pair (one key, signs + and −) lies 2σε apart; a note says where a member's
    fingerprint comes from."""
    with Ledger.open(es) as led:
        to_member = audit.diff(led, "e@1", "e@2#1")
        pair = audit.diff(led, "e@2#0", "e@2#1")
        itself = audit.diff(led, "e@2#1", "e@2#1")
        plain = audit.diff(led, "e@1", "e@2")
        m0, m1 = led.generation("e", 2).members[:2]
    parent, member = sl.rebuild("e@1", ledger=es), sl.rebuild("e@2#1", ledger=es)
    assert to_member["a"] == {"run": "e", "generation": 1, "fingerprint": fingerprint(parent)}  # as before
    assert to_member["b"] == {"run": "e", "generation": 2, "member": 1,
                              "fingerprint": fingerprint(member), "parent_fingerprint": fingerprint(parent)}
    assert to_member["shared_generations"] == 1 and len(to_member["notes"]) == 1 and plain["notes"] == []
    assert to_member["total"]["l2"] == pytest.approx(_l2(parent, member), rel=1e-9)
    assert to_member["total"]["changed"] == to_member["total"]["numel"]  # σ·ε moves every weight
    assert (m0.key, m0.sign, m1.sign) == (m1.key, 1, -1)
    assert pair["total"]["l2"] == pytest.approx(2 * to_member["total"]["l2"], rel=1e-3)
    assert itself["total"]["changed"] == 0
    text = _cli("diff", "e@2#0", "e@2#1", "--top", "1", "--ledger", es).stdout
    assert "e@2#1 − e@2#0" in text and "note: a member has no fingerprint in the ledger" in " ".join(text.split())


def test_export_a_member_rebuilds_to_its_fingerprint(es, tmp_path):
    """`export RUN@G#M` → `rebuild FILE` gives what `rebuild RUN@G#M` gives (a generation-1
    member too, whose file holds no generation); `import` refuses the file in one line."""
    for ref in ("e@2#1", "e@1#2"):
        seeds = tmp_path / f"{ref}.seeds"
        report = sl.export(ref, seeds, ledger=es)
        assert (report["generation"], report["member"]) == (int(ref[2]), int(ref[-1]))
        direct = sl.rebuild_to(ref, tmp_path / "direct", ledger=es, force=True)
        from_file = sl.rebuild_to(seeds, tmp_path / "file", ledger=es, force=True)
        same = ("run", "generation", "member", "parent_fingerprint", "fingerprint")
        assert {k: from_file[k] for k in same} == {k: direct[k] for k in same}
        assert fingerprint(sl.rebuild(seeds)) == direct["fingerprint"]
    text = _cli("export", "e@2#1", "-o", tmp_path / "cli.seeds", "--ledger", es).stdout
    assert text.startswith(f"wrote {tmp_path / 'cli.seeds'}") and text.rstrip().endswith("for e@2#1")
    proc = _cli("import", tmp_path / "cli.seeds", "--run", "copy", "--ledger", es, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "names one member (e@2#1), not a run's history" in proc.stderr
    with Ledger.open(es) as led:
        assert not led.has_run("copy")
