"""PROVISIONAL (the lowrank branch replaces this file): perturbation kinds and low-rank factors.

Only what the evaluation side needs while the exact low-rank update is built elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ledger.errors import SeedLedgerError

from .hashing import mix, stable_hash
from .noise import generate, tensor_key

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_A = stable_hash("seedledger/lowrank/v1/A")
_B = stable_hash("seedledger/lowrank/v1/B")


@dataclass(frozen=True)
class Perturbation:
    kind: Literal["full", "lowrank"] = "full"
    rank: int = 0
    targets: tuple[str, ...] = ()

    @classmethod
    def lowrank(cls, rank: int, targets: Sequence[str] = DEFAULT_TARGETS) -> Perturbation:
        if rank not in (1, 4, 16, 64):
            raise SeedLedgerError(f"low-rank rank must be a power of 4 from 1 to 64, not {rank}")
        return cls("lowrank", rank, tuple(targets))

    @classmethod
    def from_run(cls, noise_spec: str, param_selection: str) -> Perturbation:
        if noise_spec == "v1":
            return cls()
        if noise_spec.startswith("lowrank-v1:r="):
            targets = param_selection.removeprefix("suffix:").split(",")
            return cls.lowrank(int(noise_spec.split("=", 1)[1]), targets)
        raise SeedLedgerError(f"unknown noise spec {noise_spec!r}")

    @property
    def noise_spec(self) -> str:
        return "v1" if self.kind == "full" else f"lowrank-v1:r={self.rank}"

    @property
    def param_selection(self) -> str:
        return "all" if self.kind == "full" else "suffix:" + ",".join(self.targets)

    @property
    def inv_sqrt_rank(self) -> float:
        return 1.0 / math.sqrt(self.rank)

    def trained(self, name: str, shape: Sequence[int]) -> bool:
        if self.kind == "full":
            return True
        return len(shape) == 2 and any(name.endswith(f"{t}.weight") for t in self.targets)


def factors(member_key: int, name: str, shape: Sequence[int], rank: int, device="cpu"):
    out, inp = shape
    tk = tensor_key(member_key, name)
    a = generate(mix(tk, _A), out * rank, device=device).view(out, rank)
    b = generate(mix(tk, _B), inp * rank, device=device).view(inp, rank)
    return a, b


def stacked_factors(member_keys: Sequence[int], name: str, shape: Sequence[int], rank: int, device="cpu"):
    pairs = [factors(k, name, shape, rank, device) for k in member_keys]
    return torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs])
