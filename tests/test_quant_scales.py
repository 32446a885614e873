"""ES over the per-row scales of an int8 weight-only model (`train: quant_scales`): the
quantization, the kind's strings, one step's exact update (golden), batched members on the
HF backend, and runs on `tiny` end to end (verify, SIGKILL + resume, fork, seed files,
anchors, a rebuilt checkpoint transformers loads)."""

from __future__ import annotations

import json
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
from seedledger.replay.kinds import Full, QuantScales, from_run
from seedledger.replay.kinds.forms import MasterForm, MemberForm
from seedledger.replay.update import OptimizerState, apply_step
from tests.support.int8_runs import (
    CONFIG_REFUSALS,
    checkpoint_round_trip,
    config_refuses,
    fork_refuses_another_kind,
)
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints

TARGETS = ("q_proj", "v_proj", "down_proj")
CONFIG = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
    "train": {"kind": "quant_scales", "targets": list(TARGETS)},
    "population": 4,
    "sigma": 1e-4,  # tiny's scales are ~6e-4 (absmax/127): members differ by ~15%
    "lr": 1e-4,
    "generations": 3,
    "batch_size": 2,
    "max_new_tokens": 6,
    "seed": 3,
}


def _config(tmp_path: Path, name: str = "qs", **changes) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(CONFIG | changes))
    return path


def _weight() -> torch.Tensor:
    w = noise.generate(7, 6 * 8).view(6, 8) * 0.0625
    w[3] = 0.0  # a zero row: scale 1, codes 0
    return w


# ----------------------------------------------------------------------------- quantization


def test_quantization_is_symmetric_absmax_per_row_in_fp32():
    w = _weight()
    codes, scale = quant.quantize_rows(w)
    x = w.numpy()
    absmax = np.abs(x).max(axis=1)
    want_scale = np.where(absmax > 0, absmax / np.float32(127), np.float32(1)).astype(np.float32)
    want_codes = np.clip(np.rint(x / want_scale[:, None]), -127, 127).astype(np.int8)  # rint: half to even
    assert codes.dtype == torch.int8 and scale.dtype == torch.float32
    assert np.array_equal(scale.numpy().view(np.uint32), want_scale.view(np.uint32))
    assert np.array_equal(codes.numpy(), want_codes)
    assert codes.abs().amax(dim=1).tolist() == [127, 127, 127, 0, 127, 127]  # every live row reaches ±127
    assert scale[3] == 1.0 and not codes[3].any()
    assert fingerprint({"codes": codes, "scale": scale}) == "1366faccdaf65a1395e1fe6c0580da5e"  # golden
    assert torch.equal(quant.dequantize(codes, scale), codes.float() * scale.view(-1, 1))


def test_quantized_view_keeps_order_and_leaves_the_master_alone():
    master = {"a.q_proj.weight": _weight(), "a.norm.weight": torch.ones(8), "a.k_proj.weight": _weight()}
    kind = QuantScales.of(("q_proj",))
    view = quant.quantized_view(master, kind.quantizes)
    assert list(view) == ["a.q_proj.weight", "a.q_proj.weight_scale", "a.norm.weight", "a.k_proj.weight"]
    assert master["a.q_proj.weight"].dtype == torch.float32 and view["a.q_proj.weight"].dtype == torch.int8
    assert quant.quantized_view(view, kind.quantizes) == view  # idempotent
    assert kind.master_names({n: tuple(t.shape) for n, t in master.items()}) == list(view)


# ----------------------------------------------------------------------------- the kind


def test_kind_strings_round_trip_and_refusals():
    kind = QuantScales.of(TARGETS)
    assert kind.noise_spec == "v1" and kind.param_selection == "int8-scales-v1:targets=q_proj,v_proj,down_proj"
    assert from_run(kind.noise_spec, kind.param_selection) == kind
    assert kind.forms == {MemberForm.ROW_SCALES} and kind.master_form is MasterForm.MODEL and not kind.keeps_paths
    assert kind.adapter is None
    assert kind.trained("model.layers.0.self_attn.q_proj.weight_scale", (64,))
    assert not kind.trained("model.layers.0.self_attn.q_proj.weight", (64, 64))
    assert not kind.trained("model.layers.0.self_attn.k_proj.weight_scale", (64,))
    for spec, selection, message in [
        ("v1", "int8-scales-v1:targets=q_proj,q_proj", "repeats"),
        ("v1", "int8-scales-v1:q_proj", "expected int8-scales-v1:targets="),
        ("v1", "int8-scales-v1:targets=q proj", "bad quant_scales target"),
        ("lowrank-v1:r=4", "int8-scales-v1:targets=q_proj", "noise spec 'v1'"),
    ]:
        with pytest.raises(SeedLedgerError, match=message) as info:
            from_run(spec, selection)
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("extra, refusal", CONFIG_REFUSALS)
def test_what_a_scales_run_cannot_do_is_refused_in_the_config(extra, refusal):
    config_refuses("quant_scales", extra, refusal)


def test_one_step_quantizes_then_moves_only_the_scales_golden():
    """Generation 1 quantizes the plain master (codes frozen from then on) and adds
    g = (−0.0 + c₀·ε₀) + c₁·ε₁ to the scales, ε under the scales' own tensor keys."""
    kind = QuantScales.of(("q_proj",))
    w = _weight()
    master = {"m.q_proj.weight": w.clone(), "m.norm.weight": torch.ones(8)}
    coefs = [noise.round_coefficient(x) for x in (3e-5, -1e-5)]
    step = ReplayStep("r", 1, [11, 29], coefs, noise.round_coefficient(1e-4), {"name": "sgd"},
                      kind.noise_spec, kind.param_selection)
    apply_step(master, OptimizerState(), step)
    codes, scale = quant.quantize_rows(w)
    g = torch.full((6,), -0.0)
    for key, c in zip([11, 29], coefs, strict=True):
        g = g + noise.generate(noise.tensor_key(key, "m.q_proj.weight_scale"), 6) * c
    assert list(master) == ["m.q_proj.weight", "m.q_proj.weight_scale", "m.norm.weight"]
    assert torch.equal(master["m.q_proj.weight"], codes) and torch.equal(master["m.norm.weight"], torch.ones(8))
    assert torch.equal(master["m.q_proj.weight_scale"], scale + g)
    assert fingerprint(master) == "8a2051137c7ad5f8cd0962adb9c6c340"  # golden
    again = {n: t.clone() for n, t in master.items()}
    apply_step(again, OptimizerState(), step)  # a quantized master is not quantized again
    assert torch.equal(again["m.q_proj.weight"], codes)
    with pytest.raises(SeedLedgerError, match="int8 codes"):  # no other kind trains it
        apply_step(master, OptimizerState(), ReplayStep("r", 2, [1], [0.5], 0.5, {"name": "sgd"}))
    assert isinstance(from_run("v1", "all"), Full)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_quantizes_and_steps_to_the_cpu_bits():
    """The codes are computed on the CPU whatever the master's device, and the scales'
    update runs the CUDA kernel: the golden step's bits on a CUDA master."""
    kind = QuantScales.of(("q_proj",))
    master = {"m.q_proj.weight": _weight().cuda(), "m.norm.weight": torch.ones(8, device="cuda")}
    coefs = [noise.round_coefficient(x) for x in (3e-5, -1e-5)]
    step = ReplayStep("r", 1, [11, 29], coefs, noise.round_coefficient(1e-4), {"name": "sgd"},
                      kind.noise_spec, kind.param_selection)
    apply_step(master, OptimizerState(), step)
    assert all(t.device.type == "cuda" for t in master.values())
    assert fingerprint(master) == "8a2051137c7ad5f8cd0962adb9c6c340"  # the CPU golden
    members = kind.row_scales(["m.q_proj"], master, [11, None], [coefs[0], 0.0], device=torch.device("cuda"))
    cpu = kind.row_scales(["m.q_proj"], {n: t.cpu() for n, t in master.items()}, [11, None], [coefs[0], 0.0],
                          device=torch.device("cpu"))
    assert torch.equal(members["m.q_proj"].cpu(), cpu["m.q_proj"])


# ----------------------------------------------------------------------------- the HF backend

KEYS = (11, 11, 29, 29)  # two mirrored pairs
SIGNS = (1, -1, 1, -1)
SIGMA = noise.round_coefficient(1e-4)


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    from seedledger.engine.runtime.backends.hf import HFBackend

    return HFBackend(tiny_model_dir, perturbation=QuantScales.of(TARGETS))


def test_members_in_one_forward_equal_each_members_dequantized_model(backend, tiny_model_dir):
    """y = (x·Qᵀ)·diag(s + scale_m·ε_m) for member m, all members in one forward, is the
    plain model with weights diag(s_m)·Q (evaluation: equal up to matmul rounding)."""
    from transformers import AutoModelForCausalLM

    kind = backend.perturbation
    base = backend.master()
    master = quant.quantized_view(base, kind.quantizes)
    backend.load_master(base)  # a plain master is quantized for evaluation (generation 1)
    ids = torch.tensor([[1, 5, 9, 200, 31], [1, 7, 7, 8, 900]])
    rows = ids.repeat(len(KEYS), 1)  # member-major
    with torch.no_grad(), backend.members(base, KEYS, SIGNS, SIGMA):
        together = backend.model(rows).logits
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    params = dict(plain.named_parameters())
    for m, (key, sign) in enumerate(zip(KEYS, SIGNS, strict=True)):
        scale = noise.round_coefficient(sign * SIGMA)
        with torch.no_grad():
            for name, t in master.items():
                if t.dtype == torch.int8:
                    s = master[quant.scale_name(name)]
                    tensor_key = noise.tensor_key(key, quant.scale_name(name))
                    member = noise.perturb_(torch.empty_like(s), s, tensor_key, scale)
                    params[name].copy_(quant.dequantize(t, member))
            alone = plain(ids).logits
        assert torch.allclose(together[2 * m : 2 * m + 2], alone, atol=1e-5, rtol=1e-4)
    with torch.no_grad():  # no member in flight: the master's own scales
        for name, t in master.items():
            if t.dtype == torch.int8:
                params[name].copy_(quant.dequantize(t, master[quant.scale_name(name)]))
        assert torch.allclose(backend.model(ids).logits, plain(ids).logits, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(together[0:2], together[2:4])  # mirrored members differ


# ----------------------------------------------------------------------------- runs on `tiny`


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("qs")
    ledger_path = tmp / "ref.db"
    with Ledger.open(str(ledger_path)) as led:
        result = session.start(led, str(_config(tmp, anchor_every=2)), "ref", [], None)
    return ledger_path, _fingerprints(ledger_path, "ref"), result, tmp


def test_run_trains_the_scales_and_verifies(reference, tiny_model_dir):
    from seedledger.engine.rebuild.rebuilding import load_start, verify_ref
    from seedledger.replay.rebuild import rebuild

    ledger_path, fps, result, _ = reference
    assert len(set(fps)) == 3 and result.fingerprint == fps[-1]
    with Ledger.open(str(ledger_path)) as led:
        run = led.get_run("ref")
        assert (run.noise_spec, run.param_selection) == ("v1", "int8-scales-v1:targets=q_proj,v_proj,down_proj")
        assert run.config["train"] == {"kind": "quant_scales", "targets": list(TARGETS)}
        assert verify_ref(led, "ref")["fingerprint"] == fps[-1]
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        assert run.base_fingerprint == fingerprint(start.master)  # generation 0: the fp32 base
        kind = QuantScales.of(TARGETS)
        base = quant.quantized_view(start.master, kind.quantizes)
        master, _ = rebuild(led, "ref", 3, start.master)
    codes = [n for n, t in master.items() if t.dtype == torch.int8]
    assert len(codes) == 2 * len(TARGETS)
    assert all(torch.equal(master[n], base[n]) for n in codes)  # the codes never move
    assert all(not torch.equal(master[quant.scale_name(n)], base[quant.scale_name(n)]) for n in codes)
    assert all(torch.equal(master[n], base[n]) for n in master if not n.endswith(("_scale",)) and n not in codes)


def test_fork_continues_the_scales_and_refuses_another_kind(reference):
    from seedledger.engine.rebuild.rebuilding import verify_ref

    ledger_path, fps, _, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        same = session.fork(led, "ref@2", "same", [], 1)
        assert same.fingerprint == fps[2]  # the same settings replay to the same bits
        child = session.fork(led, "ref@2", "lower-lr", ["lr=5e-5", "seed=9"], 1)
        assert child.fingerprint not in fps
        assert verify_ref(led, "lower-lr")["fingerprint"] == child.fingerprint
        fork_refuses_another_kind(led, "ref@2")


def test_seed_file_round_trip_and_a_checkpoint_transformers_loads(reference, tmp_path):
    import seedledger as sl

    ledger_path, fps, _, _ = reference
    master, written, params = checkpoint_round_trip(ledger_path, fps, tmp_path)
    for name, t in master.items():
        if t.dtype == torch.int8:  # the scales travel as written, [out] -> [out, 1]
            assert torch.equal(written[quant.scale_name(name)].view(-1), master[quant.scale_name(name)])
    in_memory, _ = sl.rebuild_model("ref@3", ledger=ledger_path)  # the dequantized model
    assert all(torch.equal(p.detach(), params[n].detach()) for n, p in in_memory.named_parameters())


def test_anchors_hold_the_quantized_master(reference, tmp_path):
    """anchor_every: 2 saved the quantized master at generation 2; a rebuild from the
    plain base starts there (no fallback warning) and reaches the same bits."""
    import warnings

    from seedledger.engine.rebuild.rebuilding import load_start
    from seedledger.engine.runtime.dirs import anchors_dir
    from seedledger.replay.rebuild import rebuild

    ledger_path, fps, _, _ = reference
    with Ledger.open(str(ledger_path)) as led:
        assert [a.generation for a in led.anchors("ref")] == [2]
        run = led.get_run("ref")
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            master, _ = rebuild(led, "ref", 3, start.master, anchors_dir=anchors_dir(led))
    assert fingerprint(master) == fps[2]


def test_diff_compares_the_quantized_weights_with_the_fp32_base(reference):
    """`diff RUN@0 RUN@3`: the fp32 base against diag(s)·Q, tensor by tensor (no scale rows)."""
    ledger_path = reference[0]
    doc = json.loads(_cli("diff", "ref@0", "ref@3", "--json", "--ledger", str(ledger_path)).stdout)
    names = {t["tensor"] for t in doc["tensors"]}
    assert not any(n.endswith(quant.SCALE_SUFFIX) for n in names)
    moved = [t for t in doc["tensors"] if t["changed"]]
    assert moved and all(t["tensor"].endswith("proj.weight") for t in moved)  # only the quantized linears
