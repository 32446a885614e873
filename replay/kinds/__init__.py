"""Perturbation kinds: which tensors a run trains and what shape their noise takes.

A run stores two strings, ``noise_spec`` and ``param_selection``; every replay step
carries its own run's pair, so a fork may change kind (not the adapter). Each kind is one
module behind the protocol of ``base.PerturbationKind``:

- ``full``: ``"v1"`` / ``"all"``, every tensor, v1 noise (``full.Full``);
- ``adapter``: ``"v1"`` / ``"lora-v1:..."`` (or ``"essa-v1:..."``), a LoRA adapter on a
  frozen base, v1 noise on its tensors (``adapter.Adapter``);
- ``lowrank``: ``"lowrank-v1:r=R"`` / ``"suffix:..."``, E = A·Bᵀ/√R on the targeted
  linears (``lowrank.LowRank``);
- ``quant_scales``: ``"v1"`` / ``"int8-scales-v1:targets=..."``, the per-row scales of an
  int8 weight-only model, codes frozen, v1 noise on the scales (``quant_scales.QuantScales``);
- ``quant_codes``: ``"v1"`` / ``"int8-codes-v1:targets=..."``, the int8 codes themselves,
  scales frozen, members perturbing the dequantized weights with v1 noise, the update kept in
  an fp32 residual (``quant_codes.QuantCodes``).

Stored strings must be canonical (``from_run`` refuses any pair that does not print back
identically), so one perturbation has exactly one spelling in a ledger or a seed file.
Adding a kind: a module here, one entry in ``KINDS``, and the config section naming it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from seedledger.ledger.errors import SeedLedgerError

from .adapter import Adapter
from .base import PerturbationKind, member_scale, short
from .full import Full
from .lowrank import DEFAULT_TARGETS, LowRank
from .quant_codes import QuantCodes
from .quant_scales import Int8Kind, QuantScales

# The order in which kinds claim a pair of strings (the first that claims it parses it).
KINDS: tuple[type[PerturbationKind], ...] = (Adapter, QuantScales, QuantCodes, Full, LowRank)
KNOWN_SPECS = tuple(dict.fromkeys(spec for kind in KINDS for spec in kind.known_specs))

__all__ = ["DEFAULT_TARGETS", "KINDS", "KNOWN_SPECS", "Adapter", "Full", "Int8Kind", "LowRank", "PerturbationKind",
           "QuantCodes", "QuantScales", "from_run", "member_scale", "step_kind"]


def from_run(noise_spec: str, param_selection: str) -> PerturbationKind:
    """Parse a run's stored strings; SeedLedgerError (one line) if unknown or not canonical."""
    return _parse(str(noise_spec), str(param_selection))


@lru_cache(maxsize=64)
def _parse(noise_spec: str, param_selection: str) -> PerturbationKind:
    for kind in KINDS:
        if kind.claims(noise_spec, param_selection):
            return kind.parse(noise_spec, param_selection)
    raise SeedLedgerError(f"unknown noise spec {short(noise_spec)} (known: {', '.join(KNOWN_SPECS)})")


def step_kind(step: Any) -> PerturbationKind:
    """The kind of one replay step (its run's strings; ``full`` when it has none, e.g. a
    GenerationRecord, whose own are None unless it was imported with a kind)."""
    spec, selection = getattr(step, "noise_spec", None), getattr(step, "param_selection", None)
    return from_run(spec or "v1", selection or "all")
