"""ESSA (`train.essa`): CMA-ES over the singular values of an SFT adapter, U and V fixed.

The singular form against torch's SVD as the oracle, the spec, replay touching only the
singular values, and a real run on `tiny`: it moves s alone, verifies, exports the plain
LoRA it describes, and resumes after SIGKILL to the same bits."""

from __future__ import annotations

import pytest
import torch
import yaml

from seedledger.engine.rebuild.rebuilding import load_start, verify_ref
from seedledger.engine.runtime import session
from seedledger.engine.runtime.models.adapters import linear_shapes, read_peft_dir, write_peft_dir
from seedledger.engine.runtime.models.resolve import load_causal_lm
from seedledger.ledger import Ledger
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import ReplayStep
from seedledger.replay import noise
from seedledger.replay.adapter import (
    LoraSpec,
    essa_names,
    parse_selection,
    peft_adapter,
    singular_form,
    tensor_names,
)
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.perturbation import Perturbation
from seedledger.replay.rebuild import apply_member, rebuild
from seedledger.replay.update import OptimizerState, apply_step
from tests.support.runs import cli as _cli
from tests.support.runs import fingerprints as _fingerprints
from tests.support.runs import kill_train_and_resume

MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"]
SHAPES = {MODULES[0]: (24, 32), MODULES[1]: (32, 40)}  # (out, in)
RANK = 4


def _adapter(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for module, (o, i) in SHAPES.items():
        a_name, b_name = tensor_names(module)
        out[a_name] = torch.randn(RANK, i, generator=g) / i**0.5
        out[b_name] = torch.randn(o, RANK, generator=g) * 0.1
    return out


def test_singular_form_matches_the_svd_and_is_canonical():
    adapter = _adapter()
    master = singular_form(adapter, MODULES)
    assert list(master) == [n for m in MODULES for n in essa_names(m)]
    spec = LoraSpec(RANK, 8.0, ("q_proj", "down_proj"), "peft:" + "0" * 32, essa=True)
    plain = peft_adapter(spec, master)
    for module in MODULES:
        a_name, b_name = tensor_names(module)
        s, u, vt = (master[n] for n in essa_names(module))
        product = adapter[b_name].double() @ adapter[a_name].double()
        oracle = torch.linalg.svdvals(product)[:RANK]  # the rest are zero
        torch.testing.assert_close(s.double(), oracle, rtol=1e-6, atol=0)
        assert torch.all(s[:-1] >= s[1:]), "singular values in descending order"
        torch.testing.assert_close(u.T.double() @ u.double(), torch.eye(RANK, dtype=torch.float64), atol=1e-6, rtol=0)
        torch.testing.assert_close(vt.double() @ vt.T.double(), torch.eye(RANK, dtype=torch.float64), atol=1e-6, rtol=0)
        torch.testing.assert_close(plain[b_name].double() @ plain[a_name].double(), product, atol=1e-6, rtol=0)
        pivot = u.abs().argmax(dim=0)
        assert bool((u[pivot, torch.arange(RANK)] > 0).all()), "each U column's largest entry is positive"
    again = singular_form({n: t.clone() for n, t in adapter.items()}, MODULES)
    assert all(torch.equal(master[n], again[n]) for n in master), "deterministic"
    # The same B·A from sign-flipped factor pairs (B·D, D·A) has the same singular form.
    d = torch.tensor([1.0, -1.0, -1.0, 1.0])
    flipped = {}
    for module in MODULES:
        a_name, b_name = tensor_names(module)
        flipped[a_name], flipped[b_name] = d[:, None] * adapter[a_name], adapter[b_name] * d
    other = singular_form(flipped, MODULES)
    for n in master:
        torch.testing.assert_close(other[n], master[n], atol=1e-6, rtol=0)


def test_degenerate_adapters_are_refused():
    """A rank-deficient B·A (PEFT's untrained B = 0, or a dead component) has arbitrary
    singular vectors; a rank above min(out, in) has no unique form."""
    dead = _adapter()
    dead[tensor_names(MODULES[1])[1]][:, 2] = 0.0
    with pytest.raises(SeedLedgerError, match=r"B·A of module 'model.layers.0.mlp.down_proj' has rank < 4"):
        singular_form(dead, MODULES)
    zero = {n: torch.zeros_like(t) if n.endswith("lora_B.weight") else t for n, t in _adapter().items()}
    with pytest.raises(SeedLedgerError, match="has rank < 4"):
        singular_form(zero, MODULES)
    wide = {tensor_names("m")[0]: torch.randn(4, 3), tensor_names("m")[1]: torch.randn(8, 4)}
    with pytest.raises(SeedLedgerError, match="rank 4 > min"):
        singular_form(wide, ["m"])


def test_essa_config_needs_init():
    from seedledger.engine.config import validate

    with pytest.raises(SeedLedgerError, match="train.essa trains the singular values"):
        validate(ESSA | {"train": {"kind": "lora", "essa": True}})


def test_essa_spec_round_trips_and_needs_a_peft_init():
    spec = LoraSpec(4, 16.0, ("q_proj", "v_proj"), "peft:" + "ab" * 16, essa=True)
    assert spec.selection == f"essa-v1:r=4,alpha=16.0,init=peft:{'ab' * 16},targets=q_proj,v_proj"
    assert parse_selection(spec.selection) == spec
    p = Perturbation.from_run("v1", spec.selection)
    assert p.adapter == spec and p.param_selection == spec.selection
    s_name, u_name, vt_name = essa_names("model.layers.0.self_attn.q_proj")
    assert p.trained(s_name, (4,)) and not p.trained(u_name, (8, 4)) and not p.trained(vt_name, (4, 8))
    plain = LoraSpec(4, 16.0, ("q_proj",), "seed:1")
    assert plain.trains(u_name), "a plain adapter trains every tensor it has"
    with pytest.raises(SeedLedgerError, match="PEFT adapter directory"):
        LoraSpec(4, 16.0, ("q_proj",), "seed:1", essa=True)
    with pytest.raises(SeedLedgerError, match="PEFT adapter directory"):
        parse_selection("essa-v1:r=4,alpha=16.0,init=seed:1,targets=q_proj")


def test_replay_updates_the_singular_values_only():
    master = singular_form(_adapter(), MODULES)
    before = {n: t.clone() for n, t in master.items()}
    spec = LoraSpec(RANK, 8.0, ("q_proj", "down_proj"), "peft:" + "0" * 32, essa=True)
    step = ReplayStep("e", 1, [11, 12], [noise.round_coefficient(0.01), noise.round_coefficient(-0.02)],
                      0.01, {"name": "sgd"}, "v1", spec.selection)
    state = OptimizerState()
    apply_step(master, state, step)
    adam = ReplayStep("e", 2, [13], [noise.round_coefficient(0.01)], 0.01, {"name": "adam", "lr": 1e-3},
                      "v1", spec.selection)
    after_sgd = {n: t.clone() for n, t in master.items()}
    apply_step(master, state, adam)
    assert all(set(bufs) == {essa_names(m)[0] for m in MODULES} for bufs in state.buffers.values()), \
        "optimizer state for the singular values only"
    for module in MODULES:
        s_name, u_name, vt_name = essa_names(module)
        assert not torch.equal(master[s_name], after_sgd[s_name])
        assert torch.equal(master[u_name], before[u_name]) and torch.equal(master[vt_name], before[vt_name])
    master = {n: after_sgd[n] for n in master}
    for module in MODULES:
        s_name, u_name, vt_name = essa_names(module)
        assert not torch.equal(master[s_name], before[s_name])
        assert torch.equal(master[u_name], before[u_name]) and torch.equal(master[vt_name], before[vt_name])
        expected = before[s_name].clone()
        noise.perturb_(expected, expected.clone(), noise.tensor_key(11, s_name), noise.round_coefficient(0.01))
        noise.perturb_(expected, expected.clone(), noise.tensor_key(12, s_name), noise.round_coefficient(-0.02))
        torch.testing.assert_close(master[s_name], expected, atol=1e-7, rtol=0)


def _toy_model() -> torch.nn.Module:
    """Linears named as MODULES are, with SHAPES' (out, in)."""
    root = torch.nn.Module()
    root.model = torch.nn.Module()
    root.model.layers = torch.nn.ModuleList([torch.nn.Module()])
    layer = root.model.layers[0]
    layer.self_attn, layer.mlp = torch.nn.Module(), torch.nn.Module()
    layer.self_attn.q_proj = torch.nn.Linear(32, 24)
    layer.mlp.down_proj = torch.nn.Linear(40, 32)
    return root


def test_hf_and_vllm_members_are_the_perturbed_singular_values_expanded():
    """Both backends' member adapters, bit for bit, are the plain LoRA of `RUN@G#M` as
    replay builds it (`apply_member`: s + sign·σ·ε on the singular values alone), i.e.
    B = U·diag(s_m), A = Vᵀ (vLLM folds alpha/r into B)."""
    from seedledger.engine.runtime.backends.hf_lowrank import RowTerms
    from seedledger.engine.runtime.backends.vllm_lora import lora_adapters

    spec = LoraSpec(RANK, 8.0, ("q_proj", "down_proj"), "peft:" + "0" * 32, essa=True)
    master = singular_form(_adapter(), MODULES)
    keys, signs, sigma = [None, 5, 5, 9], [1, 1, -1, 1], noise.round_coefficient(0.05)
    scales = [noise.round_coefficient(s * sigma) for s in signs]
    step = ReplayStep("e", 1, [], [], sigma, {"name": "sgd"}, "v1", spec.selection)
    expected = []
    for key, sign in zip(keys, signs, strict=True):
        member = {n: t.clone() for n, t in master.items()}
        if key is not None:
            apply_member(member, step, key, sign)
        expected.append(peft_adapter(spec, member))
    assert not torch.equal(expected[1][tensor_names(MODULES[0])[1]], expected[2][tensor_names(MODULES[0])[1]])
    row_terms = RowTerms(_toy_model(), lambda name, _m: spec.matches(name), "test")
    terms = row_terms.adapters(spec, master, keys, signs, sigma)
    served = dict(lora_adapters(master, spec, range(len(keys)), keys, scales))
    for m, want in enumerate(expected):
        for module in MODULES:
            a_name, b_name = tensor_names(module)
            assert torch.equal(terms[module].down[m], want[a_name].T)
            assert torch.equal(terms[module].up[m], want[b_name].T)
            assert terms[module].post == spec.scale
            a, b = served[m][module]
            assert torch.equal(a, want[a_name]) and torch.equal(b, want[b_name] * spec.scale)


# ----------------------------------------------------------------------------- a run on tiny

ESSA = {
    "model": "tiny",
    "task": {"name": "arithmetic", "rewards": ["task", {"fn": "length", "limit": 30}]},
    "train": {"kind": "lora", "init": "sft", "essa": True},
    "algorithm": "cmaes",
    "population": 4,
    "sigma": 0.05,
    "lr": 0.05,
    "generations": 2,
    "batch_size": 2,
    "max_new_tokens": 4,
    "seed": 3,
}


@pytest.fixture(scope="module")
def essa_run(tmp_path_factory, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("essa")
    spec = LoraSpec(4, 16.0, ("q_proj", "v_proj"), "seed:0")
    shapes = linear_shapes(load_causal_lm(tiny_model_dir), spec)
    g = torch.Generator().manual_seed(1)
    sft = {}
    for module, (o, i) in shapes.items():
        a_name, b_name = tensor_names(module)
        sft[a_name] = torch.randn(4, i, generator=g) / i**0.5
        sft[b_name] = torch.randn(o, 4, generator=g) * 0.05
    write_peft_dir(tmp / "sft", sft, spec, str(tiny_model_dir))
    (tmp / "essa.yaml").write_text(yaml.safe_dump(ESSA))
    with Ledger.open(str(tmp / "e.db")) as led:
        session.start(led, str(tmp / "essa.yaml"), "e", [], None)
    return tmp, sft, list(shapes)


def test_essa_run_moves_the_singular_values_alone_and_verifies(essa_run):
    tmp, sft, modules = essa_run
    fps = _fingerprints(tmp / "e.db", "e")
    with Ledger.open(str(tmp / "e.db")) as led:
        run = led.get_run("e")
        assert run.param_selection.startswith("essa-v1:r=4,alpha=16.0,init=peft:")
        assert len(set(fps + [run.base_fingerprint])) == 3, "each generation moved the singular values"
        assert verify_ref(led, "e")["ok"]
        start = load_start("tiny", run.config, run.noise_spec, run.param_selection)
        final, _ = rebuild(led, "e", 2, {n: t.clone() for n, t in start.master.items()}, frozen=start.frozen)
    assert fingerprint(final) == fps[-1]
    initial = singular_form(sft, modules)
    assert all(torch.equal(start.master[n], initial[n]) for n in initial), "generation 0: the SFT adapter's form"
    for module in modules:
        s_name, u_name, vt_name = essa_names(module)
        assert not torch.equal(final[s_name], initial[s_name]), f"{module}: s moved"
        assert torch.equal(final[u_name], initial[u_name]) and torch.equal(final[vt_name], initial[vt_name])
    _cli("rebuild", "e@2", "-o", str(tmp / "out"), "--ledger", str(tmp / "e.db"))
    params, exported = read_peft_dir(tmp / "out")
    assert params["rank"] == 4 and set(exported) == set(sft), "a plain PEFT LoRA"
    plain = peft_adapter(start.adapter, final)
    assert all(torch.equal(exported[n], plain[n]) for n in exported), "B = U·diag(s), A = Vᵀ"


@pytest.mark.slow
def test_essa_run_resumes_after_sigkill_to_the_same_bits(essa_run):
    tmp, _, _ = essa_run
    fps = _fingerprints(tmp / "e.db", "e")
    kill_train_and_resume(tmp / "essa.yaml", tmp / "crash.db", fps)
