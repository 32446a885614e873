"""Issue 46, round 4, module runs (any torch.nn.Module): a `gym:MODULE:ENV` task imports
MODULE, which the trust refusal now names and the session fingerprints (item 7)."""

from __future__ import annotations

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
