"""Evolution strategies as an ask/tell policy (Qiu et al. 2025, OpenAI-ES style).

`ask` names the generation's members (noise key and sign); `tell` turns their rewards
into the coefficients that replay applies: θ ← θ + Σᵢ cᵢ·εᵢ. With plain SGD,
cᵢ = α·zᵢ/N (the paper's update); with momentum or Adam, cᵢ = zᵢ/N is the gradient
estimate and the rule applies α. Mirrored pairs (ε, −ε) share one key and are applied as
one term on that key: the pair's first member carries the coefficient, the second 0.
Every coefficient is rounded by `replay.noise.round_coefficient` before it leaves here,
so what the ledger stores is exactly what is applied. The loop reaches this class through
`trainers.policy.make_policy`, never by name; its `ask` is the base's (`trainers.policy_base`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from seedledger.replay.noise import round_coefficient
from seedledger.trainers.adaptation import Hyperparameters
from seedledger.trainers.member import Member
from seedledger.trainers.optim import OptimizerSpec
from seedledger.trainers.policy_base import Components, Decision, Policy, State, scheduled
from seedledger.trainers.shaping import FRONT, objective_vectors, pareto_shape

Shaping = Literal["zscore", "centered_rank", "difference", "pareto"]


def zscore(rewards: list[float]) -> list[float]:
    """(r − mean) / std; all zeros when the rewards carry no signal."""
    n = len(rewards)
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / n
    std = math.sqrt(var)
    if std < 1e-12:
        return [0.0] * n
    return [(r - mean) / std for r in rewards]


def differences(rewards: list[float], sigma: float) -> list[float]:
    """(r − mean)/σ: raw fitness differences, no normalisation. With mirrored pairs a pair's
    coefficient is α·(r₊ − r₋)/(Nσ): MeZO's projected gradient (L₊ − L₋)/2σ averaged over
    the N/2 pairs (Malladi et al. 2023). Dense fitness only: the step grows with the
    rewards' scale, and ties give 0."""
    mean = sum(rewards) / len(rewards)
    return [(r - mean) / sigma for r in rewards]


def centered_ranks(rewards: list[float]) -> list[float]:
    """Ranks mapped to [−0.5, 0.5]; ties share their mean rank (order-independent)."""
    n = len(rewards)
    if n == 1:
        return [0.0]
    order = sorted(range(n), key=lambda i: rewards[i])
    ranks = [0.0] * n
    i = 0
    while i < n:
        j = i
        while j + 1 < n and rewards[order[j + 1]] == rewards[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return [r / (n - 1) - 0.5 for r in ranks]


class ES(Policy):
    """The ES policy: the shared `ask` (mirrored pairs or independent members), `tell` returns
    the rounded coefficients; `hyperparameters(generation)` gives the lr and σ in force
    (schedules, and the optional σ/lr adaptation of `trainers.adaptation`, whose state
    `restore` rebuilds from the lineage's records and `observe` advances past each one)."""

    name = "es"
    label = "ES"
    hyper_names = "lr/σ"

    def __init__(
        self, population: int, mirrored: bool = True, shaping: Shaping = "zscore",
        hyperparameters: Hyperparameters | None = None,
    ):
        if population < 1 or (mirrored and population % 2):
            raise ValueError(
                f"population must be a positive{' even' if mirrored else ''} number, got {population}"
            )
        self.population = population
        self.mirrored = mirrored
        self.shaping = shaping
        self.hyper = hyperparameters

    @classmethod
    def from_config(cls, cfg: Any) -> ES:
        # the engine's TrainConfig has lr/σ; a bare namespace may omit the schedule
        hyper = scheduled(cfg) if hasattr(cfg, "lr") else None
        return cls(cfg.population, mirrored=cfg.mirrored, shaping=cfg.shaping, hyperparameters=hyper)

    def shape(
        self, rewards: list[float], sigma: float, components: Components | None = None,
        objectives: Mapping[str, float] | None = None,
    ) -> list[float]:
        """Shaped rewards. `pareto` ranks the `components` as objectives (`trainers.shaping`;
        `objectives` maps each component to its weight, default 1 for every component) and
        writes each member's front into its components dict as `pareto_front`; `difference`
        divides by `sigma`, the σ in force."""
        if self.shaping == "zscore":
            return zscore(rewards)
        if self.shaping == "centered_rank":
            return centered_ranks(rewards)
        if self.shaping == "difference":
            return differences(rewards, sigma)
        if components is None or len(components) != len(rewards):
            raise ValueError("pareto shaping needs each member's reward components")
        if objectives is None:
            objectives = {n: 1.0 for c in components for n in c if n != FRONT}
        shaped, front = pareto_shape(objective_vectors(components, objectives))
        for comp, f in zip(components, front, strict=True):
            comp[FRONT] = float(f)
        return shaped

    def tell(
        self, state: State, members: list[Member], rewards: list[float], *, lr: float, sigma: float,
        optimizer: OptimizerSpec, components: Components | None = None,
        objectives: Mapping[str, float] | None = None, sample_rewards: list[list[float] | None] | None = None,
    ) -> Decision:
        """Coefficients in member order: shaped rewards times α/N when the optimizer folds the
        learning rate into the coefficients (SGD), times 1/N when its rule applies α itself.
        ES records nothing beyond its coefficients and the configured optimizer."""
        scale = (lr if optimizer.folds_lr else 1.0) / len(members)
        coefficients = self.coefficients(members, rewards, scale, sigma, components, objectives)
        return Decision(coefficients, optimizer.record(lr))

    def coefficients(
        self, members: list[Member], rewards: list[float], scale: float, sigma: float,
        components: Components | None = None, objectives: Mapping[str, float] | None = None,
    ) -> list[float]:
        """`scale`·(shaped reward) per member, mirrored pairs folded onto the pair's first
        member, each rounded; `tell` chooses `scale`."""
        if len(rewards) != len(members):
            raise ValueError("one reward per member")
        z = self.shape(rewards, sigma, components, objectives)
        if not self.mirrored:
            return [round_coefficient(scale * m.sign * zi) for m, zi in zip(members, z, strict=True)]
        coefficients = []
        for i in range(0, len(members), 2):
            coefficients += [round_coefficient(scale * (z[i] - z[i + 1])), 0.0]
        return coefficients


__all__ = ["ES", "Member", "centered_ranks", "differences", "zscore"]
