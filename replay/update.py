"""Applying one generation record to fp32 master weights, bit-exactly on any device.

g = Σ_i c_i·ε_i in member order (each product exact, fp32 sums), then the rule named by
``optimizer["name"]``; every float op is a separate IEEE op with fp32 scalars computed
once in float64, so CPU (numba), CUDA (Triton) and the torch reference give the same
bits. Optimizer state is derived by replaying from the base (or an anchor), never stored
per generation.

The sum starts at −0.0 and skips members whose coefficient is exactly 0 (the second
member of a mirrored pair stores 0): x + (−0.0) == x for every x, −0.0 included, so a
generation whose coefficients are all 0 gives g = −0.0 and SGD leaves every weight
bit-identical (−0.0, subnormals and all). Skipping changes no other result: every
c ≠ 0 gives c·ε ≠ 0, and adding ±0 to a non-zero partial sum is exact. Momentum and
Adam are not identities on such a generation: v·β (resp. m·β1, v·β2) still decays the
state and θ moves by the carried v·lr (resp. m/(√v·s + eps)·lr/bc1); with all-zero state
(a first step) the move is +0.0, which turns a −0.0 weight into +0.0.

Each kind (``replay.kinds``) builds g on its trained tensors only: full and adapter kinds
from ε (the fused kernels of ``replay.kinds.full``), low-rank steps (``replay.lowrank``) as
Σ_i (c_i/√R)·A_i·B_iᵀ; the rules are the same. A kind may change the master's form
before its step (``PerturbationKind.prepare``: the int8 kinds quantize a plain master once,
``replay.quant``); the step then updates the tensors it trains (``PerturbationKind.update``:
quant_codes applies the rule to an fp32 residual per code tensor, replay state kept across
rule changes, and moves a code when its residual crosses half a step).

Rules (spec v1; defaults apply when the recorded optimizer dict omits a key):
  sgd:      θ = θ + g                                  (lr folded into c_i)
  momentum: v = v·β + g·(1−d);  θ = θ + v·lr            (v starts at 0; β=0.9, d=0)
  adam:     m = m·β1 + g·(1−β1);  v = v·β2 + (g·g)·(1−β2);
            θ = θ + (m / (√v·(1/√bc2) + eps))·(lr/bc1)  (β1=0.9, β2=0.999, eps=1e-8,
            bc_k = 1 − β_k^t by repeated float64 multiplication, t = steps so far)
  paths:    θ = θ + g + Σⱼ Mⱼ·moveⱼ;  Mⱼ = Mⱼ·decayⱼ + g·gainⱼ  or  Σₗ Mₗ·mixⱼₗ + Σᵢ noiseⱼᵢ·εᵢ
            (``replay.paths``: LM-MA-ES's evolution paths or a GA's survivors as state;
            full-kind tensors only)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from seedledger.ledger.errors import SeedLedgerError

from . import paths
from .hashing import MASK64
from .kinds import PerturbationKind, step_kind
from .kinds.full import apply_fast as _apply_fast  # noqa: F401  (tests and benchmarks time it)
from .kinds.full import kernel
from .noise import check_coefficient, tensor_key

RULES = {"sgd": 0, "momentum": 1, "adam": 2}
BUFFERS = {"sgd": (), "momentum": ("momentum",), "adam": ("exp_avg", "exp_avg_sq"), paths.NAME: ()}


@dataclass
class OptimizerState:
    """Derived optimizer state: rule name, steps applied, and per-tensor fp32 buffers."""

    name: str = "sgd"
    step: int = 0
    buffers: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def reset(self, name: str, keep: Sequence[str] = ()) -> None:
        """Start rule ``name`` from zero state, keeping the ``keep`` buffers (a kind's
        ``carried`` ones, e.g. quant_codes' residual, which belong to no rule)."""
        kept = {b: self.buffers[b] for b in keep if b in self.buffers}
        self.name, self.step, self.buffers = name, 0, {b: {} for b in BUFFERS[name]} | kept

    def buffer(self, kind: str, name: str, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Buffer ``kind`` of tensor ``name``: zeros shaped like ``like`` (of ``dtype``) at first."""
        bufs = self.buffers.setdefault(kind, {})
        if name not in bufs:
            bufs[name] = torch.zeros_like(like, dtype=dtype)
        return bufs[name]


def _f32(x: float) -> float:
    """Round a float64 to the nearest fp32 (the one cast of each scalar)."""
    return float(np.float32(x))


def _step_inputs(step: Any) -> tuple[list[int], list[float], dict]:
    """(keys, coefficients, optimizer) from a ReplayStep or a GenerationRecord."""
    if hasattr(step, "keys") and hasattr(step, "coefficients"):
        keys, coefs = list(step.keys), list(step.coefficients)
    else:
        keys = [m.key for m in step.members]
        coefs = [m.coefficient for m in step.members]
    optimizer = dict(step.optimizer or {})
    if "lr" not in optimizer and getattr(step, "lr", None) is not None:
        optimizer["lr"] = step.lr
    if len(keys) != len(coefs):
        raise SeedLedgerError(f"generation {step.index}: {len(keys)} keys but {len(coefs)} coefficients")
    try:
        coefs = [check_coefficient(c) for c in coefs]
    except ValueError as exc:
        raise SeedLedgerError(f"generation {step.index}: {exc}") from None
    return [int(k) & MASK64 for k in keys], coefs, optimizer


def _scalars(name: str, opt: Mapping[str, Any], t: int) -> list[float]:
    if name == "sgd":
        return []
    if "lr" not in opt:
        raise SeedLedgerError(f"optimizer {name!r} needs lr in the recorded settings")
    lr = float(opt["lr"])
    if name == "momentum":
        beta, damp = float(opt.get("beta", 0.9)), float(opt.get("dampening", 0.0))
        return [_f32(beta), _f32(1.0 - damp), _f32(lr)]
    b1, b2 = float(opt.get("beta1", 0.9)), float(opt.get("beta2", 0.999))
    eps = float(opt.get("eps", 1e-8))
    p1 = p2 = 1.0
    for _ in range(t):
        p1, p2 = p1 * b1, p2 * b2
    bc1, bc2 = 1.0 - p1, 1.0 - p2
    return [_f32(b1), _f32(1.0 - b1), _f32(b2), _f32(1.0 - b2), _f32(1.0 / math.sqrt(bc2)), _f32(eps), _f32(lr / bc1)]


def apply_step(master: dict[str, torch.Tensor], state: OptimizerState, step: Any,
               perturbation: PerturbationKind | None = None) -> None:
    """Apply one generation (a ReplayStep or GenerationRecord) to ``master`` in place.

    The kind comes from the step's own ``noise_spec``/``param_selection`` (a fork may change
    it), unless ``perturbation`` is given (a record that does not carry them). The kind
    updates its trained tensors only (``PerturbationKind.apply``), which alone get
    optimizer state.
    """
    try:
        pert = perturbation or step_kind(step)
    except SeedLedgerError as exc:
        raise SeedLedgerError(f"generation {step.index}: {exc}") from None
    every_key, coefs, opt = _step_inputs(step)
    keys, coefs = _nonzero(every_key, coefs)
    name = str(opt.get("name", "sgd"))
    if name not in BUFFERS:
        raise SeedLedgerError(f"generation {step.index}: unknown optimizer {name!r}")
    if name == paths.NAME:
        if not pert.keeps_paths:
            raise SeedLedgerError(f"generation {step.index}: optimizer paths needs full or adapter perturbations")
        path_rule = paths.settings(opt, step.index, len(every_key))
    pert.prepare(master)  # before any state changes: the kind's form (quant_scales quantizes once), fp32 checked
    if state.name != name:
        state.reset(name, keep=pert.carried)  # a fork may switch rules: state restarts from zero
    state.step += 1
    if name == paths.NAME:
        items = [(tname, theta) for tname, theta in master.items() if pert.trained(tname, theta.shape)]
        paths.apply(
            items, state, path_rule,
            lambda tname, theta, c: _delta(theta, tname, *((keys, coefs) if c is None else _nonzero(every_key, c))),
        )
        return
    pert.update(master, state, BUFFERS[name], keys, coefs, RULES[name], _scalars(name, opt, state.step))


def _delta(theta: torch.Tensor, name: str, keys: Sequence[int], coefs: Sequence[float]) -> torch.Tensor:
    """g = −0.0 + Σ c_i·ε_i for tensor `name` (the SGD kernel onto −0.0, as SGD sums): θ + g
    is then SGD's θ bit for bit, −0.0 weights included when no coefficient is non-zero."""
    g = torch.full_like(theta, -0.0)
    kernel(g.device)([(g, [tensor_key(k, name) for k in keys], [])], coefs, RULES["sgd"], [])
    return g


def _nonzero(keys: Sequence[int], coefs: Sequence[float]) -> tuple[list[int], list[float]]:
    """Drop members whose coefficient is exactly 0 (they contribute nothing to g)."""
    kept = [(k, c) for k, c in zip(keys, coefs, strict=True) if c != 0.0]
    return [k for k, _ in kept], [c for _, c in kept]


def apply_tensor(
    theta: torch.Tensor, tkeys: Sequence[int], coefs: Sequence[float], rule: int,
    scal: Sequence[float], bufs: Sequence[torch.Tensor], *, fast: bool | None = None,
) -> None:
    """One tensor's fused update (numba on CPU, Triton on CUDA, else the torch reference).

    ``fast=False`` forces the reference (the oracle); None picks by device.
    """
    tkeys, coefs = _nonzero(tkeys, coefs)
    kernel(theta.device, reference=fast is False)([(theta, list(tkeys), list(bufs))], coefs, rule, scal)
