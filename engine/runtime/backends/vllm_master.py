"""Where a vLLM run's master lives, as its kind declares it (`PerturbationKind.master_form`).

The vLLM backend builds one store from the kind (`MASTERS[kind.master_form]`) before its
engine starts and goes through it for the master: what `master()` clones, what
`load_master` does, what plain generation serves, the frozen base's fingerprint. So the
backend never asks which kind it holds.

- `MasterForm.MODEL` (`ModelWeights`): the master is every weight, read from the checkpoint
  in fp32 (`read_master`); loading it reloads the engine's weights in the worker
  (`vllm_worker.seedledger_load`, which also drops every LoRA adapter).
- `MasterForm.ADAPTER` (`AdapterOnBase`): the engine loads the frozen base from the
  checkpoint once and never reloads it; the master is the fp32 adapter, seeded or read
  from `adapter_init` (a PEFT directory). `load` hands it to the worker (once per
  generation), which keeps it for the members' adapters; outside a group (held-out
  scoring, plain generation) every row carries the master adapter itself, registered under
  a fresh id (`vllm_lora.Slots.master`): what the HF backend's resident adapter is. The
  frozen base's fingerprint is the fp32 checkpoint tensors' under their transformers
  names, as the HF backend fingerprints an unquantized base, so a run may move between
  backends. An int8 base is the HF backend's alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import torch

from seedledger.engine.runtime.backends.vllm_lora import Slots
from seedledger.replay.fingerprint import fingerprint
from seedledger.replay.kinds import PerturbationKind
from seedledger.replay.kinds.forms import MasterForm

Tensors = dict[str, torch.Tensor]


def meta_model(model_dir: Path) -> torch.nn.Module:
    """The checkpoint's transformers model on the meta device: names and shapes, no weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def read_master(model_dir: Path) -> Tensors:
    """fp32 master from the checkpoint, named and ordered as `model.named_parameters()`.

    The order and the names (tied weights once) come from a meta-device transformers model,
    so no second copy of the weights is built.
    """
    from safetensors import safe_open

    names = [n for n, _ in meta_model(model_dir).named_parameters()]
    tensors: Tensors = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    missing = [n for n in names if n not in tensors]
    if missing:
        raise ValueError(f"{model_dir}: checkpoint lacks {missing[:3]}")
    return {n: tensors[n].to(torch.float32).contiguous() for n in names}


class VLLMMaster(Protocol):
    """One run's master on a vLLM engine (see the module docstring)."""

    frozen: str | None  # the frozen base's fingerprint (None: the master is the model)
    initial: Tensors  # generation 0's master, fp32 (`master()` clones it)

    def start(self, llm: Any, slots: Slots) -> None:
        """The engine is up: take it and its LoRA slots, and serve generation 0's master."""

    def load(self, master: Tensors) -> None:
        """Make `master` what the engine evaluates between members."""

    def served(self) -> Any:
        """The LoRA request plain generation carries (None: the engine's weights alone)."""


class ModelWeights:
    """`MasterForm.MODEL`: the engine's weights are the master."""

    frozen: str | None = None
    _llm: Any  # start()

    def __init__(self, model_dir: Path, kind: PerturbationKind, adapter_init: str | os.PathLike[str] | None) -> None:
        self._kind = kind
        self.initial = read_master(model_dir)

    def start(self, llm: Any, slots: Slots) -> None:
        self._llm = llm  # the engine loaded the checkpoint, generation 0's master

    def load(self, master: Tensors) -> None:
        self._llm.collective_rpc("seedledger_load", args=(self._kind, 0, 0.0, master))
        self._llm.reset_prefix_cache()

    def served(self) -> Any:
        return None


class AdapterOnBase:
    """`MasterForm.ADAPTER`: the engine's frozen base and the adapter master the worker keeps."""

    _llm: Any  # start()
    _slots: Slots

    def __init__(self, model_dir: Path, kind: PerturbationKind, adapter_init: str | os.PathLike[str] | None) -> None:
        from seedledger.engine.runtime.models.adapters import adapter_for_shapes, linear_shapes

        self.frozen: str | None = fingerprint(read_master(model_dir))  # the base: then dropped
        shapes = linear_shapes(meta_model(model_dir), kind.adapter)
        self.initial = adapter_for_shapes(shapes, kind.adapter, adapter_init)

    def start(self, llm: Any, slots: Slots) -> None:
        self._llm, self._slots = llm, slots
        self.load(self.initial)

    def load(self, master: Tensors) -> None:
        self._llm.collective_rpc("seedledger_keep_master", args=(master,))
        self._slots.forget_master()  # registered again, under a fresh id, when next served

    def served(self) -> Any:
        return self._slots.master()


MASTERS: dict[MasterForm, type[ModelWeights] | type[AdapterOnBase]] = {
    MasterForm.MODEL: ModelWeights,
    MasterForm.ADAPTER: AdapterOnBase,
}
