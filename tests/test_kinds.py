"""Perturbation kinds as types (replay.kinds): one module per kind behind one protocol.

What is pinned here: every kind parses its own canonical strings and nothing else; the
member scale is one rule; the historic `Perturbation` factories return the kinds; the
consumers dispatch on the protocol, so a kind added to the registry is replayed with no
other change. That every backend evaluates the member replay rebuilds, for every kind and
backend the config allows, is tests/test_kind_contract.py's (it replaced a regex over the
consumers' source, which saw neither `isinstance` nor the module backend).
"""


import pytest
import torch

from seedledger.ledger.errors import SeedLedgerError
from seedledger.ledger.records import ReplayStep
from seedledger.replay import kinds
from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import KINDS, Adapter, Full, LowRank, from_run, member_scale
from seedledger.replay.kinds.forms import MasterForm, MemberForm
from seedledger.replay.kinds.full import SPEC
from seedledger.replay.lowrank import factors
from seedledger.replay.noise import round_coefficient
from seedledger.replay.perturbation import Perturbation, check_spec, step_perturbation
from seedledger.replay.update import OptimizerState, apply_step

WEIGHTS, ROW_TERMS, LORA_SLOTS = MemberForm.WEIGHTS, MemberForm.ROW_TERMS, MemberForm.LORA_SLOTS
SPEC_LORA = LoraSpec(4, 8.0, ("q_proj", "v_proj"), "seed:3")


@pytest.mark.parametrize("kind", [Full(), LowRank.of(4), LowRank.of(16, ["q_proj", "attn.c_attn"]),
                                  Adapter(SPEC_LORA)], ids=repr)
def test_each_kind_prints_and_parses_back_to_itself(kind):
    assert from_run(kind.noise_spec, kind.param_selection) == kind
    assert type(kind) in KINDS and kind.noise_spec in kind.known_specs


def test_the_registry_refuses_what_no_kind_claims_in_one_line():
    with pytest.raises(SeedLedgerError, match=r"^unknown noise spec 'v2' \(known: v1, lowrank-v1:r=1, "
                                              r"lowrank-v1:r=4, lowrank-v1:r=16, lowrank-v1:r=64\)$"):
        from_run("v2", "all")
    with pytest.raises(SeedLedgerError, match="parameter selection must be 'all'"):
        from_run("v1", "suffix:q_proj")  # full claims v1, and refuses another selection
    with pytest.raises(SeedLedgerError, match="perturbed with noise spec 'v1'"):
        from_run("lowrank-v1:r=4", SPEC_LORA.selection)  # an adapter selection is the adapter's


def test_the_historic_factories_return_the_kinds():
    assert Perturbation() == Full() and Perturbation.from_run("v1", "all") == Full()
    assert Perturbation.lowrank(4) == LowRank(4) and Perturbation("lowrank", 4, ("q_proj",)) == LowRank(4, ("q_proj",))
    assert Perturbation.lora(SPEC_LORA) == Adapter(SPEC_LORA) == Perturbation(adapter=SPEC_LORA)
    assert check_spec("v1", SPEC_LORA.selection).adapter == SPEC_LORA
    assert step_perturbation(object()) == Full()
    assert [k.kind for k in (Full(), LowRank(1), Adapter(SPEC_LORA))] == ["full", "lowrank", "full"]
    assert [(k.forms, k.master_form, k.keeps_paths) for k in (Full(), LowRank(1), Adapter(SPEC_LORA))] == [
        ({WEIGHTS}, MasterForm.MODEL, True), ({ROW_TERMS, LORA_SLOTS, WEIGHTS}, MasterForm.MODEL, False),
        ({ROW_TERMS, LORA_SLOTS}, MasterForm.ADAPTER, True),
    ]


@pytest.mark.parametrize("sigma", [0.01, round_coefficient(0.01), 3e-3, 1.0])
@pytest.mark.parametrize("shrink", [1.0, 0.7])
def test_the_member_scale_is_the_one_rule_the_backends_and_replay_used(sigma, shrink):
    for sign in (-1, 0, 1):
        assert member_scale(sign, sigma, shrink) == round_coefficient(sign * round_coefficient(sigma * shrink))
        if shrink == 1.0:  # the full-rank backends' former round(sign·σ)
            assert member_scale(sign, sigma) == round_coefficient(float(sign) * float(sigma))


def test_lowrank_slots_are_its_factors_exactly():
    kind, sigma = LowRank.of(4, ["q_proj"]), round_coefficient(0.01)
    linears = {"layers.0.q_proj": (6, 5)}
    scales = [member_scale(s, sigma) for s in (1, -1)]
    made = list(kind.lora_members(None, linears, [7, 7], scales))
    a, b = factors(7, "layers.0.q_proj.weight", (6, 5), 4)
    for adapter, scale in zip(made, scales, strict=True):
        lora_a, lora_b = adapter["layers.0.q_proj"]
        assert torch.equal(lora_a, b.T) and torch.equal(lora_b, a * (scale * 0.5))


def test_a_kind_added_to_the_registry_is_replayed_with_no_other_change(monkeypatch):
    """A toy kind (v1 noise on the biases only): its module and a registry entry suffice
    for replay to parse its strings and update exactly the tensors it trains."""

    class Biases(Full):
        name = "biases"

        @classmethod
        def claims(cls, noise_spec, param_selection):
            return param_selection == "biases"

        @classmethod
        def parse(cls, noise_spec, param_selection):
            return cls()

        @property
        def param_selection(self):
            return "biases"

        def trained(self, name, shape):
            return name.endswith(".bias")

    monkeypatch.setattr(kinds, "KINDS", (Biases, *KINDS))
    kinds._parse.cache_clear()
    try:
        master = {"l.weight": torch.ones(3, 4), "l.bias": torch.zeros(3)}
        full = {n: t.clone() for n, t in master.items()}
        step = ReplayStep("r", 1, [11, 12], [0.5, -0.25], 0.01, {"name": "sgd"}, SPEC, "biases")
        apply_step(master, OptimizerState(), step)
        apply_step(full, OptimizerState(), ReplayStep("r", 1, [11, 12], [0.5, -0.25], 0.01, {"name": "sgd"}))
        assert torch.equal(master["l.weight"], torch.ones(3, 4))  # not trained: untouched
        assert torch.equal(master["l.bias"], full["l.bias"]) and not torch.equal(full["l.bias"], torch.zeros(3))
    finally:
        kinds._parse.cache_clear()
