"""Low-rank kind (``"lowrank-v1:r=R"`` / ``"suffix:q_proj,k_proj,..."``): only 2-D tensors
named ``<target>.weight`` (or ``....<target>.weight``) for a listed target are trained, with
noise E = A·Bᵀ/√R (``replay.lowrank``); everything else (embeddings, norms, lm_head) is
frozen: no noise, no update, no optimizer state. Members ride on the loaded master as a
rank-R term each (HF: per-row factors; vLLM: one LoRA slot per member)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from seedledger.ledger.errors import SeedLedgerError

from .. import lowrank
from ..lowrank import RANKS, factors, stacked_factors
from .base import Item, LoraPair, PerturbationKind, RowTerm, Shape, short
from .forms import MemberForm

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PREFIX = "lowrank-v1:r="
SUFFIX = "suffix:"
_TARGET = re.compile(r"[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*")


@dataclass(frozen=True)
class LowRank(PerturbationKind):
    """Rank-``rank`` noise on the linears whose names end in one of ``targets``."""

    rank: int
    targets: tuple[str, ...] = DEFAULT_TARGETS

    name = "lowrank"
    label = "lowrank"
    known_specs = tuple(f"{PREFIX}{r}" for r in RANKS)
    keeps_paths = False  # a path is a full-size offset: not a rank-R term
    # rank-R terms on the loaded master, or own weights built by the one-term step (module backend)
    forms = frozenset({MemberForm.ROW_TERMS, MemberForm.LORA_SLOTS, MemberForm.WEIGHTS})

    @classmethod
    def of(cls, rank: int, targets: Sequence[str] = DEFAULT_TARGETS) -> LowRank:
        """A checked low-rank kind; rank must be 1, 4, 16 or 64 (1/√rank a power of two)."""
        if isinstance(rank, bool) or rank not in RANKS:
            raise SeedLedgerError(f"low-rank rank must be one of {', '.join(map(str, RANKS))}, not {rank!r}")
        targets = tuple(targets)
        if not targets or len(set(targets)) != len(targets):
            raise SeedLedgerError("low-rank targets must be a non-empty list without repeats")
        for t in targets:
            if not isinstance(t, str) or not _TARGET.fullmatch(t):
                raise SeedLedgerError(f"bad low-rank target {short(t)} (letters, digits, _ and inner dots)")
        return cls(rank, targets)

    @classmethod
    def claims(cls, noise_spec: str, param_selection: str) -> bool:
        return noise_spec in cls.known_specs

    @classmethod
    def parse(cls, noise_spec: str, param_selection: str) -> LowRank:
        if not param_selection.startswith(SUFFIX):
            raise SeedLedgerError(f"noise spec {noise_spec!r} needs a parameter selection 'suffix:NAME,...', "
                                  f"not {short(param_selection)}")
        # canonical by construction: the spec is a known one, and split/join round-trips
        return cls.of(int(noise_spec[len(PREFIX):]), param_selection[len(SUFFIX):].split(","))

    @property
    def noise_spec(self) -> str:
        return f"{PREFIX}{self.rank}"

    @property
    def param_selection(self) -> str:
        return SUFFIX + ",".join(self.targets)

    @property
    def kind(self) -> str:
        return "lowrank"

    @property
    def inv_sqrt_rank(self) -> float:
        """1/√rank, an exact power of two."""
        return lowrank.inv_sqrt_rank(self.rank)

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        return len(shape) == 2 and any(name == f"{t}.weight" or name.endswith(f".{t}.weight") for t in self.targets)

    def apply(self, items: Sequence[Item], keys: Sequence[int], coefs: Sequence[float], rule: int,
              scal: Sequence[float]) -> None:
        lowrank.apply(items, keys, coefs, rule, scal, self.rank)

    # --- evaluation -----------------------------------------------------------------------

    def row_linear(self, module: str, shape: Shape) -> bool:
        return self.trained(f"{module}.weight", shape)

    @property
    def targets_label(self) -> str:
        return f"low-rank targets {self.targets}"

    def row_terms(self, linears: Mapping[str, Shape], master: Mapping[str, torch.Tensor],
                  keys: Sequence[int | None], scales: Sequence[float], *, device: torch.device,
                  dtype: torch.dtype, paths: Sequence[Sequence[float]] = (), state: Any = None,
                  ) -> dict[str, RowTerm]:
        """Every member's E = A·Bᵀ/√r term: down = B·(scale/√r) in fp32, up = Aᵀ (mirrored
        pairs share their factors)."""
        if paths:
            raise ValueError("path terms (LM-MA-ES, GA survivors) need an adapter run")
        distinct = list(dict.fromkeys(keys))
        where = torch.tensor([distinct.index(k) for k in keys], device=device)
        scale = torch.tensor([s * self.inv_sqrt_rank for s in scales], dtype=torch.float32,
                             device=device).view(-1, 1, 1)
        terms = {}
        for name, shape in linears.items():
            a, b = stacked_factors(distinct, f"{name}.weight", shape, self.rank, device=device)
            terms[name] = ((b[where] * scale).to(dtype), a.to(dtype)[where].transpose(1, 2), None)
        return terms

    @property
    def lora_rank(self) -> int:
        return self.rank

    @property
    def lora_targets(self) -> tuple[str, ...]:
        return self.targets

    def lora_members(self, master: Mapping[str, torch.Tensor] | None, linears: Mapping[str, Shape],
                     keys: Sequence[int | None], scales: Sequence[float]) -> Iterator[dict[str, LoraPair]]:
        """lora_A = Bᵀ, lora_B = (scale/√r)·A per linear (mirrored pairs: factors once)."""
        made: dict[Any, dict[str, tuple]] = {}
        for key, scale in zip(keys, scales, strict=True):
            if key not in made:
                made[key] = {name: factors(key, f"{name}.weight", shape, self.rank) for name, shape in linears.items()}
            s = scale * self.inv_sqrt_rank
            yield {name: (b.T, a * s) for name, (a, b) in made[key].items()}
