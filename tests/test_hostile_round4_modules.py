"""Issue 46, round 4, module runs (any torch.nn.Module): a `gym:MODULE:ENV` task imports
MODULE, which the trust refusal now names and the session fingerprints (item 7); verify
checks the factory a module run names (item 8); a foreign module ledger's generation-0
anchor is read within a bound of its own and the memory estimate counts module runs
(item 3)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_walkthrough import Cli

import seedledger as sl
from seedledger.engine.runtime.setup.inputs import InputsChanged
from tests.support.cli import script

pytestmark = pytest.mark.slow

NET = ("import torch\n\ndef net():\n"
       "    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))\n")
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


def _peak_rss(args: list, env: dict) -> tuple[subprocess.CompletedProcess, int]:
    """Run the console script in a fresh wrapper process; (its result, its peak RSS in MiB)."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(p.returncode); print(p.stderr, end=''); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)")
    out = subprocess.run([sys.executable, "-c", probe, *script(), *map(str, args)], capture_output=True, text=True,
                         env=env, timeout=600).stdout.splitlines()
    return subprocess.CompletedProcess(args, int(out[0]), "", "\n".join(out[1:-1])), int(out[-1])


def test_a_foreign_module_ledgers_anchor_bomb_stays_within_a_small_bound(tmp_path):
    """Item 3: a module run's base is read from its generation-0 anchor, and the read was
    bounded by the shapes the ledger's own `module` event declares: a ~100 KB anchor that
    inflates to 1 GiB, with an event claiming 2**28 parameters, was read whole before its
    fingerprint failed. The bound is now also the file's own (32x its size, at least 64
    MiB): the ledger is refused in one line, the process grows by far less than 1 GiB."""
    import zstandard

    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "fit.py").write_text(FIT)
    sl.evolve(f"module:{tmp_path / 'net.py'}:net", f"fitness:{tmp_path / 'fit.py'}:fit", population=4,
              sigma=0.0625, lr=0.125, generations=1, ledger=tmp_path / "l.db", run="a")
    env = {k: v for k, v in os.environ.items() if k != "SEEDLEDGER_REBUILD_MEMORY_MB"}
    verify = ["verify", "a", "--ledger", tmp_path / "l.db"]
    clean, baseline = _peak_rss(verify, env)
    assert clean.returncode == 0, clean.stderr

    z = zstandard.ZstdCompressor(level=1).compressobj()
    chunk = bytes(1 << 20)
    bomb = b"".join(z.compress(chunk) for _ in range(1024)) + z.flush()  # 1 GiB of zeros
    sha = hashlib.sha256(bomb).hexdigest()
    (tmp_path / "l.db.anchors" / f"{sha}.safetensors.zst").write_bytes(bomb)
    con = sqlite3.connect(tmp_path / "l.db")
    with con:  # what the attacker edits: the anchor row and the event that sizes it
        con.execute("UPDATE anchors SET sha256 = ?, size = ? WHERE generation = 0", (sha, len(bomb)))
        con.execute("UPDATE events SET payload = json_set(payload, '$.parameters', json(?)) WHERE kind = 'module'",
                    (json.dumps([["0.weight", [1 << 28], "float32"]]),))
    con.close()
    refused, peak = _peak_rss(verify, env)
    (line,) = refused.stderr.strip().splitlines()
    assert refused.returncode == 2 and "the base weights beside the ledger are unusable" in line
    assert f"decompresses to more than {64 << 20} bytes" in line and "--base module:" in line
    assert peak - baseline < 256, (baseline, peak)  # a read of 1 GiB before


def test_the_rebuild_memory_estimate_counts_a_module_run(tmp_path):
    """Item 3: the estimate read no safetensors for a module run and counted 0 bytes; it
    now counts its base as loaded and the replay state its steps keep."""
    (tmp_path / "net.py").write_text(NET)
    (tmp_path / "fit.py").write_text(FIT)
    sl.evolve(f"module:{tmp_path / 'net.py'}:net", f"fitness:{tmp_path / 'fit.py'}:fit", population=4,
              sigma=0.0625, lr=0.125, generations=1, ledger=tmp_path / "l.db", run="a", config={"optimizer": "adam"})
    cli = Cli(tmp_path, "l.db")
    cli.env["SEEDLEDGER_REBUILD_MEMORY_MB"] = "0.0005"  # 524 bytes: 58 parameters and Adam's two moments are 696
    line = cli.bad("verify", "a")
    assert "replaying needs about 0.0 MiB (an fp32 base of 58 parameters plus 2 optimizer/path copies of 58 " \
           "trained ones), more than the bound of 0.0 MiB (SEEDLEDGER_REBUILD_MEMORY_MB)" in line
    assert "replaying needs about 0.0 MiB" in cli.bad("rebuild", "a", "-o", "out")
    cli.env["SEEDLEDGER_REBUILD_MEMORY_MB"] = "0.001"
    assert cli.json("verify", "a")["ok"]
