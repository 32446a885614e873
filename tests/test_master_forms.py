"""Where a kind's master lives (`replay.kinds.forms.MasterForm`), declared by the kind and
served by one master store per backend (`engine.runtime.backends.hf_master`, `vllm_master`),
so no backend asks which kind it holds (issue 47 item 1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from seedledger.replay.adapter import LoraSpec
from seedledger.replay.kinds import KINDS, Adapter, Full
from seedledger.replay.kinds.forms import MasterForm

SPEC = LoraSpec(4, 8.0, ("q_proj", "v_proj"), "seed:3")
BACKENDS = Path(__file__).resolve().parents[1] / "engine" / "runtime" / "backends"


def test_each_kind_declares_where_its_master_lives():
    assert {k: k.master_form for k in KINDS}[Adapter] is MasterForm.ADAPTER
    assert all(k.master_form is MasterForm.MODEL for k in KINDS if k is not Adapter)


def test_every_backend_has_a_master_store_for_every_master_form():
    from seedledger.engine.runtime.backends import hf_master, vllm_master

    assert set(hf_master.MASTERS) == set(MasterForm) == set(vllm_master.MASTERS)


def test_a_kind_setting_frozen_base_is_refused_when_its_class_is_made():
    with pytest.raises(TypeError, match=r"^kind Based sets frozen_base: declare master_form \(forms.MasterForm\)"):
        class Based(Full):
            frozen_base = True


def test_no_backend_asks_which_kind_it_holds():
    """No `frozen_base` read and no `isinstance` against a kind class in any backend module:
    backends go through member forms and master stores (the behaviour is
    tests/test_kind_contract.py's)."""
    kind_names = {k.__name__ for k in KINDS} | {"PerturbationKind", "Int8Kind"}
    found = []
    for path in sorted(BACKENDS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "frozen_base":
                found.append(f"{path.name}:{node.lineno} .frozen_base")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                classes = ast.walk(node.args[1]) if len(node.args) > 1 else ()
                if any(isinstance(c, ast.Name) and c.id in kind_names for c in classes):
                    found.append(f"{path.name}:{node.lineno} isinstance")
    assert found == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_hf_master_stores(tiny_model_dir, dtype):
    """A model master: fp32 weights as loaded, every parameter written; an adapter master:
    the seeded adapter on a fingerprinted frozen base, no parameter written."""
    from seedledger.engine.runtime.backends.hf import HFBackend
    from seedledger.replay.adapter import initial_adapter

    full = HFBackend(tiny_model_dir, dtype=dtype)
    master = full.master()
    assert full.frozen is None and set(full._params) == set(master)
    assert all(t.dtype == torch.float32 for t in master.values())
    lora = HFBackend(tiny_model_dir, dtype=dtype, perturbation=Adapter(SPEC))
    assert lora.frozen is not None and lora._params == {}
    shapes = {n: (m.out_features, m.in_features) for n, m in lora.model.named_modules()
              if isinstance(m, torch.nn.Linear) and SPEC.matches(n)}
    want = initial_adapter(SPEC, shapes)
    assert list(lora.master()) == list(want)
    assert all(torch.equal(lora.master()[n], want[n]) for n in want)
