"""Low-rank runs end to end on `tiny`: the population decoded in batched groups, the exact
low-rank update, and the ledger's guarantees (verify, SIGKILL + resume, forks)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import yaml

from seedledger.engine.runtime import session
from seedledger.ledger import Ledger
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints

LOWRANK = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 12}]},
    "perturbation": {"kind": "lowrank", "rank": 4},
    "population": 6,
    "members_per_forward": 4,  # 6 members: a group of 4 and a group of 2
    "sigma": 0.05,
    "lr": 0.05,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 5,
    "seed": 3,
}


def _config(tmp_path: Path, **changes) -> Path:
    path = tmp_path / "lowrank.yaml"
    path.write_text(yaml.safe_dump(LOWRANK | changes))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lowrank")
    ledger_path = tmp / "ref.db"
    with Ledger.open(str(ledger_path)) as led:
        result = session.start(led, str(_config(tmp)), "ref", [], None)
    return ledger_path, _fingerprints(ledger_path, "ref"), result


def test_run_records_its_kind_and_group_size_and_verifies(reference):
    ledger_path, fps, result = reference
    assert len(set(fps)) == 3 and result.fingerprint == fps[-1]
    with Ledger.open(str(ledger_path)) as led:
        run = led.get_run("ref")
        assert run.noise_spec == "lowrank-v1:r=4"
        assert run.param_selection.startswith("suffix:q_proj,")
        assert run.config["members_per_forward"] == 4
        from seedledger.engine.rebuild.rebuilding import verify_ref

        assert verify_ref(led, "ref")["fingerprint"] == fps[-1]


def test_only_the_targeted_linears_move(reference, tiny_model_dir):
    ledger_path, _, _ = reference
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.replay.perturbation import Perturbation
    from seedledger.replay.rebuild import rebuild

    base = HFBackend(tiny_model_dir).master()
    with Ledger.open(str(ledger_path)) as led:
        master, _ = rebuild(led, "ref", None, {n: t.clone() for n, t in base.items()})
    spec = Perturbation.lowrank(4)
    moved = {n for n in base if not torch.equal(base[n], master[n])}
    trained = {n for n, t in base.items() if spec.trained(n, tuple(t.shape))}
    assert moved == trained and trained  # every targeted matrix, nothing else (norms, embeddings)


def test_group_size_is_chosen_at_creation_and_stored(tmp_path, tiny_model_dir):
    from seedledger.engine.config import validate
    from seedledger.engine.runtime.setup import batching

    auto = validate({k: v for k, v in LOWRANK.items() if k != "members_per_forward"})
    assert batching.resolve(auto, tiny_model_dir) == min(6, batching.CPU_ROWS // 2)
    full = validate({"model": "tiny"})
    assert batching.resolve(full, tiny_model_dir) == 1
    with Ledger.open(str(tmp_path / "l.db")) as led:
        session.start(led, None, "auto", ["model=tiny", "perturbation=lowrank", "max_new_tokens=2",
                                          "batch_size=2", "population=2"], 1)
        assert led.get_run("auto").config["members_per_forward"] == 2


@pytest.mark.slow
def test_sigkill_during_evaluation_and_after_commit_then_resume(reference, tmp_path):
    _, fps, _ = reference
    ledger_path = tmp_path / "crash.db"
    cmd = ["train", str(_config(tmp_path)), "--run", "c", "--ledger", str(ledger_path), "--json"]
    for point in ("member@1", "committed@2"):
        proc = _cli(*cmd, env=os.environ | {"SEEDLEDGER_FAILPOINT": point}, check=False)
        assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
        done = _fingerprints(ledger_path, "c")
        assert done == fps[: len(done)]
        cmd = ["resume", "c", "--ledger", str(ledger_path), "--json"]
    assert json.loads(_cli(*cmd).stdout)["latest_generation"] == 3
    assert _fingerprints(ledger_path, "c") == fps


def test_fork_changes_kind_and_both_verify(reference, tmp_path):
    ledger_path, fps, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        child = session.fork(led, "ref@2", "to-full", ["perturbation=full"], 1)
        assert led.get_run("to-full").noise_spec == "v1"
        assert led.get_run("to-full").config["members_per_forward"] == 1
        from seedledger.engine.rebuild.rebuilding import verify_ref

        assert verify_ref(led, "to-full")["fingerprint"] == child.fingerprint
        assert child.fingerprint not in fps
