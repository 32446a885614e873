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

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from seedledger.engine.runtime.backends.hf_lowrank import MemberRows
from seedledger.replay import quant
from seedledger.replay.kinds import PerturbationKind


class ScaleRows(MemberRows):
    """Forward hooks that scale the quantized linears' outputs row by row (per member):
    `_active` holds [members, out] scales per linear, `_resident` the master's [out]."""

    holds_master = True  # the model runs on the master's codes: `set_resident` writes them

    def __init__(self, model: nn.Module, select: Callable[[str, nn.Linear], bool], what: str):
        super().__init__(model, select, what)
        self._params = dict(model.named_parameters())  # what `set_resident` writes (tied ones once)
        self._bias: dict[str, torch.Tensor | None] = {}
        for name, module in self.targets.items():
            bias = module.bias
            self._bias[name] = None if bias is None else bias.detach().clone()
            module.bias = None  # added after the scaling: y = (x·Qᵀ)·s + b

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
