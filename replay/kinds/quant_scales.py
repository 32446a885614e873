"""Quantization-scale kind (``"v1"`` / ``"int8-scales-v1:targets=q_proj,..."``): ES over the
per-row scales of an int8 weight-only model, the integer codes frozen (PEQA, Kim et al. 2023;
propagate's "train natively in a quant format").

Generation 0 is the fp32 base, as for a full run (its fingerprint is the base's). The first
step of this kind quantizes the master in place (``prepare``; ``replay.quant``: symmetric
per-row absmax, on the CPU, the same bits everywhere): each targeted linear's ``M.weight``
becomes its int8 codes and ``M.weight_scale`` its fp32 scales [out]. From then on the
fingerprint covers codes, scales and the untouched fp32 tensors. Only the scales are
trained, with v1 noise under their own names (the full kind's fused update on smaller
tensors), so a fork of a full run may switch to this kind (quantizing the parent's weights
at its first step); the way back is refused, the codes being no fp32 weights.

A member's scales are cast(s + scale_m·ε_m); the evaluated linear is
y = (x·Qᵀ)·diag(s + scale_m·ε_m): members share the integer matmul and differ by a
per-row factor on its output (``row_scales``; the HF backend's ``hf_quant.ScaleRows``).

``Int8Kind`` is what this kind shares with ``quant_codes`` (the int8 codes trained through
a residual): the targets, the stored strings, quantizing on the first step.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from seedledger.ledger.errors import SeedLedgerError

from .. import noise, quant
from .base import Shape, short
from .forms import MemberForm
from .full import SPEC, Full
from .lowrank import DEFAULT_TARGETS

PREFIX = "int8-scales-v1:targets="
_TARGET = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


@dataclass(frozen=True)
class Int8Kind(Full):
    """What the int8 kinds share: the targeted linears (``targets``), their stored strings
    (``prefix`` + the targets, noise spec 'v1') and the master's form (``prepare``
    quantizes the targeted fp32 weights once). A subclass says what it trains."""

    targets: tuple[str, ...] = DEFAULT_TARGETS

    prefix: ClassVar[str]  # "int8-scales-v1:targets="
    trains: ClassVar[str]  # how messages name what it trains: "scales", "codes"
    keeps_paths = False  # members share codes and scales: no path terms

    @classmethod
    def of(cls, targets: Sequence[str] = DEFAULT_TARGETS) -> Int8Kind:
        """A checked kind: a non-empty list of distinct linear-module name suffixes."""
        targets = tuple(targets)
        if not targets or len(set(targets)) != len(targets):
            raise SeedLedgerError(f"{cls.name} targets must be a non-empty list without repeats")
        for t in targets:
            if not isinstance(t, str) or not _TARGET.fullmatch(t):
                raise SeedLedgerError(f"bad {cls.name} target {short(t)} (letters, digits, _ and inner dots)")
        return cls(targets)

    @classmethod
    def claims(cls, noise_spec: str, param_selection: str) -> bool:
        return param_selection.startswith(cls.prefix.partition(":")[0] + ":")

    @classmethod
    def parse(cls, noise_spec: str, param_selection: str) -> Int8Kind:
        if noise_spec != SPEC:
            raise SeedLedgerError(
                f"quantization {cls.trains} are perturbed with noise spec 'v1', not {short(noise_spec)}"
            )
        if not param_selection.startswith(cls.prefix):
            raise SeedLedgerError(f"bad {cls.name} parameter selection {short(param_selection)} "
                                  f"(expected {cls.prefix}NAME,...)")
        kind = cls.of(param_selection[len(cls.prefix):].split(","))
        if kind.param_selection != param_selection:
            raise SeedLedgerError(f"{cls.name} parameter selection {short(param_selection)} is not canonical")
        return kind

    @property
    def param_selection(self) -> str:
        return self.prefix + ",".join(self.targets)

    # --- replay ---------------------------------------------------------------------------

    def quantizes(self, name: str, shape: Shape) -> bool:
        """Is ``name`` (a 2-D weight) one of the linears this kind quantizes?"""
        return len(shape) == 2 and any(name == f"{t}.weight" or name.endswith(f".{t}.weight") for t in self.targets)

    def prepare(self, master: dict[str, torch.Tensor]) -> None:
        """Quantize the targeted fp32 weights in place (a no-op once quantized), then check."""
        self.check_master(master)
        quant.quantize_master_(master, self.quantizes)
        if not any(self.trained(n, t.shape) for n, t in master.items()):
            raise SeedLedgerError(
                f"no linear weight of the master matches the {self.name} targets {list(self.targets)}"
            )

    def check_master(self, master: Mapping[str, torch.Tensor]) -> None:
        """Plain (contiguous fp32) or quantized by this kind: int8 codes only on targeted
        weights, each with its fp32 scales."""
        for tname, theta in master.items():
            if theta.dtype == quant.CODE_DTYPE and quant.scale_name(tname) in master:
                if not self.quantizes(tname, tuple(theta.shape)):
                    raise SeedLedgerError(f"master tensor {tname!r} is quantized, but not a {self.name} target "
                                          f"of this run ({list(self.targets)})")
                continue
            if theta.dtype != torch.float32 or not theta.is_contiguous():
                raise SeedLedgerError(f"master tensor {tname!r} must be contiguous fp32")

    def master_names(self, shapes: Mapping[str, Shape]) -> list[str]:
        return quant.quantized_names(shapes, self.quantizes)

    @property
    def targets_label(self) -> str:
        return f"{self.name} targets {self.targets}"


@dataclass(frozen=True)
class QuantScales(Int8Kind):
    """The per-row scales of the int8 linears whose names end in one of ``targets``."""

    name = "quant_scales"
    label = "quant_scales"
    known_specs = (SPEC,)
    prefix = PREFIX
    trains = "scales"
    usual_sigma = 1e-5  # scales are absmax/127, about 1e-3: σ·ε moves them by ~1%
    forms = frozenset({MemberForm.ROW_SCALES})

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        return (len(shape) == 1 and name.endswith(quant.SCALE_SUFFIX)
                and self.quantizes(quant.weight_name(name), (int(shape[0]), 0)))

    # --- evaluation -----------------------------------------------------------------------

    def row_linear(self, module: str, shape: Shape) -> bool:
        return self.quantizes(f"{module}.weight", shape)

    def row_scales(self, linears: Sequence[str], master: Mapping[str, torch.Tensor], keys: Sequence[int | None],
                   scales: Sequence[float], *, device: torch.device) -> dict[str, torch.Tensor]:
        """Each member's scales on every quantized linear, [members, out] in fp32:
        cast(s + scale_m·ε(key_m)) by ``noise.perturb_`` (key None: s itself). ``master``
        must be quantized (``quant.quantized_view``)."""
        out = {}
        for module in linears:
            name = quant.scale_name(f"{module}.weight")
            s = master[name].to(device)
            rows = torch.empty((len(keys), s.numel()), dtype=torch.float32, device=device)
            for m, (key, scale) in enumerate(zip(keys, scales, strict=True)):
                if key is None or scale == 0.0:
                    rows[m].copy_(s)
                else:
                    noise.perturb_(rows[m], s, noise.tensor_key(key, name), scale)
            out[module] = rows
        return out
