"""Adapter kind (``"v1"`` / ``"lora-v1:..."`` or ``"essa-v1:..."``): the master is a LoRA
adapter on a frozen base (``replay.adapter``) and every adapter tensor it trains (an ESSA
run: the singular values alone) is trained with v1 noise, i.e. a full perturbation of a
smaller master. Members ride on the frozen base as their own adapters
cast(master + scale·ε) (HF: per-row terms; vLLM: one LoRA slot each); between members the
master adapter itself is served."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedledger.ledger.errors import SeedLedgerError

from ..adapter import PREFIX, LoraSpec, is_selection, member_adapter, parse_selection, tensor_names
from .base import LoraPair, RowTerm, Shape, short
from .forms import MasterForm, MemberForm
from .full import SPEC, Full


@dataclass(frozen=True)
class Adapter(Full):
    """The LoRA (or ESSA) adapter ``spec``, trained on a frozen base."""

    spec: LoraSpec

    name = "adapter"
    label = "lora"
    usual_sigma = 1e-2  # B starts at zero: σ·ε on B is the whole first-order term
    master_form = MasterForm.ADAPTER
    forms = frozenset({MemberForm.ROW_TERMS, MemberForm.LORA_SLOTS})

    @classmethod
    def claims(cls, noise_spec: str, param_selection: str) -> bool:
        return is_selection(param_selection)

    @classmethod
    def parse(cls, noise_spec: str, param_selection: str) -> Adapter:
        if noise_spec != SPEC:
            raise SeedLedgerError(f"a LoRA adapter is perturbed with noise spec 'v1', not {short(noise_spec)}")
        return cls(parse_selection(param_selection))

    @property
    def param_selection(self) -> str:
        return self.spec.selection

    @property
    def adapter(self) -> LoraSpec:
        return self.spec

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        """What the spec trains: not an ESSA run's fixed basis."""
        return self.spec.trains(name)

    # --- evaluation -----------------------------------------------------------------------

    def row_linear(self, module: str, shape: Shape) -> bool:
        return self.spec.matches(module)

    @property
    def targets_label(self) -> str:
        return f"LoRA targets {self.spec.targets}"

    def row_terms(self, linears: Mapping[str, Shape], master: Mapping[str, torch.Tensor],
                  keys: Sequence[int | None], scales: Sequence[float], *, device: torch.device,
                  dtype: torch.dtype, paths: Sequence[Sequence[float]] = (), state: Any = None,
                  ) -> dict[str, RowTerm]:
        """Member m's adapter (``member_adapter``: cast(master + scale_m·ε(key_m)) on the
        trained tensors, plus an LM-MA-ES member's path terms; key None: the master itself):
        down = A'ᵀ, up = B'ᵀ, post = alpha/r as PEFT applies ``scaling``."""
        rows = paths or [()] * len(keys)
        members = [member_adapter(self.spec, master, key, scale, row, state)
                   for key, scale, row in zip(keys, scales, rows, strict=True)]
        terms = {}
        for name in linears:
            a_name, b_name = tensor_names(name)
            down = torch.stack([m[a_name] for m in members]).transpose(1, 2)  # [M, in, r]
            up = torch.stack([m[b_name] for m in members]).transpose(1, 2)  # [M, r, out]
            terms[name] = (down.to(dtype), up.to(dtype), self.spec.scale)
        return terms

    @property
    def lora_rank(self) -> int:
        return self.spec.rank

    @property
    def lora_targets(self) -> tuple[str, ...]:
        return self.spec.targets

    def lora_members(self, master: Mapping[str, torch.Tensor] | None, linears: Mapping[str, Shape],
                     keys: Sequence[int | None], scales: Sequence[float]) -> Iterator[dict[str, LoraPair]]:
        """Each member's plain adapter (an ESSA master expanded to B = U·diag(s), A = Vᵀ),
        lora_B times alpha/r into a fresh tensor (the master is never scaled)."""
        if master is None:
            raise ValueError("an adapter run's members need its master adapter")
        for key, scale in zip(keys, scales, strict=True):
            plain = member_adapter(self.spec, master, key, scale)
            yield {module: (plain[a], plain[b] * self.spec.scale)
                   for module in adapter_modules(plain) for a, b in [tensor_names(module)]}


def adapter_modules(master: Mapping[str, torch.Tensor]) -> list[str]:
    """HF module names of an adapter master's targeted linears, in the master's order."""
    suffix = ".lora_A.weight"
    return [n[len(PREFIX) : -len(suffix)] for n in master if n.startswith(PREFIX) and n.endswith(suffix)]
