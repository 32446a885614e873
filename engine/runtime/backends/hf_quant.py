"""Per-row output scales on a transformers model's quantized linears: a whole group of
quant_scales members (`replay.kinds.quant_scales`) in one batched forward.

Each targeted linear holds its int8 codes Q (as floats of the model's dtype: every code is
exact in fp32, bf16 and fp16) and no bias; a forward hook turns its output into

    y = (x·Qᵀ)·diag(s_m) + b            s_m = cast(s + scale_m·ε_m): member m's scales

so members share the integer matmul and differ by one multiply on its output. Rows are
member-major (as for `hf_lowrank.RowTerms`, whose interface this mirrors: `active`,
`rows`, `terms`, `set_resident`); with no member in flight the master's scales are
resident (held-out evaluation and plain generation see the trained model). This is
evaluation, not replay: the products are ordinary ones; what is exact is the members'
scales (`noise.perturb_`) and the update.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from seedledger.replay import quant
from seedledger.replay.kinds import PerturbationKind


class ScaleRows:
    """Forward hooks that scale the quantized linears' outputs row by row (per member)."""

    @classmethod
    def of(cls, model: nn.Module, kind: PerturbationKind) -> ScaleRows:
        """The linears `kind` quantizes (`PerturbationKind.row_linear`)."""
        targets = {name: module for name, module in model.named_modules()
                   if isinstance(module, nn.Linear) and kind.row_linear(name, tuple(module.weight.shape))}
        if not targets:
            raise ValueError(f"no linear layer of the model matches the {kind.targets_label}")
        return cls(targets, dict(model.named_parameters()))

    def __init__(self, targets: dict[str, nn.Linear], params: Mapping[str, nn.Parameter]):
        self.targets = targets
        self._params = params  # what `set_resident` writes: every weight (tied ones once)
        self._bias: dict[str, torch.Tensor | None] = {}
        self._active: dict[str, torch.Tensor] = {}  # [members, out] while members are in flight
        self._resident: dict[str, torch.Tensor] = {}  # [out]: the master's scales
        self._rows: torch.Tensor | None = None  # member of each row, when rows are not member-major
        for name, module in targets.items():
            bias = module.bias
            self._bias[name] = None if bias is None else bias.detach().clone()
            module.bias = None  # added after the scaling: y = (x·Qᵀ)·s + b
            module.register_forward_hook(self._hook(name))

    def _hook(self, name: str):
        def scale(module: nn.Module, inputs: tuple[torch.Tensor, ...], out: torch.Tensor):
            bias = self._bias[name]
            if self._active:
                s = self._active[name]
                if self._rows is not None:
                    s = s[self._rows]
                y = (out.reshape(s.shape[0], -1, out.shape[-1]) * s.unsqueeze(1)).reshape(out.shape)
            else:
                y = out * self._resident[name]
            return y if bias is None else y + bias

        return scale

    @property
    def _like(self) -> torch.Tensor:
        return next(iter(self.targets.values())).weight

    @property
    def dtype(self) -> torch.dtype:
        return self._like.dtype

    @contextmanager
    def active(self, scales: dict[str, torch.Tensor]) -> Iterator[None]:
        """Within the block, rows belong to these members (member-major, equal shares)."""
        self._active = scales
        try:
            yield
        finally:
            self._active = {}

    @contextmanager
    def rows(self, member_of_row: Sequence[int]) -> Iterator[None]:
        """Within `active(...)`, row i belongs to member `member_of_row[i]` (a gather)."""
        self._rows = torch.tensor(list(member_of_row), device=self._like.device)
        try:
            yield
        finally:
            self._rows = None

    def terms(self, kind: PerturbationKind, master: Mapping[str, torch.Tensor], keys: Sequence[int | None],
              scales: Sequence[float], *, paths: Sequence[Sequence[float]] = (), state: Any = None,
              ) -> dict[str, torch.Tensor]:
        """Every member's scales [members, out] in the model's dtype (`row_scales`); `master`
        may still be plain (generation 1 evaluates the base's quantization)."""
        if paths:
            raise ValueError("path terms (LM-MA-ES, GA survivors) need an adapter run")
        view = quant.quantized_view(master, kind.quantizes)
        made = kind.row_scales(list(self.targets), view, keys, scales, device=self._like.device)
        return {name: s.to(self.dtype) for name, s in made.items()}

    @torch.no_grad()
    def set_resident(self, kind: PerturbationKind, master: Mapping[str, torch.Tensor]) -> None:
        """Write `master` (plain or quantized) into the model: codes into the quantized
        linears' weights, every other tensor as it is, and the master's scales resident."""
        view = quant.quantized_view(master, kind.quantizes)
        for name, t in quant.model_weights(view).items():
            self._params[name].data.copy_(t)
        self._resident = {module: view[quant.scale_name(f"{module}.weight")].to(self._like.device, self.dtype)
                          for module in self.targets}
