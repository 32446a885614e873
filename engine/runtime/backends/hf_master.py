"""Where an HF run's master lives, as its kind declares it (`PerturbationKind.master_form`).

The HF backend builds one store from the kind (`MASTERS[kind.master_form]`), on the model
as loaded in fp32, and goes through it for the master: what `master()` starts from, what
`load_member` writes, what `load_master` does, the frozen base's fingerprint. So the
backend never asks which kind it holds.

- `MasterForm.MODEL` (`ModelWeights`): the master is every weight of the model. Loading it
  writes the kind's `member_weights` into the parameters, unless the member rows hold the
  master themselves (`MemberRows.holds_master`: int8 row scales, whose model runs on the
  master's codes).
- `MasterForm.ADAPTER` (`AdapterOnBase`): the model is a frozen base (`base_quantization`),
  fingerprinted as loaded; the master is a LoRA adapter, seeded or read from `adapter_init`
  (a PEFT directory), resident on the member rows (`hf_lowrank.RowTerms`) between members.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from seedledger.replay.kinds import PerturbationKind
from seedledger.replay.kinds.forms import MasterForm

if TYPE_CHECKING:
    from seedledger.engine.runtime.backends.hf_lowrank import MemberRows

Tensors = dict[str, torch.Tensor]


class HFMaster(Protocol):
    """One run's master on an HF model (see the module docstring)."""

    frozen: str | None  # the frozen base's fingerprint, as loaded (None: the master is the model)

    @property
    def params(self) -> dict[str, torch.Tensor]:
        """The parameters a member's own weights are written into (tied weights once)."""

    def initial(self) -> Tensors:
        """Generation 0's master, as held (`master()` clones it to fp32)."""

    def attach(self, rows: MemberRows | None) -> None:
        """Take the model's member rows (None: members have weights of their own)."""

    def load(self, master: Tensors) -> None:
        """Make `master` what the model evaluates between members."""


class ModelWeights:
    """`MasterForm.MODEL`: the model's weights are the master (a low-precision model keeps
    an fp32 copy of them as loaded, generation 0's master)."""

    frozen: str | None = None

    def __init__(self, model: nn.Module, kind: PerturbationKind, *, quantization: str,
                 adapter_init: str | os.PathLike[str] | None, keep_fp32: bool) -> None:
        if quantization != "none":
            raise ValueError("only an adapter run's frozen base may be quantized")
        self._model, self._kind = model, kind
        self._fp32 = {n: p.detach().clone() for n, p in model.named_parameters()} if keep_fp32 else None
        self._rows: MemberRows | None = None

    @cached_property
    def params(self) -> dict[str, torch.Tensor]:
        return dict(self._model.named_parameters())  # read after the backend's cast to its dtype

    def initial(self) -> Tensors:
        return self._fp32 if self._fp32 is not None else self.params

    def attach(self, rows: MemberRows | None) -> None:
        self._rows = rows if rows is not None and rows.holds_master else None

    @torch.no_grad()
    def load(self, master: Tensors) -> None:
        if self._rows is not None:
            self._rows.set_resident(self._kind, master)
            return
        weights = self._kind.member_weights(master)
        for name, param in self.params.items():
            param.data.copy_(weights[name])


class AdapterOnBase:
    """`MasterForm.ADAPTER`: a frozen base and the adapter master resident on its rows."""

    _rows: MemberRows  # attach()

    def __init__(self, model: nn.Module, kind: PerturbationKind, *, quantization: str,
                 adapter_init: str | os.PathLike[str] | None, keep_fp32: bool) -> None:
        from seedledger.engine.runtime.models import adapters

        self._kind = kind
        self.frozen: str | None = adapters.frozen_fingerprint(model)
        self._initial = adapters.initial_adapter(model, kind.adapter, adapter_init)

    @property
    def params(self) -> dict[str, torch.Tensor]:
        return {}  # the base is frozen: members have no weights of their own

    def initial(self) -> Tensors:
        return self._initial

    def attach(self, rows: MemberRows | None) -> None:
        if rows is None:
            raise ValueError(f"{self._kind.label} members ride on the frozen base: they need member rows")
        self._rows = rows
        rows.set_resident(self._kind, self._initial)

    def load(self, master: Tensors) -> None:
        self._rows.set_resident(self._kind, master)


MASTERS: dict[MasterForm, type[ModelWeights] | type[AdapterOnBase]] = {
    MasterForm.MODEL: ModelWeights,
    MasterForm.ADAPTER: AdapterOnBase,
}
