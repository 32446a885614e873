"""Low-rank runs at the replay level: rebuild, verify, forks that change kind, and anchors."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from seedledger.ledger import GenerationRecord, Ledger, MemberRecord
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import noise, update
from seedledger.replay.anchors import save_anchor
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.perturbation import (
    Perturbation,
)
from seedledger.replay.rebuild import rebuild, verify
from tests.test_lowrank import OPTS

# --- rebuild / verify / fork / anchors of low-rank runs -----------------------------------


def train(led: Ledger, run: str, master, state, first: int, last: int, kind: Perturbation, opt: dict):
    """What the engine does: commit a record, applying it through replay's own update."""
    rk = led.get_run(run).run_key
    rng = np.random.default_rng(first)
    for g in range(first, last + 1):
        members = [MemberRecord(i, noise.member_key(rk, g, i // 2), 1 - 2 * (i % 2), 0.0,
                                0.0 if i % 2 else noise.round_coefficient(float(rng.standard_normal()) * 0.05))
                   for i in range(6)]
        rec = GenerationRecord(g, 0.05, noise.round_coefficient(1e-3), 6, dict(opt), g, [], members, None)
        update.apply_step(master, state, rec, perturbation=kind)
        rec.fingerprint = fingerprint(master)
        led.commit_generation(run, rec)
    return master, state


def small_model() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"model.embed_tokens.weight": torch.randn(50, 8, generator=g), "model.norm.weight": torch.ones(8),
            "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g),
            "model.layers.0.mlp.down_proj.weight": torch.randn(8, 24, generator=g)}


def _fork(led, run: str, g: int, child: str, kind: Perturbation) -> None:
    """A child of run@g with the same key but another perturbation kind, as a fork makes it."""
    spec = replace(led.get_run(run).spec(), noise_spec=kind.noise_spec, param_selection=kind.param_selection)
    led.create_run(child, spec, parent=(run, g))


def test_rebuild_verify_fork_and_anchors_of_lowrank_runs(tmp_path):
    led = Ledger.open(str(tmp_path / "l.db"))
    base = small_model()
    clone = lambda m: {k: v.clone() for k, v in m.items()}  # noqa: E731
    lr4 = Perturbation.lowrank(4)
    opt = OPTS["adam"]
    led.create_run("low", base_model="synthetic", base_fingerprint=fingerprint(base), noise_spec=lr4.noise_spec,
                   param_selection=lr4.param_selection, seed=1, run_key=noise.run_key(1))
    master, state = train(led, "low", clone(base), update.OptimizerState(), 1, 4, lr4, opt)
    assert torch.equal(master["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    save_anchor(led, "low", 2, *rebuild(led, "low", 2, clone(base)), tmp_path / "anchors")
    assert verify(led, "low", None, clone(base)) == fingerprint(master)
    from_anchor, st = rebuild(led, "low", 4, clone(base), anchors_dir=tmp_path / "anchors", verify="every")
    assert fingerprint(from_anchor) == fingerprint(master) and st.step == 4
    # a fork that switches kind: gens 1..2 replay low-rank (r=4), 3..4 full, 5..6 low-rank r=1
    _fork(led, "low", 2, "full", Perturbation())
    m2, s2 = rebuild(led, "low", 2, clone(base))
    m4, s4 = train(led, "full", m2, s2, 3, 4, Perturbation(), opt)
    assert not torch.equal(m4["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    _fork(led, "full", 4, "low1", Perturbation.lowrank(1, ["q_proj"]))
    assert led.get_run("low1").param_selection == "suffix:q_proj"
    m6, _ = train(led, "low1", m4, s4, 5, 6, Perturbation.lowrank(1, ["q_proj"]), opt)
    assert verify(led, "low1", None, clone(base)) == fingerprint(m6)
    led.create_run("odd", base_model="synthetic", noise_spec="lowrank-v1:r=3", param_selection="suffix:q_proj",
                   run_key=1)
    with pytest.raises(SeedLedgerError, match="run 'odd': unknown noise spec"):
        rebuild(led, "odd", 0, clone(base))
    led.close()
