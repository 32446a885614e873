"""Rebuild / verify / fork / anchors against a real ledger (SQLite in a temp dir)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from seedledger.ledger import GenerationRecord, Ledger, MemberRecord
from seedledger.ledger.errors import SeedLedgerError, VerifyMismatch
from seedledger.replay import noise, update
from seedledger.replay.anchors import save_anchor
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.rebuild import rebuild, verify

ROOT = Path(__file__).resolve().parents[1]
OPT = {"name": "momentum", "lr": 0.05, "beta": 0.9, "dampening": 0.9}
POP = 6


def base_master() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(300, 16, generator=g),
        "layer.0.weight": torch.randn(16, 16, generator=g),
        "layer.0.bias": torch.randn(16, generator=g),
        "norm.weight": torch.ones(16),
        "scalar": torch.randn(1, generator=g),
    }


def clone(m):
    return {k: v.clone() for k, v in m.items()}


def train(ledger: Ledger, run: str, master, state, first: int, last: int, seed: int, corrupt_at: int | None = None):
    """What the engine does: commit a record, applying it through replay's own update."""
    rk = ledger.get_run(run).run_key
    rng = np.random.default_rng(seed)
    for g in range(first, last + 1):
        members = []
        for i in range(POP):
            c = noise.round_coefficient(float(rng.standard_normal()) * 0.1)
            members.append(MemberRecord(i, noise.member_key(rk, g, i), 1 if i % 2 == 0 else -1, float(i), c))
        rec = GenerationRecord(g, OPT["lr"], noise.round_coefficient(1e-3), POP, dict(OPT), g, [], members, None)
        update.apply_step(master, state, rec)
        rec.fingerprint = fingerprint(master) if g != corrupt_at else "0" * 32
        ledger.commit_generation(run, rec)
    return master, state


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    ledger = Ledger.open(str(tmp / "l.db"))
    base = base_master()
    save_file(base, str(tmp / "base.safetensors"))
    ledger.create_run("main", base_model="synthetic", base_fingerprint=fingerprint(base), noise_spec="v1",
                      config={"seed": 3}, seed=3, run_key=noise.run_key(3))
    master, state = train(ledger, "main", clone(base), update.OptimizerState(), 1, 12, seed=1)
    fps = {g: ledger.generation("main", g).fingerprint for g in range(1, 13)}
    yield {"ledger": ledger, "tmp": tmp, "base": base, "master": master, "state": state, "fps": fps}
    ledger.close()


def test_rebuild_reproduces_training(world):
    led = world["ledger"]
    master, state = rebuild(led, "main", 12, clone(world["base"]), verify="every")
    assert fingerprint(master) == world["fps"][12] == fingerprint(world["master"])
    assert state.step == 12 and state.name == "momentum"
    m7, _ = rebuild(led, "main", 7, clone(world["base"]), verify="end")
    assert fingerprint(m7) == world["fps"][7]
    m0, s0 = rebuild(led, "main", 0, clone(world["base"]))
    assert fingerprint(m0) == fingerprint(world["base"]) and s0.step == 0


def test_new_process_reproduces_every_stored_fingerprint(world):
    script = r"""
import json, sys
from safetensors.torch import load_file
from seedledger.ledger import Ledger
from seedledger.replay.fingerprint import fingerprint
led = Ledger.open(sys.argv[1])
master = load_file(sys.argv[2])
got = {}
master = {k: master[k] for k in ["embed.weight", "layer.0.weight", "layer.0.bias", "norm.weight", "scalar"]}
from seedledger.replay.update import OptimizerState, apply_step
st = OptimizerState()
for step in led.replay_history("main"):
    apply_step(master, st, step)
    got[step.index] = fingerprint(master)
print(json.dumps(got))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", script, str(world["tmp"] / "l.db"),
                          str(world["tmp"] / "base.safetensors")],
                         capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    got = {int(k): v for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}
    assert got == world["fps"]


def test_wrong_base_is_refused(world):
    wrong = clone(world["base"])
    wrong["scalar"] += 1.0
    with pytest.raises(SeedLedgerError, match="fingerprint"):
        rebuild(world["ledger"], "main", 3, wrong)


def test_verify_names_first_bad_generation(world):
    led = world["ledger"]
    led.create_run("bad", base_model="synthetic", base_fingerprint=fingerprint(world["base"]), noise_spec="v1",
                   seed=4, run_key=noise.run_key(4))
    train(led, "bad", clone(world["base"]), update.OptimizerState(), 1, 5, seed=2, corrupt_at=3)
    assert verify(led, "bad", 2, clone(world["base"])) == led.generation("bad", 2).fingerprint
    with pytest.raises(VerifyMismatch, match="generation 3 "):
        verify(led, "bad", 5, clone(world["base"]))
    # "end" checks only the last generation, whose record is right: the history replays
    master, _ = rebuild(led, "bad", 5, clone(world["base"]), verify="end")
    assert fingerprint(master) == led.generation("bad", 5).fingerprint


def steps_done(led, run, g, anchors_dir, base):
    counts = []
    master, state = rebuild(led, run, g, clone(base), verify="end", anchors_dir=anchors_dir,
                            progress=lambda done, total: counts.append(total))
    return master, state, (counts[-1] if counts else 0)


def test_anchors_used_and_fallback(world, tmp_path):
    led, base = world["ledger"], world["base"]
    adir = tmp_path / "anchors"
    for g in (4, 8):
        m, s = rebuild(led, "main", g, clone(base))
        info = save_anchor(led, "main", g, m, s, adir)
        assert Path(info.path).name == f"{info.sha256}.safetensors.zst" and info.fingerprint == world["fps"][g]
        assert save_anchor(led, "main", g, m, s, adir).sha256 == info.sha256  # same content, same file
    master, state, n = steps_done(led, "main", 12, adir, base)
    assert n == 4 and fingerprint(master) == world["fps"][12] and state.step == 12
    assert torch.equal(state.buffers["momentum"]["embed.weight"], world["state"].buffers["momentum"]["embed.weight"])

    a8 = next(a for a in led.anchors("main") if a.generation == 8)
    raw = bytearray(Path(a8.path).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    Path(a8.path).write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="corrupt"):
        master, _, n = steps_done(led, "main", 12, adir, base)
    assert n == 8 and fingerprint(master) == world["fps"][12]

    a4 = next(a for a in led.anchors("main") if a.generation == 4)
    Path(a4.path).unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        master, _, n = steps_done(led, "main", 12, adir, base)
    assert n == 12 and fingerprint(master) == world["fps"][12]
    assert any("cannot read" in str(w.message) for w in caught)
    # a moved anchors directory is found by file name; no anchors_dir means no anchors
    assert steps_done(led, "main", 3, None, base)[2] == 3


def test_anchor_with_wrong_weights_is_skipped(world, tmp_path):
    """A well-formed file whose master is not the ledger's model is caught by fingerprint."""
    led, base = world["ledger"], world["base"]
    led.create_run("fp", base_model="synthetic", base_fingerprint=fingerprint(base), noise_spec="v1",
                   seed=3, run_key=noise.run_key(3))
    train(led, "fp", clone(base), update.OptimizerState(), 1, 3, seed=1)
    lie = clone(base)  # claims to be fp@2 but holds the base weights
    save_anchor(led, "fp", 2, lie, update.OptimizerState(), tmp_path)
    with pytest.warns(RuntimeWarning, match="fingerprint"):
        master, _, n = steps_done(led, "fp", 3, tmp_path, base)
    assert n == 3 and fingerprint(master) == led.generation("fp", 3).fingerprint


def test_fork_continues_from_parent(world, tmp_path):
    led, base = world["ledger"], world["base"]
    child = led.create_run("child", led.get_run("main").spec(), parent=("main", 6))  # as a fork does
    assert child.parent == ("main", 6) and child.run_key == led.get_run("main").run_key
    m6, s6 = rebuild(led, "child", 6, clone(base))
    assert fingerprint(m6) == world["fps"][6]
    train(led, "child", m6, s6, 7, 9, seed=11)
    assert led.generation("child", 9).fingerprint != world["fps"][9]
    master, state = rebuild(led, "child", 9, clone(base), verify="every")
    assert fingerprint(master) == led.generation("child", 9).fingerprint and state.step == 9
    # the parent's anchor after the fork point is not this lineage's model
    m8, s8 = rebuild(led, "main", 8, clone(base))
    save_anchor(led, "main", 8, m8, s8, tmp_path)
    m5, s5 = rebuild(led, "main", 5, clone(base))
    save_anchor(led, "main", 5, m5, s5, tmp_path)
    master, _, n = steps_done(led, "child", 9, tmp_path, base)
    assert n == 4 and fingerprint(master) == led.generation("child", 9).fingerprint
    with pytest.raises(SeedLedgerError):
        led.create_run("nope", led.get_run("main").spec(), parent=("main", 99))
