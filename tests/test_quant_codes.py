"""ES over the int8 codes themselves (`train: quant_codes`, QES-style): the residual's rule
(golden vectors), one step's exact update, members on the dequantized weights, and runs on
`tiny` that verify, resume after SIGKILL, fork, round-trip a seed file and rebuild to a
checkpoint transformers loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from seedledger.engine.runtime import session
from seedledger.ledger import Ledger, ReplayStep
from seedledger.ledger.errors import SeedLedgerError
from seedledger.replay import noise, quant
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.kinds import QuantCodes, QuantScales, from_run
from seedledger.replay.kinds.quant_codes import RESIDUAL, move_codes_
from seedledger.replay.rebuild import apply_member
from seedledger.replay.update import OptimizerState, apply_step
from tests.support.int8_runs import (
    CONFIG_REFUSALS,
    checkpoint_round_trip,
    config_refuses,
    fork_refuses_another_kind,
)
from tests.support.runs import fingerprints as _fingerprints

TARGETS = ("q_proj", "v_proj", "down_proj")
CONFIG = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
    "train": {"kind": "quant_codes", "targets": list(TARGETS)},
    "population": 4,
    "sigma": 1e-3,  # weight units, as a full run
    "lr": 6e-4,  # Adam moves the residual by ~lr a generation; tiny's steps (absmax/127) are ~1.6e-3
    "optimizer": "adam",
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 6,
    "seed": 3,
}


def _config(tmp_path: Path, name: str = "qc", **changes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(CONFIG | changes))
    return path


def _weight() -> torch.Tensor:
    return noise.generate(7, 6 * 8).view(6, 8) * 0.0625


def _f32(*xs: float) -> list[float]:
    return [float(np.float32(x)) for x in xs]


# ----------------------------------------------------------------------------- the rule (golden)


def test_a_code_moves_when_its_residual_passes_half_a_step_golden():
    """k = clamp(round_half_even(R/s), −127−q, 127−q); q += k; R −= k·s, in fp32. Steps
    0.5 and 0.25 (exact products), and a zero step (nothing moves)."""
    q = torch.tensor([[0, 5, 126, -126, 3, 0],
                      [1, 1, -3, 127, 0, 0],
                      [0, 7, -7, 0, 0, 0]], dtype=torch.int8)
    r = torch.tensor([[0.2, 0.3, 0.9, -0.8, 0.25, -0.25],
                      [0.375, 0.625, -0.375, 0.5, -0.1, 2.0],
                      [1.0, -1.0, 0.0, 0.0, 5.0, -0.0]], dtype=torch.float32)
    s = torch.tensor([0.5, 0.25, 0.0])
    move_codes_(q, r, s)
    assert q.dtype == torch.int8 and r.dtype == torch.float32
    assert q.tolist() == [
        [0, 6, 127, -127, 3, 0],  # 0.4: stays; 0.6: moves; 1.8 and −1.6 clamped to ±127; ±0.5 exactly: ties to 0
        [3, 3, -5, 127, 0, 8],  # 1.5 → 2, 2.5 → 2, −1.5 → −2 (half to even); 127 + 2 clamped; 8 steps at once
        [0, 7, -7, 0, 0, 0],  # a zero step moves nothing
    ]
    half = np.float32(0.5)
    assert r[0].tolist() == [*_f32(0.2), float(np.float32(0.3) - half), float(np.float32(0.9) - half),
                             float(np.float32(-0.8) + half), 0.25, -0.25]
    assert r[1].tolist() == [-0.125, 0.125, 0.125, 0.5, *_f32(-0.1), 0.0]  # what a clamp leaves stays in R
    assert r[2].tolist() == [1.0, -1.0, 0.0, 0.0, 5.0, -0.0]


def test_kind_strings_round_trip_and_refusals():
    kind = QuantCodes.of(TARGETS)
    assert (kind.noise_spec, kind.param_selection) == ("v1", "int8-codes-v1:targets=q_proj,v_proj,down_proj")
    assert from_run(kind.noise_spec, kind.param_selection) == kind
    assert from_run("v1", "int8-scales-v1:targets=q_proj") == QuantScales.of(("q_proj",))
    for spec, selection, message in [
        ("lowrank-v1:r=1", "int8-codes-v1:targets=q_proj", "quantization codes are perturbed with noise spec 'v1'"),
        ("v1", "int8-codes-v1:targets=q_proj,q_proj", "without repeats"),
        ("v1", "int8-codes-v1:targets=", "bad quant_codes target"),
        ("v1", "int8-codes-v1:q_proj", "bad quant_codes parameter selection"),
    ]:
        with pytest.raises(SeedLedgerError, match=message) as info:
            from_run(spec, selection)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("extra, refusal", CONFIG_REFUSALS)
def test_what_a_codes_run_cannot_do_is_refused_in_the_config(extra, refusal):
    config_refuses("quant_codes", extra, refusal)


def _step(index: int, keys, coefs, optimizer, targets=("q_proj",)) -> ReplayStep:
    kind = QuantCodes.of(targets)
    return ReplayStep("r", index, keys, coefs, noise.round_coefficient(1e-3), optimizer,
                      kind.noise_spec, kind.param_selection)


COEFS = [noise.round_coefficient(x) for x in (3e-2, -1e-2)]


def test_one_step_quantizes_then_the_residual_moves_the_codes_golden():
    """Generation 1 quantizes the plain master, R = 0 + g (g = (−0.0 + c₀·ε₀) + c₁·ε₁, ε
    under the weight's own name, as a full run), then the codes move; scales and every
    other tensor stay. The residual is optimizer state: not in the fingerprint."""
    w = _weight()
    master = {"m.q_proj.weight": w.clone(), "m.norm.weight": torch.ones(8)}
    state = OptimizerState()
    apply_step(master, state, _step(1, [11, 29], COEFS, {"name": "sgd"}))
    codes, scale = quant.quantize_rows(w)
    g = torch.full((6, 8), -0.0)
    for key, c in zip([11, 29], COEFS, strict=True):
        g = g + noise.generate(noise.tensor_key(key, "m.q_proj.weight"), 48).view(6, 8) * c
    r = torch.zeros(6, 8) + g
    k = torch.round(r / scale.view(-1, 1))
    k = torch.minimum(torch.maximum(k, -127 - codes.float()), 127 - codes.float())
    assert list(master) == ["m.q_proj.weight", "m.q_proj.weight_scale", "m.norm.weight"]
    assert torch.equal(master["m.q_proj.weight"], (codes.float() + k).to(torch.int8))
    assert torch.equal(state.buffers[RESIDUAL]["m.q_proj.weight"], r - k * scale.view(-1, 1))
    assert torch.equal(master["m.q_proj.weight_scale"], scale) and torch.equal(master["m.norm.weight"], torch.ones(8))
    assert 0 < int((k != 0).sum()) < k.numel()  # some codes move, some do not
    assert fingerprint(master) == "1c747067794b046f61dc576ab3118cde"  # golden
    assert list(state.buffers) == [RESIDUAL]


def test_the_residual_carries_across_steps_and_a_change_of_rule():
    """R keeps what did not move; a fork's change of rule (sgd → adam) restarts the
    moments, not the residual."""
    master = {"m.q_proj.weight": _weight(), "m.norm.weight": torch.ones(8)}
    state = OptimizerState()
    apply_step(master, state, _step(1, [11, 29], COEFS, {"name": "sgd"}))
    kept = state.buffers[RESIDUAL]["m.q_proj.weight"].clone()
    apply_step(master, state, _step(2, [5], [0.0], {"name": "adam", "lr": 1e-3}))
    assert set(state.buffers) == {"exp_avg", "exp_avg_sq", RESIDUAL} and state.step == 1
    assert not torch.equal(kept, torch.zeros(6, 8))
    assert torch.equal(state.buffers[RESIDUAL]["m.q_proj.weight"], kept)  # carried; zero moments move it by +0.0
    with pytest.raises(SeedLedgerError, match="int8 codes"):  # a full step cannot train the codes
        apply_step(master, state, ReplayStep("r", 3, [1], [0.5], 0.5, {"name": "sgd"}))


def test_a_members_genome_is_the_dequantized_master_plus_noise_on_the_targets():
    """apply_member: diag(s)·Q + scale·ε(key) on the targeted linears, the rest as stored."""
    master = {"m.q_proj.weight": _weight(), "m.norm.weight": torch.ones(8)}
    apply_step(master, OptimizerState(), _step(1, [11, 29], COEFS, {"name": "sgd"}))
    genome = dict(master)
    step = _step(2, [5, 5], [0.0, 0.0], {"name": "sgd"})
    apply_member(genome, step, 5, -1)
    scale = noise.round_coefficient(-step.sigma)
    deq = quant.dequantize(master["m.q_proj.weight"], master["m.q_proj.weight_scale"])
    assert list(genome) == ["m.q_proj.weight", "m.norm.weight"]
    member = noise.perturb_(torch.empty(6, 8), deq, noise.tensor_key(5, "m.q_proj.weight"), scale)
    assert torch.equal(genome["m.q_proj.weight"], member)
    assert torch.equal(genome["m.norm.weight"], torch.ones(8))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_steps_codes_and_residual_to_the_cpu_bits():
    """Two Adam steps on a CUDA master (the Triton kernel on the residual, torch ops for the
    codes): the CPU's codes, residual and moments bit for bit, and the same member genome."""
    runs = {}
    for device in ("cpu", "cuda"):
        master = {"m.q_proj.weight": _weight().to(device), "m.norm.weight": torch.ones(8, device=device)}
        state = OptimizerState()
        for g in (1, 2):
            apply_step(master, state, _step(g, [11, 29], COEFS, {"name": "adam", "lr": 2e-2}))
        genome = dict(master)
        apply_member(genome, _step(3, [5, 5], [0.0, 0.0], {"name": "sgd"}), 5, 1)
        runs[device] = (master, state, genome)
    (cm, cs, cg), (gm, gs, gg) = runs["cpu"], runs["cuda"]
    assert all(t.device.type == "cuda" for t in gm.values())
    assert fingerprint(gm) == fingerprint(cm)
    for kind, bufs in cs.buffers.items():
        assert all(torch.equal(gs.buffers[kind][n].cpu(), t) for n, t in bufs.items())
    assert all(torch.equal(gg[n].cpu(), t) for n, t in cg.items())


# ----------------------------------------------------------------------------- the HF backend


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    from seedledger.engine.runtime.backends.hf import HFBackend

    return HFBackend(tiny_model_dir, perturbation=QuantCodes.of(TARGETS))


def test_a_loaded_member_is_its_replayed_genome(backend):
    """load_member writes exactly apply_member's genome (generation 1: the plain master is
    quantized for evaluation); load_master the dequantized master."""
    base = backend.master()
    step = _step(1, [11, 11], [0.0, 0.0], {"name": "sgd"}, TARGETS)
    params = dict(backend.model.named_parameters())
    for sign in (1, -1):
        backend.load_member(base, 11, sign, step.sigma)
        genome = {n: t.clone() for n, t in base.items()}
        apply_member(genome, step, 11, sign)
        assert all(torch.equal(params[n].detach(), genome[n]) for n in params)
    backend.load_master(base)
    deq = quant.dequantized(quant.quantized_view(base, QuantCodes.of(TARGETS).quantizes))
    assert all(torch.equal(params[n].detach(), deq[n]) for n in params)
    assert any(not torch.equal(deq[n], base[n]) for n in params)  # the targets are on the int8 grid


# ----------------------------------------------------------------------------- runs on `tiny`


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qc")
    ledger_path = tmp / "ref.db"
    with Ledger.open(str(ledger_path)) as led:
        result = session.start(led, str(_config(tmp, anchor_every=2)), "ref", [], None)
    return ledger_path, _fingerprints(ledger_path, "ref"), result, tmp


def test_run_trains_the_codes_and_verifies(reference):
    from seedledger.engine.rebuild.rebuilding import load_start, verify_ref
    from seedledger.replay.rebuild import rebuild

    ledger_path, fps, result, _ = reference
    assert len(set(fps)) == 3 and result.fingerprint == fps[-1]
    with Ledger.open(str(ledger_path)) as led:
        run = led.get_run("ref")
        assert (run.noise_spec, run.param_selection) == ("v1", "int8-codes-v1:targets=q_proj,v_proj,down_proj")
        assert run.config["train"] == {"kind": "quant_codes", "targets": list(TARGETS)}
        assert verify_ref(led, "ref")["fingerprint"] == fps[-1]
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        assert run.base_fingerprint == fingerprint(start.master)  # generation 0: the fp32 base
        base = quant.quantized_view(start.master, QuantCodes.of(TARGETS).quantizes)
        master, state = rebuild(led, "ref", 3, start.master)
    codes = [n for n, t in master.items() if t.dtype == torch.int8]
    assert len(codes) == 2 * len(TARGETS)
    assert all(not torch.equal(master[n], base[n]) for n in codes)  # the codes move
    assert all(torch.equal(master[n], base[n]) for n in master if n not in codes)  # scales and the rest stay
    moved = max(int((master[n].int() - base[n].int()).abs().max()) for n in codes)
    assert moved <= 3  # a few steps in three generations
    assert set(state.buffers[RESIDUAL]) == set(codes)
    for n in codes:  # what is left is at most half a step (a tie stays), unless a clamp at ±127 kept it
        r, q = state.buffers[RESIDUAL][n], master[n]
        clamped = ((q == 127) & (r > 0)) | ((q == -127) & (r < 0))
        assert bool((r.abs() <= master[quant.scale_name(n)].view(-1, 1) / 2)[~clamped].all())


def test_anchors_hold_the_residual(reference):
    """anchor_every: 2 saved the quantized master and the residual at generation 2: a
    rebuild from it (no fallback warning) has the state a replay from the base has."""
    import warnings

    from seedledger.engine.rebuild.rebuilding import load_start
    from seedledger.engine.runtime.dirs import anchors_dir
    from seedledger.replay.rebuild import rebuild

    ledger_path, fps, _, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        assert [a.generation for a in led.anchors("ref")] == [2]
        run = led.get_run("ref")
        start = lambda: load_start("tiny", run.config, run.noise_spec, run.param_selection).master  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            anchored, a_state = rebuild(led, "ref", 3, start(), anchors_dir=anchors_dir(led))
        replayed, r_state = rebuild(led, "ref", 3, start())
    assert fingerprint(anchored) == fingerprint(replayed) == fps[2]
    assert a_state.buffers.keys() == r_state.buffers.keys() == {"exp_avg", "exp_avg_sq", RESIDUAL}
    for kind, bufs in r_state.buffers.items():
        assert all(torch.equal(a_state.buffers[kind][n], t) for n, t in bufs.items())


def test_fork_continues_the_codes_and_refuses_another_kind(reference):
    from seedledger.engine.rebuild.rebuilding import verify_ref

    ledger_path, fps, _, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        same = session.fork(led, "ref@2", "same", [], 1)
        assert same.fingerprint == fps[2]  # the same settings replay to the same bits
        child = session.fork(led, "ref@2", "higher-lr", ["lr=2e-3", "seed=9"], 1)
        assert child.fingerprint not in fps
        assert verify_ref(led, "higher-lr")["fingerprint"] == child.fingerprint
        other_rule = session.fork(led, "ref@2", "sgd", ["optimizer=sgd", "lr=1e-2"], 1)  # the residual carries over
        assert verify_ref(led, "sgd")["fingerprint"] == other_rule.fingerprint
        fork_refuses_another_kind(led, "ref@2")


def test_seed_file_round_trip_and_a_checkpoint_transformers_loads(reference, tmp_path):
    import seedledger as sl

    ledger_path, fps, _, _ = reference
    master, _, _ = checkpoint_round_trip(ledger_path, fps, tmp_path)
    member = sl.rebuild("ref@3#0", ledger=ledger_path)  # the fp32 weights member 0 was evaluated with
    assert list(member) == [n for n in master if not n.endswith(quant.SCALE_SUFFIX)]
    assert all(t.dtype == torch.float32 for t in member.values())
