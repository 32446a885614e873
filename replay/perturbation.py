"""Perturbation kinds: which tensors a run trains and what shape their noise takes.

A run stores two strings, ``noise_spec`` and ``param_selection``; every replay step
carries its own run's pair, so a fork may change kind. Two kinds exist:

- full: ``"v1"`` / ``"all"``. Every tensor is trained; member noise is ε from the v1
  counter noise (``replay.noise``).
- lowrank: ``"lowrank-v1:r=R"`` / ``"suffix:q_proj,k_proj,..."``. Only 2-D tensors named
  ``<target>.weight`` (or ``....<target>.weight``) for a listed target are trained, with
  noise E = A·Bᵀ/√R (``replay.lowrank``); everything else (embeddings, norms, lm_head) is
  frozen: no noise, no update, no optimizer state. R ∈ {1, 4, 16, 64}, so 1/√R is a power
  of two and scaling by it is exact.

Stored strings must be canonical (``from_run`` refuses any pair that does not print back
identically), so one perturbation has exactly one spelling in a ledger or a seed file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from ledger.errors import SeedLedgerError

RANKS = (1, 4, 16, 64)
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
KNOWN_SPECS = ("v1",) + tuple(f"lowrank-v1:r={r}" for r in RANKS)
_LOWRANK = "lowrank-v1:r="
_SUFFIX = "suffix:"
_TARGET = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


@dataclass(frozen=True)
class Perturbation:
    """The perturbation kind of a run: ``full``, or ``lowrank`` of ``rank`` on ``targets``."""

    kind: Literal["full", "lowrank"] = "full"
    rank: int = 0
    targets: tuple[str, ...] = ()

    @classmethod
    def from_run(cls, noise_spec: str, param_selection: str) -> Perturbation:
        """Parse a run's stored strings; SeedLedgerError (one line) if unknown or not canonical."""
        return _parse(str(noise_spec), str(param_selection))

    @classmethod
    def lowrank(cls, rank: int, targets: Sequence[str] = DEFAULT_TARGETS) -> Perturbation:
        """A lowrank perturbation; rank must be 1, 4, 16 or 64 (1/√rank a power of two)."""
        if isinstance(rank, bool) or rank not in RANKS:
            raise SeedLedgerError(f"low-rank rank must be one of {', '.join(map(str, RANKS))}, not {rank!r}")
        targets = tuple(targets)
        if not targets or len(set(targets)) != len(targets):
            raise SeedLedgerError("low-rank targets must be a non-empty list without repeats")
        for t in targets:
            if not isinstance(t, str) or not _TARGET.fullmatch(t):
                raise SeedLedgerError(f"bad low-rank target {_short(t)} (letters, digits, _ and inner dots)")
        return cls("lowrank", rank, targets)

    @property
    def noise_spec(self) -> str:
        return "v1" if self.kind == "full" else f"{_LOWRANK}{self.rank}"

    @property
    def param_selection(self) -> str:
        return "all" if self.kind == "full" else _SUFFIX + ",".join(self.targets)

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        """Does this kind perturb and update tensor ``name``? (full: all; lowrank: targets)."""
        if self.kind == "full":
            return True
        return len(shape) == 2 and any(name == f"{t}.weight" or name.endswith(f".{t}.weight") for t in self.targets)

    @property
    def inv_sqrt_rank(self) -> float:
        """1/√rank, an exact power of two (ValueError for ``full``, which has no rank)."""
        if self.kind != "lowrank":
            raise ValueError("a full perturbation has no rank")
        return 2.0 ** -(self.rank.bit_length() // 2)  # rank = 4**k has bit_length 2k + 1


@lru_cache(maxsize=64)
def _parse(noise_spec: str, param_selection: str) -> Perturbation:
    if noise_spec == "v1":
        if param_selection != "all":
            raise SeedLedgerError(f"noise spec 'v1' trains every tensor: parameter selection must be 'all', "
                                  f"not {_short(param_selection)}")
        return Perturbation()
    if noise_spec not in KNOWN_SPECS:
        raise SeedLedgerError(f"unknown noise spec {_short(noise_spec)} (known: {', '.join(KNOWN_SPECS)})")
    if not param_selection.startswith(_SUFFIX):
        raise SeedLedgerError(f"noise spec {noise_spec!r} needs a parameter selection 'suffix:NAME,...', "
                              f"not {_short(param_selection)}")
    # canonical by construction: the spec is one of KNOWN_SPECS, and split/join round-trips
    return Perturbation.lowrank(int(noise_spec[len(_LOWRANK):]), param_selection[len(_SUFFIX):].split(","))


def check_spec(noise_spec: str, param_selection: str) -> Perturbation:
    """What seed-file import and rebuild call to refuse runs this replay cannot apply."""
    return Perturbation.from_run(noise_spec, param_selection)


def step_perturbation(step: Any) -> Perturbation:
    """The perturbation of one replay step (its run's strings; ``full`` when it has none)."""
    return Perturbation.from_run(getattr(step, "noise_spec", "v1"), getattr(step, "param_selection", "all"))


def _short(x: object) -> str:
    """repr of untrusted text, cut to one short line."""
    text = repr(x)
    return text if len(text) <= 80 else text[:77] + "..."
