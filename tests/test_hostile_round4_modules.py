"""Issue 46, round 4, module runs (any torch.nn.Module): a `gym:MODULE:ENV` task imports
MODULE, which the trust refusal now names and the session fingerprints (item 7); verify
checks the factory a module run names (item 8)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

import seedledger as sl
from seedledger.engine.runtime.inputs import InputsChanged

pytestmark = pytest.mark.slow

NET = "import torch\n\ndef net():\n    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))\n"
PLANTED = """import pathlib

import gymnasium

pathlib.Path(__file__).with_suffix(".imported").write_text("imported")  # what running it leaves
gymnasium.register(id="Planted-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=20)
"""


@pytest.fixture
def gym_module(tmp_path, monkeypatch) -> Path:
    """A model factory and a module `planted` on sys.path that registers an env when
    imported (and leaves `planted.imported` behind to say it ran)."""
    pytest.importorskip("gymnasium")
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "planted.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    yield tmp_path
    sys.modules.pop("planted", None)


def test_a_gym_env_ids_module_is_named_by_the_trust_refusal_and_fingerprinted(gym_module):
    """Item 7: `task: gym:planted:Planted-v0` makes gymnasium import `planted`. The refusal
    listed only the model factory, so --trust-code given for the factory ran an unnamed
    module too; now it names both, imports neither, and the module is an input."""
    root = gym_module
    model = f"module:{root / 'net.py'}:net"
    config = {"model": model, "task": "gym:planted:Planted-v0", "population": 4, "sigma": 0.125, "lr": 0.125,
              "generations": 1}
    sl.train(config, run="g", ledger=root / "l.db")
    with sl.open_ledger(root / "l.db") as led:
        (session,) = [e.payload for e in led.events("g", "inputs")]
    assert str(root / "planted.py") in session["files"] and str(root / "net.py") in session["files"]
    (root / "planted.imported").unlink()
    sys.modules.pop("planted", None)

    line = Cli(root, "l.db").bad("resume", "g", "-n", "1")
    assert f"'{model}', 'gym:planted:Planted-v0 (imports planted)'" in line and "--trust-code" in line
    with pytest.raises(sl.SeedLedgerError, match=r"imports planted\)'; code named by a ledger"):
        sl.evaluate("g", rows=1, ledger=root / "l.db")
    assert not (root / "planted.imported").exists()  # refused before anything was imported

    (root / "planted.py").write_text(PLANTED + "# the env changed\n")
    with pytest.raises(InputsChanged, match=f"file {root / 'planted.py'}: "):
        sl.resume("g", generations=1, ledger=root / "l.db", trust_code=True)


FIT = """import torch

X = torch.linspace(-1, 1, 32).reshape(8, 4)

def fit(model):
    with torch.no_grad():
        return -float((model(X) ** 2).mean())
"""


def test_verify_of_a_module_run_checks_the_factory_it_names(tmp_path):
    """Item 8: verify rebuilds a module run from the base beside the ledger and never runs
    its factory, so after the factory changed it said "weights match; inputs: unchanged"
    while resume refused. It now compares the factory's source (found, never imported) with
    the record of the session that trained the generation: a change fails verify, exit 1."""
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "fit.py").write_text(FIT)
    model = f"module:{tmp_path / 'net.py'}:net"
    sl.evolve(model, f"fitness:{tmp_path / 'fit.py'}:fit", population=4, sigma=0.0625, lr=0.125, generations=1,
              ledger=tmp_path / "l.db", run="a")
    cli = Cli(tmp_path, "l.db")
    assert cli.json("verify", "a")["factory"] == {"status": "unchanged", "text": f"factory {model}: unchanged"}

    before = hashlib.sha256((tmp_path / "net.py").read_bytes()).hexdigest()
    (tmp_path / "net.py").write_text(NET.replace("Tanh", "ReLU"))  # the same parameters, another forward
    after = hashlib.sha256((tmp_path / "net.py").read_bytes()).hexdigest()
    line = cli.bad("verify", "a", code=1)
    assert line == (f"error: a@1 does not verify: factory {model} changed since a@1 was trained (file "
                    f"{tmp_path / 'net.py'}: {before[:12]} -> {after[:12]}): the weights replay from the base beside "
                    "the ledger, but that code no longer makes the model they were trained as (resume refuses it too)")
    with pytest.raises(InputsChanged, match="net.py"):
        sl.resume("a", generations=1, ledger=tmp_path / "l.db", trust_code=True)

    (tmp_path / "net.py").unlink()  # verifying where the code is not: the weights, and says so
    report = sl.verify("a", ledger=tmp_path / "l.db")
    assert report["ok"] and report["factory"]["status"] == "not found here"
