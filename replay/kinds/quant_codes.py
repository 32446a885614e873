"""Integer-code kind (``"v1"`` / ``"int8-codes-v1:targets=q_proj,..."``): ES over the int8
codes of a weight-only model, the per-row scales frozen (QES: Quantized Evolution
Strategies, Xu, Miikkulainen & Qiu, arXiv 2602.03120: accumulated error feedback, so that
updates smaller than one quantization step are not lost, kept reproducible by replay).

Generation 0 is the fp32 base and the first step quantizes the targeted linears
(``Int8Kind.prepare``, as quant_scales does). A member perturbs the dequantized weights,
W_m = cast(diag(s)·Q + scale_m·ε_m), v1 noise under the weight's own name (as the full
kind), on the targeted linears only (every other tensor is frozen): ``member_weights``
dequantizes, ``member_kind`` adds the noise.

The update is the full kind's fused one (g = Σ c_i·ε_i in weight units, then the rule: SGD,
momentum or Adam) applied to an fp32 residual R per code tensor instead of a weight. Then,
with s_r the step (scale) of row r, every element of the row goes through ``move_codes_``:

    t = R / s_r                                  (one IEEE fp32 division; 0 where not finite)
    k = clamp(round_half_even(t), −127 − q, 127 − q)
    q = q + k;   R = R − k·s_r                   (k·s_r and the difference each rounded once)

so a code moves by k steps once its residual is more than half a step (|R| = s_r/2 exactly
rounds to the even k = 0: no move; 1.5 steps move 2), its value never leaves [−127, 127],
and what a clamp does not apply stays in R. Every op is one correctly rounded IEEE op on fp32
(no fused multiply-add: torch runs k·s_r and the subtraction as two kernels), so CPU and
CUDA give the same bits. This is QES's error feedback with the round-to-nearest of
``replay.quant`` as the quantizer.

R is optimizer state, not model: the fingerprint covers codes, scales and the frozen fp32
tensors, not R, as it covers no Adam moment. Like the moments, R is rebuilt by replay from the
records (never stored per generation) and cached in anchors (``OptimizerState.buffers``
under ``residual``); unlike them it survives a fork's change of rule (``carried``). Its size
is 4 bytes per trained weight: as large as an fp32 copy of the targeted linears.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import quant
from .forms import MemberForm
from .full import SPEC, Full
from .quant_scales import Int8Kind

PREFIX = "int8-codes-v1:targets="
RESIDUAL = "residual"  # the OptimizerState buffer kind holding R


def move_codes_(codes: torch.Tensor, residual: torch.Tensor, scale: torch.Tensor) -> None:
    """Move int8 ``codes`` [out, in] by the whole steps their fp32 ``residual`` holds, in
    place (the rule of the module docstring); ``scale`` [out] is each row's step."""
    s = scale.to(torch.float32).view(-1, 1)
    k = torch.div(residual, s).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)  # a zero scale moves nothing
    q = codes.to(torch.float32)
    k.round_().clamp_(min=-quant.CODE_MAX - q, max=quant.CODE_MAX - q)
    codes.copy_(q.add_(k))  # exact: integers below 2**24
    residual.sub_(k.mul_(s))


@dataclass(frozen=True)
class QuantCodes(Int8Kind):
    """The int8 codes of the linears whose names end in one of ``targets``, trained through
    an fp32 residual; scales and every other tensor frozen."""

    name = "quant_codes"
    label = "quant_codes"
    known_specs = (SPEC,)
    prefix = PREFIX
    trains = "codes"
    carried = (RESIDUAL,)
    forms = frozenset({MemberForm.DEQUANTIZED})

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        return self.quantizes(name, tuple(shape))

    def update(self, master: dict[str, torch.Tensor], state: Any, buffers: Sequence[str], keys: Sequence[int],
               coefs: Sequence[float], rule: int, scal: Sequence[float]) -> None:
        """The rule on each code tensor's residual (ε under the weight's name), then the codes move."""
        codes = {n: q for n, q in master.items() if q.dtype == quant.CODE_DTYPE and self.trained(n, q.shape)}
        residuals = {n: state.buffer(RESIDUAL, n, q, torch.float32) for n, q in codes.items()}
        self.apply([(n, r, [state.buffer(b, n, r) for b in buffers]) for n, r in residuals.items()],
                   keys, coefs, rule, scal)
        for n, q in codes.items():
            move_codes_(q, residuals[n], master[quant.scale_name(n)])

    def member_weights(self, master: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """diag(s)·Q for the targeted linears (quantizing a plain master first, as the step
        will: generation 1's members), every other tensor as it is (shared)."""
        return quant.dequantized(quant.quantized_view(master, self.quantizes))

    @property
    def member_kind(self) -> MemberNoise:
        return MemberNoise(self.targets)


@dataclass(frozen=True)
class MemberNoise(Full):
    """A quant_codes member's noise: v1 noise on the targeted fp32 (dequantized) weights
    only; never stored (no strings of its own), only built by ``QuantCodes.member_kind``."""

    targets: tuple[str, ...] = ()

    name = "quant_codes member"
    label = "quant_codes"
    known_specs = ()

    @classmethod
    def claims(cls, noise_spec: str, param_selection: str) -> bool:
        return False

    @property
    def param_selection(self) -> str:
        return QuantCodes(self.targets).param_selection

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        return QuantCodes(self.targets).trained(name, shape)
